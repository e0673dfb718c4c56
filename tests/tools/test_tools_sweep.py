"""tools.sweep: grid expansion, steps from budgets, commands, and a real resumable sweep."""

from __future__ import annotations

import json
import math

import pytest

from archlab.config import load_recipe, model_config
from archlab.costs import training_flops_per_token
from tools.sweep import build_points, command, main, plan_point

TINY = ["model.vocab_size=384", "train.seq_len=32", "train.micro_batch_size=8", "data.max_bytes=150000",
        "train.eval_batches=2", "train.tensorboard=false", "train.eval_context_multipliers=[1]",
        "model.d_model=16", "model.n_layers=1", "model.n_heads=2"]


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


def test_commands_for_both_launchers(tmp_path):
    spec = {"ladders": {"d": {"recipe": "recipes/dense/tiny.yaml"}}, "set": TINY, "tokens": [5000]}
    p = plan_point(build_points(spec)[0], tmp_path, 2, 8)
    cmd = command(p, "python", 1, [])
    assert cmd[1:4] == ["-m", "archlab.train", "recipes/dense/tiny.yaml"] and "train.resume=auto" not in cmd
    acc = command(p, "accelerate", 2, [])
    assert acc[1:3] == ["-m", "accelerate.commands.launch"]
    assert acc[3:6] == ["--multi_gpu", "--num_processes", "2"] and "archlab.train" in acc
    (tmp_path / p.name).mkdir()  # a started point continues from its checkpoint
    assert command(p, "python", 1, [])[-1] == "train.resume=auto"


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


def test_a_real_sweep_records_failures_and_resumes(tmp_path, capsys):
    """One point trains, one fails (its corpus path does not exist); the rerun skips the finished
    point, retries the failed one, and a changed point under the same name is refused."""
    out = tmp_path / "sweep"
    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps({
        "out": str(out), "tokens": [4096],
        "set": TINY + [f"data.cache_dir={tmp_path / 'cache'}"],
        "ladders": {"ok": {"recipe": "recipes/dense/tiny.yaml"},
                    "broken": {"recipe": "recipes/dense/tiny.yaml",
                               "set": ["data.source=text", f"data.paths=[{tmp_path / 'missing.txt'}]"]}},
    }))
    assert main(["--spec", str(spec), "--jobs", "2", "--threads", "1"]) == 1  # both points at once
    manifest = json.loads((out / "manifest.json").read_text())
    points = {p["name"]: p for p in manifest["points"]}
    ok, broken = points["ok-tok4096"], points["broken-tok4096"]
    assert ok["status"] == "finished" and ok["returncode"] == 0 and ok["max_steps"] == 16
    summary = json.loads((out / "ok-tok4096" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["tokens"] == 16 * 256
    assert broken["status"] == "failed" and broken["returncode"] == 2
    assert "missing.txt" in (out / "logs" / "broken-tok4096.log").read_text()
    capsys.readouterr()

    assert main(["--spec", str(spec), "--stop-on-failure"]) == 1
    again = {p["name"]: p for p in json.loads((out / "manifest.json").read_text())["points"]}
    assert again["ok-tok4096"]["elapsed_s"] == ok["elapsed_s"]  # skipped, not retrained
    assert again["broken-tok4096"]["status"] == "failed"
    assert "1 already done" in capsys.readouterr().out

    assert main(["--spec", str(spec), "--set", "train.lr=1e-4", "--dry-run"]) == 2
    assert "different settings" in capsys.readouterr().err
