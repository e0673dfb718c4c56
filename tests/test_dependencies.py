"""Every third-party module the project imports is declared in pyproject.toml, so that a new
virtual environment installed as README.md says (``pip install torch==2.13.0`` then
``pip install -e '.[test]'``) can run everything.

- a module-level import in ``archlab/``, ``analysis/`` or ``tools/`` needs a core dependency
  (``[project] dependencies``): it runs as soon as the module is imported;
- an import inside a function may name an optional extra instead (``tensorboard``, ``datasets``):
  the code around it says how to install the extra when it is missing;
- ``tests/`` may also use the ``test`` extra.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCE_DIRS = ("archlab", "analysis", "tools", "tests")


def _normalise(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()  # PEP 503


def _requirement_name(req: str) -> str:
    return _normalise(re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req).group(1))


def declared() -> dict[str, set[str]]:
    """{"core": names, "<extra>": names} from pyproject.toml (from the installed metadata on 3.10)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: read what pip installed from the same file
        groups: dict[str, set[str]] = {"core": set()}
        for req in importlib.metadata.requires("archlab") or []:
            extra = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", req)
            groups.setdefault(extra.group(1) if extra else "core", set()).add(_requirement_name(req))
        return groups
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    groups = {"core": {_requirement_name(r) for r in project["dependencies"]}}
    for extra, reqs in project.get("optional-dependencies", {}).items():
        groups[extra] = {_requirement_name(r) for r in reqs}
    return groups


def _first_party() -> set[str]:
    """Top-level names that are this repository's own: its packages and any module file in them
    (tests import helpers such as ``costs_cases`` by bare name)."""
    names = set(SOURCE_DIRS)
    for folder in SOURCE_DIRS:
        names |= {p.stem for p in (ROOT / folder).rglob("*.py")}
    return names


def imports(path: Path) -> list[tuple[str, bool, int]]:
    """(top-level module, imported at module level?, line) for each absolute import in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    in_function: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            in_function |= {id(n) for n in ast.walk(node) if n is not node}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            mods = [node.module]
        else:
            continue
        found += [(m.split(".")[0], id(node) not in in_function, node.lineno) for m in mods]
    return found


def third_party_imports() -> list[tuple[str, str, bool]]:
    """(module, "file:line", module level?) for every import of a module neither stdlib nor ours."""
    ours = _first_party()
    out = []
    for folder in SOURCE_DIRS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for mod, top, line in imports(path):
                if mod not in sys.stdlib_module_names and mod not in ours and mod != "__future__":
                    out.append((mod, f"{path.relative_to(ROOT)}:{line}", top))
    return out


@functools.lru_cache(maxsize=1)
def _packages_distributions() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


# optional extras not installed here whose module name is not their distribution's
UNINSTALLED_DISTRIBUTIONS = {"fla": "flash-linear-attention"}


def distribution_of(module: str) -> str:
    """The distribution that provides ``module`` (installed), else the module's own name (an
    optional extra that is not installed here, e.g. ``datasets``)."""
    dists = _packages_distributions().get(module)
    return _normalise(dists[0]) if dists else _normalise(UNINSTALLED_DISTRIBUTIONS.get(module, module))


def missing_declarations() -> list[str]:
    groups = declared()
    core, extras = groups.pop("core"), groups
    test_extra = extras.get("test", set())
    any_extra = set().union(*extras.values()) if extras else set()
    problems = []
    for module, where, top in third_party_imports():
        dist = distribution_of(module)
        in_tests = where.startswith("tests")
        allowed = core | (test_extra if in_tests else set())
        if not top or in_tests:
            allowed = allowed | any_extra
        if dist not in allowed:
            need = "[project] dependencies" + (" or the test extra" if in_tests else "")
            problems.append(f"{where}: imports {module!r} (distribution {dist!r}), not in {need} of pyproject.toml")
    return problems


def test_every_third_party_import_is_declared():
    problems = missing_declarations()
    assert not problems, "\n".join(problems)


def test_the_scan_sees_the_imports_it_checks():
    """The check above is only as good as the scan: it finds the project's known imports, tells a
    lazy import from a module-level one, and maps an import name to its distribution's name."""
    found = {(m, w.split(":")[0], top) for m, w, top in third_party_imports()}
    assert ("scipy", "analysis/curve_fit.py", True) in found
    assert ("datasets", "archlab/data/sources.py", False) in found  # inside _import_datasets()
    assert ("torch", "archlab/model/decoder.py", True) in found
    assert not any(m in ("archlab", "analysis", "tools", "costs_cases", "os") for m, _, _ in found)
    assert distribution_of("yaml") == "pyyaml"  # import name != distribution name
    assert "scipy" in declared()["core"] and "pytest" in declared()["test"]


def test_an_undeclared_module_level_import_is_reported(tmp_path, monkeypatch):
    """A module-level import of an extra in library code is reported (it would fail on import
    without the extra); the same import inside a function is allowed."""
    lib = tmp_path / "archlab"
    lib.mkdir()
    (lib / "m.py").write_text("import yaml\nimport datasets\n\ndef f():\n    import tensorboard\n")
    for folder in ("analysis", "tools", "tests"):
        (tmp_path / folder).mkdir()
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    if sys.version_info < (3, 11):
        pytest.skip("reads the installed metadata, not the temporary pyproject.toml, before Python 3.11")
    problems = missing_declarations()
    assert len(problems) == 2, problems
    assert "archlab/m.py:1: imports 'yaml' (distribution 'pyyaml')" in problems[0]
    assert "archlab/m.py:2: imports 'datasets'" in problems[1]
