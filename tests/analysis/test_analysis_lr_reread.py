"""analysis.lr_reread: a synthetic report.json whose grids have known optima (the whole-grid lr recovered, a trained
lr off the optimum outside the interval, the seed sd pooled from the seeded runs) and a committed report read back
with the seed sd its report.md prints."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from analysis import lr_choice, lr_reread

ROOT = Path(__file__).resolve().parents[2]
GRID = [1e-3 * 2 ** k for k in range(6)]  # 1e-3 .. 3.2e-2
OPT = 5.5e-3
SEEDED = {"a": [3.00, 3.02, 3.04], "b": [3.10, 3.13, 3.16]}  # within-arm sds 0.02 and 0.03: pooled sqrt(0.00065)


def bowl(lr: float) -> float:
    return 3.0 + 0.5 * math.log(lr / OPT) ** 2


def grid(trained: float, losses: list) -> dict:
    return {"lrs": GRID, "losses": losses, "diverged": [v is None for v in losses],
            "did_not_learn": [False] * len(losses), "lr": trained}


def synthetic_report(path: Path) -> Path:
    """Two arms: ``a`` trained at the bowl's optimum, ``b`` at the grid's 1e-3 end, far from it, with one
    diverged lr."""
    arms = [{"name": n, "label": n.upper(), "recipe": "recipes/llama/tiny.yaml", "overrides": [], "own": [],
             "parent": None, "budget": {"tokens": 1e5}, "costs": {"flops_per_token": 1.0}} for n in SEEDED]
    runs = [{"arm": arm, "seed": s, "cell": {}, "status": "finished", "val_loss": v, "metric": "loss"}
            for arm, vals in SEEDED.items() for s, v in enumerate(vals)]
    rep = {"spec": {"name": "toy", "arms": [{"name": n} for n in SEEDED], "budget": {"tokens": 1e5},
                    "reference": "a", "out": "runs/toy", "seeds": [0, 1, 2]},
           "arms": arms, "runs": runs,
           "tuning": {"a": grid(OPT, [bowl(lr) for lr in GRID]),
                      "b": grid(1e-3, [bowl(lr) for lr in GRID[:-1]] + [None])}}
    path.write_text(json.dumps(rep))
    return path


def test_a_synthetic_report_recovers_the_optimum_and_flags_a_trained_lr_outside(tmp_path):
    res = lr_reread.reread(synthetic_report(tmp_path / "report.json"))
    assert res["experiment"] == "toy" and res["sd"] == pytest.approx(math.sqrt((0.02 ** 2 + 0.03 ** 2) / 2))
    a, b = res["arms"]["a"], res["arms"]["b"]
    assert a["fit"]["lr"] == pytest.approx(OPT, rel=1e-3) and b["fit"]["lr"] == pytest.approx(OPT, rel=1e-3)
    assert a["fit"]["low"] < OPT < a["fit"]["high"] and a["inside"] is True
    assert b["inside"] is False and b["cost_trained"] == pytest.approx(0.5 * math.log(1e-3 / OPT) ** 2, rel=1e-3)
    assert (a["points"], a["tried"], b["points"], b["tried"]) == (6, 6, 5, 6)
    assert a["fit"]["level"] == lr_choice.LEVEL
    md = lr_reread.markdown(res)
    assert "| `b` | 0.001 | 0.0055 |" in md and "**no**" in md and "5 of 6" in md
    assert "outside: toy `b`" in lr_reread.summary([res])


def test_a_committed_report_is_read_with_the_seed_sd_it_prints():
    path = ROOT / "docs/experiments/evolution/report.json"
    res = lr_reread.reread(path)
    printed = re.search(r"\(([0-9.]+) nats, the pooled sd of the seeded runs\)",
                        (path.parent / "report.md").read_text()).group(1)
    assert f"{res['sd']:.4f}" == printed
    rep = json.loads(path.read_text())
    assert list(res["arms"]) == list(rep["tuning"])
    for arm, r in res["arms"].items():
        assert r["trained_lr"] == rep["tuning"][arm]["lr"] and r["tried"] == len(rep["tuning"][arm]["lrs"])
        assert r["inside"] is not None and r["fit"]["low"] <= r["fit"]["high"]


def test_a_report_without_tuning_is_skipped_and_a_missing_file_named(capsys):
    assert lr_reread.reread(ROOT / "docs/experiments/norm-placement/report.json")["arms"] == {}
    with pytest.raises(SystemExit):
        lr_reread.main(["docs/experiments/nowhere/report.json"])
    assert "nowhere/report.json: no such report.json" in capsys.readouterr().err
