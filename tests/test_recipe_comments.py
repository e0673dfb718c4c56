"""A recipe's comment that states its parameter count ("~1.2M parameters") states the cost model's count
(archlab.costs.param_counts, total) within 10%."""

import re
from pathlib import Path

import pytest

import archlab
from archlab.costs import param_counts

ROOT = Path(__file__).resolve().parents[1]
STATED = re.compile(r"(\d+(?:\.\d+)?) ?([kMB]) parameters\b")  # "~1.2M parameters", "2.45B parameters"
UNIT = {"k": 1e3, "M": 1e6, "B": 1e9}


def stated_counts(path: Path) -> list[tuple[str, float]]:
    """(the words, the count) of each parameter count the file's comments state."""
    comments = "\n".join(line.split("#", 1)[1] for line in path.read_text().splitlines() if "#" in line)
    return [(m.group(0), float(m.group(1)) * UNIT[m.group(2)]) for m in STATED.finditer(comments)]


STATING = sorted(p for p in (ROOT / "recipes").rglob("*.yaml") if stated_counts(p))


def test_the_pattern_finds_the_tiny_recipes_counts():
    names = {p.relative_to(ROOT / "recipes").as_posix() for p in STATING}
    assert {"llama/tiny.yaml", "dense/tiny.yaml", "bert/tiny.yaml", "gptj/tiny.yaml"} <= names
    assert [w for w, _ in stated_counts(ROOT / "recipes/llama/tiny.yaml")] == ["2.0M parameters"]


@pytest.mark.parametrize("path", STATING, ids=lambda p: p.relative_to(ROOT / "recipes").as_posix())
def test_a_stated_parameter_count_is_within_10_percent_of_the_cost_models(path):
    counted = param_counts(archlab.load_recipe(path)).total
    for words, stated in stated_counts(path):
        assert abs(counted / stated - 1) <= 0.10, (f"{path.relative_to(ROOT)}: the comment says {words!r}, "
                                                   f"archlab.costs.param_counts counts {counted:,}")
