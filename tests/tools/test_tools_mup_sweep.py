"""tools.mup_sweep: the --quick sweep end to end (runs, JSON, plot, resume), width overrides, bad input."""

from __future__ import annotations

import json
import math

from archlab.config import load_recipe
from tools import mup_sweep
from tools.mup_sweep import PLOT, RESULTS, main, width_overrides


def test_quick_sweep_runs_end_to_end_and_resumes(tmp_path, monkeypatch):
    out = tmp_path / "sweep"
    args = ["--quick", "--out", str(out), "--set", f"data.cache_dir={tmp_path / 'cache'}"]
    assert main(args) == 0
    report = json.loads((out / RESULTS).read_text())
    points = report["points"]
    assert len(points) == 2 * 2 * 2 and report["base_width"] == 16  # parametrisations x widths x lrs
    assert all(p["status"] == "completed" and p["steps"] == 4 for p in points)
    assert all(math.isfinite(p["final_train_loss"]) and math.isfinite(p["final_val_loss"]) for p in points)
    by_name = {p["name"]: p for p in points}
    for lr in report["lrs"]:  # at the base width muP is standard parametrisation: the same run
        std, mup = by_name[f"standard-w16-lr{lr:g}"], by_name[f"mup-w16-lr{lr:g}"]
        assert (std["final_train_loss"], std["final_val_loss"]) == (mup["final_train_loss"], mup["final_val_loss"])
    assert by_name["mup-w32-lr0.03"]["final_val_loss"] != by_name["standard-w32-lr0.03"]["final_val_loss"]
    recipe = load_recipe(out / "mup-w32-lr0.03" / "recipe.yaml")
    assert recipe.model.parametrization == "mup" and recipe.model.mup_base_width == 16 and recipe.model.d_model == 32
    assert set(report["best_lr"]) == {"standard", "mup"} and set(report["best_lr"]["mup"]) == {"16", "32"}
    assert (out / PLOT).stat().st_size > 10_000

    def no_training(cfg):
        raise AssertionError("a finished point was trained again")

    monkeypatch.setattr(mup_sweep, "train", no_training)
    assert main(args) == 0
    assert json.loads((out / RESULTS).read_text())["points"] == points
    # muP alone (tuning its base lr): the same finished mup points, read, and a one-panel plot
    assert main([*args, "--parametrizations", "mup"]) == 0
    mup_only = json.loads((out / RESULTS).read_text())
    assert mup_only["parametrizations"] == ["mup"] and set(mup_only["best_lr"]) == {"mup"}
    assert mup_only["points"] == [p for p in points if p["parametrization"] == "mup"]
    assert (out / PLOT).stat().st_size > 10_000
    # a folder that lost its metrics but kept a "completed" summary: reported incomplete, left out of the best lr
    broken = out / "mup-w32-lr0.03" / "summary.json"
    summary = json.loads(broken.read_text())
    broken.write_text(json.dumps({**summary, "final_val_loss": {}}))
    assert main([*args, "--parametrizations", "mup"]) == 1
    row = next(p for p in json.loads((out / RESULTS).read_text())["points"] if p["name"] == "mup-w32-lr0.03")
    assert row["status"] == "incomplete" and row["final_val_loss"] is None


def test_explicit_hidden_sizes_scale_with_the_width(root):
    dense = load_recipe(root / "recipes/dense/tiny.yaml", ["model.ffn.hidden=300"]).model
    assert width_overrides(dense, 192) == ["model.d_model=192", "model.ffn.hidden=600"]
    assert width_overrides(load_recipe(root / "recipes/llama/tiny.yaml").model, 48) == ["model.d_model=48"]
    moe = load_recipe(root / "recipes/deepseek/tiny.yaml").model
    scaled = width_overrides(moe, 2 * moe.d_model)
    assert f"model.moe.expert_hidden={2 * moe.moe.expert_hidden}" in scaled


def test_bad_input_exits_2_before_training(tmp_path, capsys):
    assert main(["--quick", "--widths", "30", "--out", str(tmp_path)]) == 2  # 4 heads do not divide 30
    assert "n_heads" in capsys.readouterr().err
    assert main(["--quick", "--lrs", "0", "--out", str(tmp_path)]) == 2
    assert not any(tmp_path.iterdir())
