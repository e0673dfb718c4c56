"""The lab's arrows point one way: archlab (the library) imports neither analysis nor tools, and
analysis (reading, fitting and reporting runs) never imports tools (launching them). Every import is
walked, those written inside functions included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {"archlab": ("analysis", "tools"), "analysis": ("tools",)}


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import statement in ``path``, at any depth."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
    return out


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_import_points_up(package):
    upward = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in sorted((ROOT / package).rglob("*.py"))
        for line, module in imported_modules(path)
        if module.split(".")[0] in FORBIDDEN[package]
    ]
    assert not upward, "\n".join(upward)


def test_the_walk_sees_imports_inside_functions(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("import os\n\ndef f():\n    from tools import sweep\n    import analysis.fair\n")
    assert imported_modules(src) == [(1, "os"), (4, "tools"), (5, "analysis.fair")]
