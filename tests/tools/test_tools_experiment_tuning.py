"""tools.experiment.stages.tuning and .ceg: the spec keys, the bracketing rule of the lr
search (on a synthetic loss-vs-lr curve with a known optimum), the typed records, and what `plan`
lists for each stage."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from archlab.config import RecipeError
from tools import experiment
from tools.experiment import load_spec, resolve_arms
from tools.experiment.stages import ceg as ceg_stage
from tools.experiment.stages import tuning
from tools.sweep.manifest import write_manifest


@pytest.fixture(autouse=True)
def _in_repo_root(root, monkeypatch):
    monkeypatch.chdir(root)


def _spec(tmp_path: Path, **over) -> str:
    base = {"name": "t", "budget": {"tokens": 4096}, "seeds": [0, 1],
            "arms": [{"name": "a", "recipe": "recipes/llama/tiny.yaml"},
                     {"name": "b", "extends": "a", "set": ["model.n_kv_heads=1"]}],
            "tune": {"lr": [1.0e-3, 2.0e-3, 4.0e-3]}}
    path = tmp_path / "spec.yaml"
    path.write_text(json.dumps({**base, **over}))
    return str(path)


@pytest.mark.parametrize("tune,message", [
    ({"lr": [1e-3]}, "needs >= 2 positive, increasing values"),
    ({"lr": [2e-3, 1e-3]}, "needs >= 2 positive, increasing values"),
    ({"lr": "fast"}, "a list of learning rates"),
    ({"lr": [1e-3, 2e-3], "seed": 1}, "not one of seeds: [0, 1]"),
    ({"lr": [1e-3, 2e-3], "budget_fraction": 0}, "budget_fraction=0: must lie in (0, 1]"),
    ({"lr": [1e-3, 2e-3], "steps": 3}, "tune: unknown keys ['steps']"),
    ({"shared": "grid", "lr": [1e-3, 2e-3]}, "give only the reason"),
    ({"shared": ""}, "give only the reason"),
])
def test_bad_tune_keys_are_refused_by_name(tmp_path, tune, message):
    with pytest.raises(RecipeError) as e:
        load_spec(_spec(tmp_path, tune=tune))
    assert message in str(e.value)


def test_an_lr_grid_and_tuning_cannot_both_choose_the_lr(tmp_path):
    with pytest.raises(RecipeError, match="tune: and grid: train.lr both choose the lr"):
        load_spec(_spec(tmp_path, grid={"train.lr": [1e-3, 3e-3]}))


@pytest.mark.parametrize("ceg,message", [
    ({"fractions": [0.5, 1.0, 2.0]}, "needs >= 4 distinct positive shares"),
    ({"fractions": [0.5, 1.0, 2.0, 2.0]}, "needs >= 4 distinct positive shares"),
    ({"shape": "cubic"}, "cooldown.shape='cubic'"),
    ({"seeds": [-1]}, "ceg.seeds=[-1]"),
])
def test_bad_ceg_keys_are_refused(tmp_path, ceg, message):
    with pytest.raises(RecipeError) as e:
        load_spec(_spec(tmp_path, ceg=ceg))
    assert message in str(e.value)


@pytest.mark.parametrize("margin,message", [({"ceg": [1.1, 0.9]}, "0 < low < 1 < high"),
                                            ({"nats": -1}, "a positive number of nats"),
                                            ({"percent": 5}, "give one of")])
def test_bad_margins_are_refused(tmp_path, margin, message):
    with pytest.raises(RecipeError) as e:
        load_spec(_spec(tmp_path, margin=margin))
    assert message in str(e.value)


def test_choose_finds_the_edge_the_grid_must_extend_to():
    assert tuning.choose([1, 2, 4], [3.0, 2.0, 2.5])["side"] is None
    assert tuning.choose([1, 2, 4], [3.0, 2.0, 1.5])["side"] == "high"
    assert tuning.choose([1, 2, 4], [1.0, 2.0, 2.5])["side"] == "low"
    # a diverged run is +inf: never chosen; every run diverged: go lower
    assert tuning.choose([1, 2, 4], [3.0, 2.0, math.inf])["lr"] == 2
    assert tuning.choose([1, 2], [math.inf, math.inf])["side"] == "low"
    assert tuning.extend([1e-3, 2e-3], "high", 2.0) == [1e-3, 2e-3, 4e-3]
    assert tuning.extend([1e-3, 2e-3], "low", 2.0) == [5e-4, 1e-3, 2e-3]


def _fake_sweep(monkeypatch, optimum: dict[str, float], learns_below: float = math.inf):
    """run_sweep that 'trains' every point instantly; final loss (log10(lr / optimum))^2 per arm; a run
    whose lr is at or above ``learns_below`` ends at the unigram loss (did not learn)."""
    from tools import sweep

    seen = []

    def run_sweep(sspec, **kw):
        points = experiment.planned_points(sspec)
        for p in points:
            p.status = "finished"
        seen.append([p.name for p in points])
        Path(sspec["out"]).mkdir(parents=True, exist_ok=True)
        write_manifest(Path(sspec["out"]), sspec, points)
        return points

    def final_loss(run_dir):
        name = Path(run_dir).name
        arm, lr = name.split("-lr")[0], float(name.split("-lr")[1].split("-")[0])
        return math.log10(lr / optimum[arm]) ** 2

    def did_not_learn(run_dir):
        return float(Path(run_dir).name.split("-lr")[1].split("-")[0]) >= learns_below

    monkeypatch.setattr(sweep, "run_sweep", run_sweep)
    monkeypatch.setattr(tuning, "final_loss", final_loss)
    monkeypatch.setattr(tuning, "did_not_learn", did_not_learn)
    return seen


def test_tuning_extends_the_grid_until_the_best_lr_is_interior(tmp_path, monkeypatch):
    spec = load_spec(_spec(tmp_path, tune={"lr": [1e-3, 2e-3, 4e-3], "max_extend": 3}))
    spec = replace(spec, out=str(tmp_path / "out"))
    arms = resolve_arms(spec)
    seen = _fake_sweep(monkeypatch, {"a": 2e-2, "b": 2.2e-3})
    tuned, recs = tuning.run(spec, arms, log=lambda *a: None)
    # a: optimum 0.02 above the grid: 8e-3, then 1.6e-2, then 3.2e-2 added; 1.6e-2 is then interior, and the
    # parabola through the grid (the fake loss is one in log lr) finds the optimum between grid points
    assert tuned["a"]["lrs"] == [1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2]
    assert tuned["a"]["grid_lr"] == 1.6e-2 and tuned["a"]["bracketed"]
    assert tuned["a"]["lr"] == pytest.approx(2e-2, rel=1e-3) and tuned["a"]["choice"]["kind"] == "parabola"
    # b: optimum inside the grid: no extension; 2e-3 the grid's best, 2.2e-3 the fitted minimum
    assert tuned["b"]["lrs"] == [1e-3, 2e-3, 4e-3] and tuned["b"]["grid_lr"] == 2e-3 and tuned["b"]["bracketed"]
    assert tuned["b"]["lr"] == pytest.approx(2.2e-3, rel=1e-3)
    assert len(seen) == 4  # the starting grid, then one sweep per extension
    assert {(r["arm"], r["lr"], r["seed"], r["role"]) for r in recs} >= {("a", 3.2e-2, 1000, "tune")}
    # time-matched arms (none here) and every arm get their own lr override
    assert tuning.tuned_overrides(arms, tuned) == {"a": ["train.lr=0.02"], "b": ["train.lr=0.0022"]}


def test_tuning_again_starts_from_the_grid_it_ended_with(tmp_path, monkeypatch):
    """A second invocation (resuming, or the report's) plans the extended grid at once, so the manifest it
    writes first still lists the extension runs (and the wall times recorded for them)."""
    spec = load_spec(_spec(tmp_path, tune={"lr": [1e-3, 2e-3, 4e-3], "max_extend": 3}))
    spec = replace(spec, out=str(tmp_path / "out"))
    arms = resolve_arms(spec)
    seen = _fake_sweep(monkeypatch, {"a": 2e-2, "b": 1e-3})
    first, _ = tuning.run(spec, arms, log=lambda *a: None)
    assert first["a"]["lrs"] == [1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2]
    assert first["b"]["lrs"] == [5e-4, 1e-3, 2e-3, 4e-3]
    called = len(seen)
    again, _ = tuning.run(spec, arms, log=lambda *a: None)
    assert len(seen) == called + 1 and len(seen[-1]) == 6 + 4  # one sweep, every run of both grids
    assert again == first
    # a spec whose starting grid changed does not pick up runs of another grid's extensions
    other = replace(spec, tune=replace(spec.tune, lr=[1.5e-3, 3e-3]))
    lrs, extended = tuning.grids_so_far(other, arms)
    assert lrs == {"a": [1.5e-3, 3e-3], "b": [1.5e-3, 3e-3]} and extended["a"] == {"low": 0, "high": 0}


def test_tuning_reports_an_unbracketed_lr_when_the_limit_is_hit(tmp_path, monkeypatch):
    spec = load_spec(_spec(tmp_path, tune={"lr": [1e-3, 2e-3, 4e-3], "max_extend": 1}))
    spec = replace(spec, out=str(tmp_path / "out"))
    _fake_sweep(monkeypatch, {"a": 1e-1, "b": 1e-4})
    tuned, _ = tuning.run(spec, resolve_arms(spec), log=lambda *a: None)
    assert tuned["a"]["lrs"] == [1e-3, 2e-3, 4e-3, 8e-3] and not tuned["a"]["bracketed"]
    assert tuned["b"]["lrs"] == [5e-4, 1e-3, 2e-3, 4e-3] and tuned["b"]["limit_hit"]


def test_runs_that_did_not_learn_count_as_worst_and_send_the_grid_down(tmp_path, monkeypatch):
    """A post-LN model stuck at the unigram loss at every lr of the grid: the tuner must not pick the
    'best' of those (noise at the unigram loss) nor extend upwards; it goes down until a run learns."""
    spec = load_spec(_spec(tmp_path, tune={"lr": [1e-3, 2e-3, 4e-3], "max_extend": 3}))
    spec = replace(spec, out=str(tmp_path / "out"))
    # a: optimum 8e-3 by the loss curve, but nothing at or above 1e-3 learns
    _fake_sweep(monkeypatch, {"a": 8e-3, "b": 2e-3}, learns_below=1e-3)
    tuned, _ = tuning.run(spec, resolve_arms(spec), log=lambda *a: None)
    # down to 5e-4, which learns; then 2.5e-4, worse: 5e-4 is bracketed by a worse lr and one that did not learn
    assert tuned["a"]["lrs"] == [2.5e-4, 5e-4, 1e-3, 2e-3, 4e-3]
    assert tuned["a"]["did_not_learn"] == [False, False, True, True, True]
    assert tuned["a"]["lr"] == 5e-4 and tuned["a"]["learned"] and tuned["a"]["bracketed"]
    # b: nothing learns at any lr down to the limit: reported as such, never a chosen loss
    _fake_sweep(monkeypatch, {"a": 8e-3, "b": 2e-3}, learns_below=0.0)
    tuned, _ = tuning.run(spec, resolve_arms(spec), log=lambda *a: None)
    assert tuned["b"]["lrs"] == [1.25e-4, 2.5e-4, 5e-4, 1e-3, 2e-3, 4e-3]
    assert not tuned["b"]["learned"] and tuned["b"]["loss"] is None


def test_when_no_lr_learned_and_the_grid_may_not_extend_the_lowest_loss_is_chosen(tmp_path, monkeypatch):
    """--quick: no extension; nothing learns in a few steps, yet the lower loss still ranks the lrs."""
    spec = load_spec(_spec(tmp_path, tune={"lr": [1e-3, 2e-3, 4e-3], "max_extend": 0}))
    spec = replace(spec, out=str(tmp_path / "out"))
    _fake_sweep(monkeypatch, {"a": 8e-3, "b": 2e-3}, learns_below=0.0)
    tuned, _ = tuning.run(spec, resolve_arms(spec), log=lambda *a: None)
    assert tuned["a"]["lr"] == 4e-3 and tuned["b"]["lr"] == 2e-3
    assert not tuned["a"]["learned"] and tuned["a"]["loss"] is None


def test_plan_lists_the_tuning_runs_the_seeded_runs_and_the_compute_curve(tmp_path):
    spec = load_spec(_spec(tmp_path, budget={"tokens": 4.0e4}, ceg={"fractions": [0.25, 0.5, 1.0, 2.0], "seeds": [0]}))
    spec = replace(spec, out=str(tmp_path / "out"))
    lines = []
    out = experiment.plan(spec, log=lines.append, estimate=False)
    text = "\n".join(lines)
    assert "a-lr0.001-tok40000" in text and "b-lr0.004-tok40000" in text  # 2 arms x 3 lrs
    assert "a-seed1-tok40000" in text
    assert "a-seed0-stable" in text and "a-seed0-cd80000" in text  # the trunk and its 2x-budget branch
    assert out["stages"]["tuning (starting grid)"]["runs"] == 6
    assert out["stages"]["seeded runs"]["runs"] == 4
    assert out["stages"]["compute curve"]["runs"] == 5
    assert not (tmp_path / "out").exists()


def test_the_compute_curve_warms_up_like_the_seeded_runs(tmp_path):
    spec = load_spec(_spec(tmp_path, budget={"tokens": 2.0e5}, ceg={}))
    ref = resolve_arms(spec)[0]
    sspec = ceg_stage.sweep_spec(spec, ref, ["train.lr=0.004"])
    # 2e5 tokens / 2048 per step = 98 steps: the seeded runs warm up min(30, 98 // 10) = 9 steps
    assert all("train.warmup_steps=9" in ladder["set"] for ladder in sspec["ladders"].values())
    assert sspec["cooldown"] == {"tokens": [5.0e4, 1.0e5, 2.0e5, 4.0e5], "decay_fraction": 0.2, "shape": "sqrt"}


def _mup_arms(base_width: int, widths=(64, 128), parametrization="mup"):
    mup = [f"model.parametrization={parametrization}"]
    mup += [f"model.mup_base_width={base_width}"] if parametrization == "mup" else []  # a foreign key otherwise
    return [{"name": f"w{w}", "recipe": "recipes/llama/tiny.yaml", "set": [*mup, f"model.d_model={w}"]}
            for w in widths]


def test_mup_tuning_searches_the_base_width_once_and_transfers(tmp_path, monkeypatch):
    spec = load_spec(_spec(tmp_path, arms=_mup_arms(64), tune={"lr": [1e-3, 2e-3, 4e-3], "mup": True}))
    spec = replace(spec, out=str(tmp_path / "out"))
    seen = _fake_sweep(monkeypatch, {"w64": 2e-3})
    tuned, recs = tuning.run(spec, resolve_arms(spec), log=lambda *a: None)
    assert {r["arm"] for r in recs} == {"w64"} and len(seen) == 1  # only the base width is trained
    assert tuned["w128"]["lr"] == tuned["w64"]["lr"] == 2e-3 and tuned["w128"]["transferred_from"] == "w64"


def test_mup_tuning_narrows_the_first_arm_when_no_arm_is_at_the_base_width(tmp_path):
    spec = load_spec(_spec(tmp_path, arms=_mup_arms(32), tune={"lr": [1e-3, 2e-3], "mup": True}))
    base = tuning.mup_base_arm(resolve_arms(spec))
    assert base.name == "w64-base32" and base.overrides[-1] == "model.d_model=32"


def test_mup_tuning_refuses_arms_that_do_not_train_under_mup(tmp_path):
    spec = load_spec(_spec(tmp_path, arms=_mup_arms(64, parametrization="standard"),
                           tune={"lr": [1e-3, 2e-3], "mup": True}))
    with pytest.raises(RecipeError, match="arm w64 trains with model.parametrization=standard"):
        tuning.mup_base_arm(resolve_arms(spec))


def test_verdicts_must_be_reference_or_pairs_with_a_compare_arm(tmp_path):
    with pytest.raises(RecipeError, match="verdicts='all': must be reference"):
        load_spec(_spec(tmp_path, verdicts="all"))
    with pytest.raises(RecipeError, match="verdicts=pairs: no arm names a compare: arm"):
        resolve_arms(load_spec(_spec(tmp_path, verdicts="pairs")))


def test_parent_verdicts_need_a_ladder(tmp_path):
    with pytest.raises(RecipeError, match="verdicts=parent: no arm extends another"):
        resolve_arms(load_spec(_spec(tmp_path, verdicts="parent", arms=[
            {"name": "a", "recipe": "recipes/llama/tiny.yaml"},
            {"name": "b", "recipe": "recipes/llama/tiny.yaml", "set": ["model.n_kv_heads=1"]}])))
