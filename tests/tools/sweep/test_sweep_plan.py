"""tools.sweep.plan: grid expansion, steps from budgets, user settings, bad specs and the dry run."""

from __future__ import annotations

import math

import pytest

from archlab.config import load_recipe, model_config
from archlab.costs import training_flops_per_token
from tests.tools.sweep.helpers import TINY
from tools.sweep.cli import main
from tools.sweep.plan import build_points, plan_point


def test_points_cross_ladders_sizes_grid_and_budgets():
    spec = {"ladders": {"dense": {"recipe": "recipes/dense/tiny.yaml"},
                        "llama": {"recipe": "recipes/llama/tiny.yaml", "set": ["model.n_kv_heads=1"],
                                  "sizes": {"s": ["train.lr=1e-3"]}}},
            "sizes": {"s": ["model.d_model=32"], "m": ["model.d_model=64"]},
            "grid": {"train.seed": [0, 1]}, "tokens": [1e5], "flops": [1e12], "set": ["data.max_bytes=1000"]}
    points = build_points(spec)
    assert len(points) == 2 * 2 * 2 * 2
    names = {p.name for p in points}
    assert "llama-s-seed1-tok100000" in names and "dense-m-seed0-flop1e12" in names
    p = next(p for p in points if p.name == "llama-s-seed1-tok100000")
    # order: common, ladder, size (shared then ladder-specific), grid: later overrides win
    assert p.overrides == ["data.max_bytes=1000", "model.n_kv_heads=1", "model.d_model=32", "train.lr=1e-3",
                           "train.seed=1"]


def test_steps_come_from_token_and_flop_budgets(tmp_path):
    spec = {"ladders": {"dense": {"recipe": "recipes/dense/tiny.yaml"}}, "set": TINY, "tokens": [5000], "flops": [3e9]}
    tok, flop = [plan_point(p, tmp_path, processes=2, evals=4) for p in build_points(spec)]
    cfg = load_recipe("recipes/dense/tiny.yaml", TINY)
    tps = 32 * 8 * 1 * 2
    fpt = training_flops_per_token(model_config(cfg), 32)
    assert tok.tokens_per_step == tps and tok.max_steps == math.ceil(5000 / tps)
    assert flop.flops_per_token == fpt and flop.max_steps == math.ceil(3e9 / (fpt * tps))
    assert flop.planned_flops == pytest.approx(flop.max_steps * tps * fpt)
    extra = tok.extra["launch_overrides"]
    assert f"train.max_steps={tok.max_steps}" in extra and f"train.run_name={tok.name}" in extra
    assert f"train.eval_every={max(1, tok.max_steps // 4)}" in extra


def test_user_settings_win_over_scaled_defaults(tmp_path):
    spec = {"ladders": {"d": {"recipe": "recipes/dense/tiny.yaml"}}, "set": TINY + ["train.eval_every=3"],
            "tokens": [20000]}
    p = plan_point(build_points(spec)[0], tmp_path, 1, 8)
    assert not any(o.startswith("train.eval_every=") for o in p.extra["launch_overrides"])


def test_bad_sweeps_fail_clearly(tmp_path, capsys):
    bad_spec = tmp_path / "bad.yaml"
    bad_spec.write_text("ladders: {d: {recipe: recipes/dense/tiny.yaml}}\ntokens: [1e5]\nsizez: {}\n")
    cases = [
        (["--recipes", "recipes/dense/tiny.yaml"], "no budget"),
        (["--tokens", "1e5"], "no recipes"),
        (["--recipes", "recipes/dense/nope.yaml", "--tokens", "1e5"], "recipe file not found"),
        (["--recipes", "recipes/dense/tiny.yaml", "--tokens", "1e5", "--set", "model.d_model=30"], "n_heads"),
        (["--recipes", "recipes/dense/tiny.yaml", "--tokens", "-5"], "must be positive"),
        (["--spec", str(bad_spec)], "unknown keys"),
        (["--spec", str(tmp_path / "none.yaml")], "file not found"),
        (["--recipes", "recipes/dense/tiny.yaml", "--tokens", "1e5", "--num-processes", "2"], "--launcher accelerate"),
    ]
    for args, message in cases:
        assert main(args + ["--out", str(tmp_path / "s"), "--dry-run"]) == 2, args
        assert message in capsys.readouterr().err, args
    assert not (tmp_path / "s").exists()


def test_dry_run_prints_commands_and_writes_nothing(tmp_path, capsys):
    assert main(["--recipes", "recipes/dense/tiny.yaml", "recipes/llama/tiny.yaml", "--tokens", "4096",
                 "--set", *TINY, "--out", str(tmp_path / "s"), "--dry-run"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and all("archlab.train" in line and "train.max_steps=16" in line for line in lines)
    assert not (tmp_path / "s").exists()
