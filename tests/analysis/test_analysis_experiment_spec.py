"""analysis.experiment_spec: the spec a committed report.json keeps reads back by field (keys the older
records lack take the defaults the report always read them with), and survives a second round trip; so do its
resolved arms."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis.experiment_spec import DEFAULT_MARGIN, REFERENCE, Arm, Budget, Margin, Spec

REPORTS = sorted((Path(__file__).resolve().parents[2] / "docs/experiments").glob("*/report.json"))


@pytest.mark.parametrize("path", REPORTS, ids=lambda p: p.parent.name)
def test_a_committed_reports_spec_reads_by_field(path):
    d = json.loads(path.read_text())["spec"]
    spec = Spec.from_dict(d)
    assert spec.name == d["name"] and spec.reference in {a.name for a in spec.arms}
    assert spec.seeds == d["seeds"] and spec.budget.to_dict() == d["budget"]
    assert spec.margin.to_dict() == (d.get("margin") or DEFAULT_MARGIN.to_dict())
    assert spec.verdicts == (d.get("verdicts") or REFERENCE)
    assert Spec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


@pytest.mark.parametrize("path", REPORTS, ids=lambda p: p.parent.name)
def test_a_committed_reports_arms_read_by_field_and_write_back_unchanged(path):
    """The report reads its arms as :class:`Arm` and writes them back with their costs: the same JSON."""
    for d in json.loads(path.read_text())["arms"]:
        arm = Arm.from_dict(d)  # the report's own key (costs) is not the arm's
        assert arm.name == d["name"] and arm.budget.to_dict() == d["budget"] and arm.side == d["side"]
        assert json.dumps({**arm.to_dict(), "costs": d["costs"]}) == json.dumps(d)


def test_budgets_and_margins_keep_what_the_yaml_wrote():
    assert Budget.from_dict({"flops": 4.2e12}) == Budget("flops", 4.2e12) and not Budget("flops", 1.0).timed
    timed = Budget.from_dict({"match_time_of": "moe"})
    assert timed.timed and timed.to_dict() == {"match_time_of": "moe"}  # no speed_of until the arm resolves it
    assert Margin("nats", 0.02).nats == 0.02 and Margin("nats", 0.02).ceg is None
    assert DEFAULT_MARGIN.to_dict() == {"ceg": [0.9, 1.1]} and DEFAULT_MARGIN.nats is None
