"""tools.task_scores: the checkpoint of lowest dev loss, the still-falling check, document-bootstrap intervals."""

from __future__ import annotations

import json

import numpy as np
import pytest

from archlab.errors import RecipeError
from tools.task_scores import bootstrap, chosen_checkpoint, table


def fake_run(tmp_path, losses: dict[int, float], kept: list[int]):
    rows = [{"kind": "val", "step": s, "tag_loss": v} for s, v in losses.items()]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for s in kept:
        d = tmp_path / "checkpoints" / f"step_{s:08d}"
        d.mkdir(parents=True)
        (d / "manifest.json").write_text("{}")
    return tmp_path


def test_the_lowest_dev_loss_among_kept_checkpoints_is_chosen(tmp_path):
    run = fake_run(tmp_path, {50: 1.0, 100: 0.7, 150: 0.8, 200: 0.9}, kept=[50, 100, 150, 200])
    ckpt, step, falling = chosen_checkpoint(run, "tag_loss")
    assert step == 100 and ckpt.name == "step_00000100" and not falling


def test_still_falling_when_the_last_row_is_the_lowest(tmp_path):
    run = fake_run(tmp_path, {50: 1.0, 100: 0.7, 150: 0.6}, kept=[100, 150])
    assert chosen_checkpoint(run, "tag_loss")[1:] == (150, True)


def test_a_run_without_checkpoints_at_validation_steps_is_refused(tmp_path):
    run = fake_run(tmp_path, {50: 1.0}, kept=[])
    with pytest.raises(RecipeError, match="no checkpoint at a validation step"):
        chosen_checkpoint(run, "tag_loss")


def test_bootstrap_over_documents_holds_the_rate_and_widens_when_items_cluster():
    rng = np.random.default_rng(0)
    correct = (rng.random(2000) < 0.7).astype(float)
    counted = np.ones(2000)
    lo, hi = bootstrap(correct, counted, np.arange(2000))
    assert lo < correct.mean() < hi and hi - lo < 0.06
    clustered = np.repeat([1.0, 0.0], 1000)  # one document right, the other wrong: the interval spans both
    lo2, hi2 = bootstrap(clustered, counted, np.repeat([0, 1], 1000))
    assert lo2 == 0.0 and hi2 == 1.0


def test_the_table_prints_each_split():
    row = {"run": "r", "task": "tag", "split": "val", "items": 1200, "chance": 1 / 6, "baseline": 0.5,
           "baseline_ci": (0.45, 0.55), "accuracy": 0.8, "accuracy_ci": (0.78, 0.82), "step": 100,
           "still_falling": False}
    out = table([row])
    assert "| r | tag | val | 1,200 | 0.167 | 0.500 [0.450, 0.550] | 0.800 [0.780, 0.820] | 100 | no |" in out
