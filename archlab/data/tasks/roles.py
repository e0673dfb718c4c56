"""Ground truth for the understanding tasks: each identifier's role in Python source, from Python's own
``tokenize`` (where the identifiers are) and ``ast`` (what each one does).

Roles (:data:`ROLES`), by the node that holds the identifier:

- ``definition``: the name of a ``def`` / ``async def`` / ``class``;
- ``parameter``: a parameter of a function or lambda (``ast.arg``);
- ``call``: the function being called: ``f`` in ``f(x)``, ``g`` in ``x.g(y)``;
- ``attribute``: an attribute read or written (``y`` in ``x.y``), when not called;
- ``store``: a name bound by assignment, ``for``, ``with ... as``, ``del``, ``import`` (the bound name) or
  ``except ... as``;
- ``load``: any other read of a name (``ast.Name`` in a load context).

Identifiers with none of these roles (keyword arguments' names, ``global`` lists, imported module paths, match
patterns) and names inside f-strings (one STRING token in Python 3.11's ``tokenize``) get no role. Offsets are
characters of the source (``ast``'s column offsets are UTF-8 bytes: converted per line).
"""

from __future__ import annotations

import ast
import bisect
import io
import keyword
import tokenize
from dataclasses import dataclass

ROLES = ("definition", "parameter", "call", "attribute", "store", "load")
ROLE_ID = {r: i for i, r in enumerate(ROLES)}
BINDINGS = frozenset({"definition", "parameter", "store"})  # roles that give a name its meaning
READS = frozenset({"call", "load"})


@dataclass(frozen=True)
class Identifier:
    """One identifier of the source: characters [start, end), its text, role, and whether it is an attribute
    (``x.name``: ``attr`` True, so a call of a method is not a read of a variable)."""

    start: int
    end: int
    name: str
    role: str
    attr: bool = False


class _Source:
    """Line offsets of a source and its identifier tokens, to turn ``ast`` positions into character offsets."""

    def __init__(self, source: str):
        self.lines = source.split("\n")
        self.line_start = [0]
        for line in self.lines:
            self.line_start.append(self.line_start[-1] + len(line) + 1)
        toks = tokenize.generate_tokens(io.StringIO(source).readline)
        self.names = [(t.start, t.string) for t in toks if t.type == tokenize.NAME and not keyword.iskeyword(t.string)]
        self.positions = [p for p, _ in self.names]

    def char_col(self, lineno: int, byte_col: int) -> int:
        line = self.lines[lineno - 1]
        return byte_col if line.isascii() else len(line.encode()[:byte_col].decode("utf-8", errors="ignore"))

    def pos(self, lineno: int, byte_col: int) -> tuple[int, int]:
        """(line, character column) of an ``ast`` position."""
        return lineno, self.char_col(lineno, byte_col)

    def offset(self, p: tuple[int, int]) -> int:
        return self.line_start[p[0] - 1] + p[1]

    def next_name(self, p: tuple[int, int], name: str):
        """The position of the first identifier token ``name`` at or after ``p`` (None if none)."""
        for k in range(bisect.bisect_left(self.positions, p), len(self.names)):
            if self.names[k][1] == name:
                return self.names[k][0]
        return None


def _roles(tree: ast.AST, src: _Source) -> dict[tuple[int, int], tuple[str, str, bool]]:
    """{(line, column): (name, role, attr)} for every identifier ``ast`` gives a role."""
    out: dict[tuple[int, int], tuple[str, str, bool]] = {}
    calls = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            role = "load" if isinstance(node.ctx, ast.Load) else "store"
            out.setdefault(src.pos(node.lineno, node.col_offset), (node.id, role, False))
        elif isinstance(node, ast.Attribute):
            n = len(node.attr.encode())
            out[src.pos(node.end_lineno, node.end_col_offset - n)] = (node.attr, "attribute", True)
        elif isinstance(node, ast.arg):
            out[src.pos(node.lineno, node.col_offset)] = (node.arg, "parameter", False)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            p = src.next_name(src.pos(node.lineno, node.col_offset), node.name)
            if p is not None:
                out[p] = (node.name, "definition", False)
        elif isinstance(node, ast.alias) and node.name != "*":
            bound = node.asname or node.name.split(".")[0]
            p = src.next_name(src.pos(node.lineno, node.col_offset), bound) if node.asname else \
                src.pos(node.lineno, node.col_offset)
            if p is not None:
                out[p] = (bound, "store", False)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            p = src.next_name(src.pos(node.lineno, node.col_offset), node.name)
            if p is not None:
                out[p] = (node.name, "store", False)
        elif isinstance(node, ast.Call):
            calls.append(node.func)
    for f in calls:  # the function being called: a Name, or the attribute of x.f
        if isinstance(f, ast.Name):
            p = src.pos(f.lineno, f.col_offset)
        elif isinstance(f, ast.Attribute):
            p = src.pos(f.end_lineno, f.end_col_offset - len(f.attr.encode()))
        else:
            continue
        if p in out:
            name, _, attr = out[p]
            out[p] = (name, "call", attr)
    return out


def identifiers(source: str) -> list[Identifier]:
    """Every identifier token of ``source`` that has a role, in source order. Raises SyntaxError (or
    tokenize.TokenError) when the source is not Python."""
    tree = ast.parse(source)
    src = _Source(source)
    roles = _roles(tree, src)
    out = []
    for p, text in src.names:
        if p in roles and roles[p][0] == text:
            start = src.offset(p)
            out.append(Identifier(start, start + len(text), text, roles[p][1], roles[p][2]))
    return out
