"""analysis.experiment_report: the main table's verdict cell says which arm the verdict was read against when
the row's own difference is against another."""

from __future__ import annotations

from types import SimpleNamespace

from analysis.experiment_report import verdict_cell
from analysis.experiment_spec import Arm


def _ctx(verdicts: str):
    arms = {name: Arm(name=name, label=name, recipe="", overrides=[], own=[], **f) for name, f in {
        "vanilla": {}, "pre-ln": {"parent": "vanilla"}, "learned": {"parent": "pre-ln"},
        "post-ln-learned": {"parent": "vanilla", "side": True, "compare": "learned"}}.items()}
    return SimpleNamespace(spec=SimpleNamespace(verdicts=verdicts), arms=arms, reference="vanilla")


def _comparison(against: str, cls: str) -> dict:
    return {"class": cls, "verdict": {"against": against}}


def test_a_side_arms_verdict_in_a_ladder_names_its_compare_arm():
    """The side arm's row prints its difference against its parent (vanilla); its verdict is against learned."""
    ctx = _ctx("parent")
    assert verdict_cell(ctx, "post-ln-learned", _comparison("learned", "worse")) == "worse vs `learned`"
    assert verdict_cell(ctx, "learned", _comparison("pre-ln", "better")) == "better"  # a step: against its parent
    assert verdict_cell(ctx, "vanilla", {}) == "-"


def test_other_families_print_the_verdict_alone():
    """Under verdicts: reference or pairs the verdicts table names each comparison's arms."""
    for mode in ("reference", "pairs"):
        assert verdict_cell(_ctx(mode), "post-ln-learned", _comparison("learned", "worse")) == "worse"
