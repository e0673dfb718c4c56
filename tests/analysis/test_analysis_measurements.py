"""analysis.measurements: one module per measurement, each registered once under its spec name
with its settings checked; and no import cycle among the analysis modules (imports read from the
source with ``ast``: module level, inside functions and under ``TYPE_CHECKING`` alike)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from analysis.measurements import MEASUREMENTS, Measurement
from archlab.errors import RecipeError

ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------------------------
# import cycles
# --------------------------------------------------------------------------------------------


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(paths: list[Path], root: Path) -> dict[str, set[str]]:
    """module -> the modules among ``paths`` it imports anywhere in its source. ``from p import x``
    counts as importing ``p.x`` when that is one of the modules, else ``p``; importing a submodule
    is not counted as importing its package (Python runs the package first, but a package that
    imports its own submodules is the usual layout, not a cycle)."""
    modules = {_module_name(p, root): p for p in paths}
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # from . import x, from ..y import z
                    parts = package.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            edges |= {t for t in targets if t in modules and t != name}
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of the graph as [a, b, ..., a], or [] when there is none (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(n: str) -> list[str]:
        state[n] = 1
        path.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return path[path.index(m):] + [m]
            if m not in state and (cycle := visit(m)):
                return cycle
        path.pop()
        state[n] = 2
        return []

    for n in sorted(graph):
        if n not in state and (cycle := visit(n)):
            return cycle
    return []


def analysis_sources() -> list[Path]:
    """The analysis modules and the tools that the experiment report and runner import."""
    return (sorted((ROOT / "analysis").glob("*.py")) + sorted((ROOT / "analysis" / "measurements").glob("*.py"))
            + sorted((ROOT / "tools").glob("experiment*.py")) + sorted((ROOT / "tools" / "sweep").glob("*.py")))


def test_no_import_cycle_between_analysis_modules():
    graph = import_graph(analysis_sources(), ROOT)
    assert "analysis.ceg_report" in graph["analysis.experiment_report"]  # the report's stages are in the graph
    # the graph is the real one: the report imports the registry, which imports every measurement,
    # and each measurement imports the shared helpers
    assert "analysis.measurements" in graph["analysis.experiment_report"]
    assert {f"analysis.measurements.{n}" for n in MEASUREMENTS} <= graph["analysis.measurements"]
    assert "analysis.experiments" in graph["analysis.measurements.routing"]
    cycle = find_cycle(graph)
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_check_sees_imports_inside_functions_and_relative_ones(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from pkg import a  # noqa\n")
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text("def f():\n    from .a import x\n    return x\n")
    (pkg / "c.py").write_text("import pkg.a\n")
    graph = import_graph(sorted(pkg.glob("*.py")), tmp_path)
    assert graph == {"pkg": {"pkg.a"}, "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}, "pkg.c": {"pkg.a"}}
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.a"]
    (pkg / "b.py").write_text("x = 1\n")
    assert find_cycle(import_graph(sorted(pkg.glob("*.py")), tmp_path)) == []


# --------------------------------------------------------------------------------------------
# the registry
# --------------------------------------------------------------------------------------------


def test_every_measurement_module_registers_one_measurement_under_its_name():
    modules = sorted(p.stem for p in (ROOT / "analysis" / "measurements").glob("*.py")
                     if p.stem not in ("__init__", "base"))
    assert sorted(MEASUREMENTS) == modules  # a module not imported by the package registers nothing
    for name, m in MEASUREMENTS.items():
        assert isinstance(m, Measurement) and m.name == name and m.title
        assert type(m).__module__ == f"analysis.measurements.{name}"
        assert type(m).section is not Measurement.section, name  # every measurement has a report section
    # what runs after training: the six that compute beyond the run folders
    assert sorted(n for n, m in MEASUREMENTS.items() if type(m).run is not Measurement.run) == [
        "cloze", "extrapolation", "finetune", "init_grad_norms", "mad", "moe_breakdown", "mqar", "routing",
        "throughput", "val_sampling"]
    assert [n for n, m in MEASUREMENTS.items() if m.last] == ["throughput"]


@pytest.mark.parametrize("name,settings", [
    ("ladder", None), ("ladder", {}), ("throughput", {"steps": 10, "rounds": 5}),
    ("extrapolation", {"multipliers": [1, 2], "tokens": 2048, "arms": ["rope"],
                       "variants": {"pi": {"arm": "rope", "label": "PI", "set": ["a.b={factor}"]}}}),
    ("init_grad_norms", {"depths": [2, 3], "batches": 1, "seeds": [0], "arms": ["pre-ln"]}),
    ("routing", {"heatmaps": ["a", "b"]}), ("routing", {"held_out_tokens": 4096}),
    ("moe_breakdown", {"rounds": 5, "repeats": 10, "windows": 16}),
])
def test_valid_settings_pass_unchanged(name, settings):
    assert MEASUREMENTS[name].check(settings, f"measurements.{name}") == (settings or {})


@pytest.mark.parametrize("name,settings,message", [
    ("ladder", {"steps": 3}, "measurements.ladder: unknown keys ['steps']; valid: none"),
    ("extrapolation", {"multiplier": [1, 2]}, "measurements.extrapolation: unknown keys ['multiplier']; valid: arms"),
    ("extrapolation", {"multipliers": [0, 2]}, "measurements.extrapolation.multipliers=[0, 2]: expected a list"),
    ("extrapolation", {"tokens": "many"}, "measurements.extrapolation.tokens='many': expected an integer >= 1"),
    ("extrapolation", {"variants": {"pi": {"arm": "rope", "sett": []}}},
     "measurements.extrapolation.variants.pi: unknown keys ['sett']"),
    ("extrapolation", {"variants": {"pi": {"label": "PI"}}}, "measurements.extrapolation.variants.pi="),
    ("init_grad_norms", {"depths": [2], "seeds": [-1]}, "measurements.init_grad_norms.seeds=[-1]"),
    ("init_grad_norms", {"batches": True}, "measurements.init_grad_norms.batches=True"),
    ("routing", {"heatmaps": "a"}, "measurements.routing.heatmaps='a': expected a list of arm names"),
    ("routing", {"held_out_tokens": 0}, "measurements.routing.held_out_tokens=0: expected an integer >= 1"),
    ("throughput", {"steps": 0}, "measurements.throughput.steps=0: expected an integer >= 1"),
    ("moe_breakdown", {"repeats": 0}, "measurements.moe_breakdown.repeats=0: expected an integer >= 1"),
    ("moe_breakdown", {"phases": 3}, "measurements.moe_breakdown: unknown keys ['phases']"),
    ("throughput", [10, 5], "measurements.throughput=[10, 5]: expected a mapping of settings (steps, rounds)"),
])
def test_bad_settings_fail_naming_the_key(name, settings, message):
    with pytest.raises(RecipeError) as e:
        MEASUREMENTS[name].check(settings, f"measurements.{name}")
    assert message in str(e.value)
