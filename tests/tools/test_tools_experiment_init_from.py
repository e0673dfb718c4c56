"""``train.init_from=arm:<name>`` in an experiment arm (tools/experiment/stages/init_from.py): the arm trains after
the named arm, each seed from that arm's run of the same seed."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from archlab.config import RecipeError
from tools.experiment.arms import resolve_arms
from tools.experiment.load import load_spec
from tools.experiment.stages import init_from

ROOT = Path(__file__).resolve().parents[2]


def spec_and_arms():
    spec = load_spec(str(ROOT / "experiments/upcycling.yaml"))
    return spec, resolve_arms(spec)


def test_arms_that_start_from_another_arm_train_after_it_each_seed_from_its_own_run():
    spec, arms = spec_and_arms()
    first, later = init_from.split(arms)
    assert [a.name for a in first] == ["dense-pre", "moe-scratch"]
    assert [a.name for a in later] == ["upcycled", "dense-continued"]
    trunks = {("dense-pre", s): f"/runs/dense-pre-seed{s}" for s in spec.seeds}
    sspec = init_from.seed_spec(spec, later, 1, trunks)
    assert sspec["grid"] == {"train.seed": [1]} and sspec["out"].endswith("sweep-init/seed1")
    for ladder in sspec["ladders"].values():
        assert "train.init_from=/runs/dense-pre-seed1" in ladder["set"]
        assert not any(o.startswith(init_from.PREFIX) for o in ladder["set"])
    assert "train.upcycle.method=copy" in sspec["ladders"]["upcycled"]["set"]


@pytest.mark.parametrize("source", ["nosuch", "upcycled"])
def test_a_reference_to_an_unknown_or_dependent_arm_is_refused(source):
    _, arms = spec_and_arms()
    arms = [dataclasses.replace(a, overrides=[*a.overrides, f"train.init_from=arm:{source}"])
            if a.name == "dense-continued" else a for a in arms]
    with pytest.raises(RecipeError, match=f"dense-continued: train.init_from=arm:{source} must name"):
        init_from.split(arms)
