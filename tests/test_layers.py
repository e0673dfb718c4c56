"""The lab's arrows point one way: archlab (the library) imports neither analysis nor tools, and
analysis (reading, fitting and reporting runs) never imports tools (launching them). Every import is
walked, those written inside functions included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {"archlab": ("analysis", "tools"), "analysis": ("tools",)}
# within archlab: the model and its components never import the cost model (it asks them for their facts), and
# the data pipeline takes its errors from archlab.errors, not from the recipe validation
FORBIDDEN_WITHIN = {"archlab/model": ("archlab.costs",), "archlab/nn": ("archlab.costs",),
                    "archlab/data": ("archlab.config.validate",)}


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


def imports_of(module: str, prefix: str) -> bool:
    """Whether importing ``module`` is importing ``prefix`` (the package itself or a module under it)."""
    return module == prefix or module.startswith(prefix + ".")


@pytest.mark.parametrize("package", sorted(FORBIDDEN_WITHIN))
def test_no_import_points_up_within_archlab(package):
    upward = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in sorted((ROOT / package).rglob("*.py"))
        for line, module in imported_modules(path)
        if any(imports_of(module, prefix) for prefix in FORBIDDEN_WITHIN[package])
    ]
    assert not upward, "\n".join(upward)


def test_the_walk_sees_imports_inside_functions(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("import os\n\ndef f():\n    from tools import sweep\n    import analysis.fair\n")
    assert imported_modules(src) == [(1, "os"), (4, "tools"), (5, "analysis.fair")]
