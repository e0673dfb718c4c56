"""archlab.data.tasks.roles: identifier roles agree with Python's ast on hand-written snippets."""

from __future__ import annotations

import pytest

from archlab.data.tasks.roles import ROLES, identifiers


def roles(source: str) -> list[tuple[str, str]]:
    return [(i.name, i.role) for i in identifiers(source)]


def test_the_brief_example():
    assert roles("def f(x): return g(x.y)") == [("f", "definition"), ("x", "parameter"), ("g", "call"),
                                                 ("x", "load"), ("y", "attribute")]


def test_every_role_and_the_bindings_python_has():
    src = ("import os.path as p, sys\n"
           "class C(Base):\n"
           "    def m(self, *a, k=1, **kw):\n"
           "        for i in a: self.total = i\n"
           "        with open(p) as fh: pass\n"
           "        return self.helper(kw)\n"
           "try:\n    pass\nexcept E as err:\n    del err\n")
    assert roles(src) == [
        ("p", "store"), ("sys", "store"), ("C", "definition"), ("Base", "load"), ("m", "definition"),
        ("self", "parameter"), ("a", "parameter"), ("k", "parameter"), ("kw", "parameter"),
        ("i", "store"), ("a", "load"), ("self", "load"), ("total", "attribute"), ("i", "load"),
        ("open", "call"), ("p", "load"), ("fh", "store"), ("self", "load"), ("helper", "call"), ("kw", "load"),
        ("E", "load"), ("err", "store"), ("err", "store")]
    assert {r for _, r in roles(src)} == set(ROLES)


def test_offsets_are_characters_and_attributes_are_marked():
    src = "s = 'é'; t = s.upper()\nlambda q: q\n"
    ids = identifiers(src)
    assert all(src[i.start:i.end] == i.name for i in ids)
    assert [(i.name, i.attr) for i in ids if i.role == "call"] == [("upper", True)]
    assert ("q", "parameter") in [(i.name, i.role) for i in ids]


def test_names_without_a_role_are_left_out():
    """Keyword arguments' names, global lists and module paths of an import have none of the six roles."""
    names = [i.name for i in identifiers("global G\nimport a.b\nf(key=1)\n")]
    assert names == ["a", "f"]  # the bound name of `import a.b` is a; `b`, `G` and `key` have no role


def test_not_python_raises():
    with pytest.raises(SyntaxError):
        identifiers("def (:\n")
