"""tools.sweep.cooldown: a stable trunk and its branches planned at token and FLOP budgets; bad specs."""

from __future__ import annotations

import math

import pytest

from archlab.config import load_recipe, model_config
from archlab.costs import param_counts
from tests.tools.sweep.helpers import TINY, write_cooldown_spec
from tools.sweep.cli import main
from tools.sweep.plan import build_points, plan_point


def test_cooldown_plans_a_stable_trunk_and_its_branches(tmp_path):
    """Per point a trunk to the last branch step with a checkpoint at each, and per token count D a
    branch of ceil(D / 256) steps whose last 20% decay from the trunk's checkpoint; tokens points too."""
    _, spec = write_cooldown_spec(tmp_path, tokens=[4096], set=TINY + ["train.warmup_steps=1"])
    points = {p.name: plan_point(p, tmp_path, 1, 4) for p in build_points(spec)}
    assert list(points) == ["ok-tok4096", "ok-stable", "ok-cd2048", "ok-cd4096"]
    full, trunk, short, long = points.values()
    assert (full.role, trunk.role, short.role, long.role) == ("full", "stable", "cooldown", "cooldown")
    assert short.parent == long.parent == "ok-stable" and full.parent is None
    # 8 steps: decay round(1.6) = 2 from step 6; 16 steps: decay round(3.2) = 3 from step 13
    assert (short.max_steps, short.cooldown["branch_step"], short.cooldown["decay_steps"]) == (8, 6, 2)
    assert (long.max_steps, long.cooldown["branch_step"], long.cooldown["decay_steps"]) == (16, 13, 3)
    assert trunk.max_steps == 13 and trunk.cooldown["branch_steps"] == [6, 13]
    assert long.planned_tokens == full.planned_tokens == 4096 and long.max_steps == full.max_steps
    t_extra, b_extra = trunk.extra["launch_overrides"], long.extra["launch_overrides"]
    assert "train.schedule=constant" in t_extra and "train.ckpt_steps=[6,13]" in t_extra
    assert {"train.schedule=wsd", "train.decay_steps=3", "train.decay_shape=sqrt", "train.max_steps=16",
            f"train.branch_from={tmp_path}/ok-stable/checkpoints/step_00000013"} <= set(b_extra)
    assert not any(o.startswith("train.schedule=") for o in full.extra["launch_overrides"])  # the recipe's cosine
    # one warmup for the trunk and all branches: the user's here; else the recipe's capped at a tenth of the
    # shortest branch (8 steps -> 0)
    assert not any(o.startswith("train.warmup_steps=") for o in t_extra + b_extra)
    _, spec = write_cooldown_spec(tmp_path)
    warm = {o for p in build_points(spec) for o in plan_point(p, tmp_path, 1, 4).extra["launch_overrides"]
            if o.startswith("train.warmup_steps=")}
    assert warm == {"train.warmup_steps=0"}


def test_cooldown_flops_branches_each_size_at_the_same_compute(tmp_path):
    """cooldown.flops: every size ends a branch at each compute budget C, with D = C / its training
    FLOPs per token: the sizes' points line up on IsoFLOP lines."""
    sizes = {"small": ["model.d_model=32"], "wide": ["model.d_model=64"]}
    _, spec = write_cooldown_spec(tmp_path, sizes=sizes, set=TINY + ["train.warmup_steps=1"],
                             cooldown={"flops": [2.0e9, 4.0e9], "decay_fraction": 0.2})
    points = {p.name: plan_point(p, tmp_path, 1, 4) for p in build_points(spec)}
    branches = [p for p in points.values() if p.role == "cooldown"]
    assert sorted(p.name for p in branches) == ["ok-small-cdflop2e9", "ok-small-cdflop4e9", "ok-wide-cdflop2e9",
                                                "ok-wide-cdflop4e9"]
    for p in branches:
        tokens = p.budget / p.flops_per_token  # this size's D at budget C
        assert p.max_steps == math.ceil(tokens / p.tokens_per_step)
        assert abs(p.planned_flops - p.budget) <= p.flops_per_token * p.tokens_per_step  # within one step of C
    small, wide = points["ok-small-cdflop4e9"], points["ok-wide-cdflop4e9"]
    assert wide.flops_per_token > small.flops_per_token and wide.max_steps < small.max_steps
    assert points["ok-wide-stable"].cooldown["branch_steps"] == sorted(
        p.cooldown["branch_step"] for p in branches if p.parent == "ok-wide-stable")


def test_cooldown_budgets_train_each_size_only_at_its_own_budgets(tmp_path):
    """cooldown.budgets: an IsoFLOP design where each budget lists its sizes: a size gets one trunk,
    run to its own largest budget, and branches only at the budgets that list it."""
    sizes = {"small": ["model.d_model=16"], "mid": ["model.d_model=32"], "wide": ["model.d_model=64"]}
    _, spec = write_cooldown_spec(tmp_path, sizes=sizes, set=TINY + ["train.warmup_steps=1"],
                             cooldown={"budgets": [{"flops": 2.0e9, "sizes": ["small", "mid"]},
                                                   {"flops": 8.0e9, "sizes": ["mid", "wide"]}]})
    points = {p.name: plan_point(p, tmp_path, 1, 4) for p in build_points(spec)}
    assert sorted(points) == ["ok-mid-cdflop2e9", "ok-mid-cdflop8e9", "ok-mid-stable", "ok-small-cdflop2e9",
                              "ok-small-stable", "ok-wide-cdflop8e9", "ok-wide-stable"]
    small, mid = points["ok-small-stable"], points["ok-mid-stable"]
    # the small trunk stops at its only branch's start, not at the 8e9 budget it is not part of
    assert small.max_steps == points["ok-small-cdflop2e9"].cooldown["branch_step"]
    assert mid.cooldown["branch_steps"] == sorted(points[f"ok-mid-cdflop{c}"].cooldown["branch_step"]
                                                  for c in ("2e9", "8e9"))


def test_cooldown_compute_6nd_places_branches_at_six_n_d(tmp_path):
    """cooldown.compute: 6nd: a FLOPs budget C is Kaplan's 6 N D (N: active non-embedding parameters
    without the LM head), so D = C / 6N; the measured FLOPs (LM head, attention) stay the cost."""
    sizes = {"small": ["model.d_model=16"], "wide": ["model.d_model=32"]}
    _, spec = write_cooldown_spec(tmp_path, sizes=sizes, set=TINY + ["train.warmup_steps=1"],
                             cooldown={"flops": [4.0e8], "compute": "6nd"})
    for p in (plan_point(p, tmp_path, 1, 4) for p in build_points(spec)):
        if p.role != "cooldown":
            continue
        n = param_counts(model_config(load_recipe("recipes/dense/tiny.yaml", p.overrides))).active_no_head
        assert p.max_steps == math.ceil(4.0e8 / (6 * n) / p.tokens_per_step)
        assert p.flops_per_token > 6 * n  # the measured cost counts the LM head too
        assert p.planned_flops == p.planned_tokens * p.flops_per_token


@pytest.mark.parametrize("budgets,message", [
    ([{"flops": 2e9, "sizes": ["small", "huge"]}], "sizes ['huge'] are not defined under sizes:"),
    ([{"flops": 2e9, "sizes": ["small"]}], "sizes ['wide'] are in no budget"),
    ([{"flops": 2e9, "sizes": ["small", "wide"]}, {"tokens": 4096, "sizes": ["wide"]}], "mixes flops and tokens"),
    ([{"flops": 2e9, "sizes": ["small", "wide"]}, {"flops": 2e9, "sizes": ["wide"]}], "is listed twice"),
    ([{"flops": 2e9}], "needs a list of size names"),
    ([], "needs a list such as"),
])
def test_bad_cooldown_budgets_fail_clearly(tmp_path, capsys, budgets, message):
    sizes = {"small": ["model.d_model=16"], "wide": ["model.d_model=32"]}
    path, _ = write_cooldown_spec(tmp_path, sizes=sizes, cooldown={"budgets": budgets})
    assert main(["--spec", str(path), "--dry-run"]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "sweep").exists()


@pytest.mark.parametrize("cooldown,extra_set,message", [
    ({"tokens": []}, [], "cooldown.tokens=[]: needs a list"),
    ({"tokens": [4096], "flops": [1e9]}, [], "cooldown: give exactly one of tokens"),
    ({"shape": "sqrt"}, [], "cooldown: give exactly one of tokens"),
    ({"tokens": [4096], "shape": "cubic"}, [], "cooldown.shape='cubic': must be one of: linear, sqrt"),
    ({"tokens": [4096], "decay_fraction": 1.5}, [], "cooldown.decay_fraction=1.5: must lie in (0, 1)"),
    ({"tokens": [4096], "every": 2}, [], "cooldown: unknown keys ['every']"),
    ({"tokens": [-5]}, [], "must be positive"),
    ({"flops": [1e9], "compute": "kaplan"}, [], "cooldown.compute='kaplan': must be one of: measured, 6nd"),
    ({"tokens": [4096], "compute": "6nd"}, [], "only FLOPs budgets have a compute convention"),
    ({"tokens": [4096]}, ["train.schedule=cosine"], "'train.schedule=cosine' (point ok) is set by the sweep"),
    ({"tokens": [256]}, [], "leave the branch start at step 0"),
    ({"tokens": [2048]}, ["train.warmup_steps=7"], "before the end of the warmup (7 steps)"),
])
def test_bad_cooldown_specs_fail_clearly(tmp_path, capsys, cooldown, extra_set, message):
    path, _ = write_cooldown_spec(tmp_path, cooldown=cooldown, set=TINY + extra_set)
    assert main(["--spec", str(path), "--dry-run"]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "sweep").exists()
