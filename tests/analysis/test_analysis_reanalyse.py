"""analysis.reanalyse on a committed report: the verdicts re-read from report.json alone agree with its
per-seed losses, intervals sit at the verdict's level, and the pointer under the report's title is put once."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from analysis import reanalyse

REPORT = Path(__file__).resolve().parents[2] / "docs/experiments/optimizers-and-objectives"


def test_reanalyse_a_committed_report(tmp_path):
    shutil.copy(REPORT / "report.json", tmp_path / "report.json")
    (tmp_path / "report.md").write_text("# title\n\nbody\n")
    data = reanalyse.reanalyse(tmp_path / "report.json")
    rep = json.loads((tmp_path / "report.json").read_text())
    by_arm = {c["arm"]: c for c in data["changes"]}
    assert set(by_arm) >= {"llama-muon", "mixtral-muon", "deepseek-mtp"}
    mtp = by_arm["deepseek-mtp"]  # 1.5x the compute per token: the verdict is on the paired loss difference
    assert mtp["scale"] == "nats" and mtp["against"] == "deepseek"
    seeds = {r["seed"]: r["val_loss"] for r in rep["runs"] if r["arm"] == "deepseek-mtp"}
    base = {r["seed"]: r["val_loss"] for r in rep["runs"] if r["arm"] == "deepseek"}
    assert mtp["estimate"] == pytest.approx(sum(seeds[s] - base[s] for s in seeds) / len(seeds))
    for c in data["changes"]:
        if c["class"] in ("unresolved", "equivalent within the margin"):  # the interval holds the null
            null = 1.0 if c["scale"] == "ln CEG" else 0.0
            assert c["low"] <= null <= c["high"], c
    assert (tmp_path / "reanalysis/verdicts.md").is_file() and (tmp_path / "reanalysis/compute_curve.png").is_file()
    reanalyse.reanalyse(tmp_path / "report.json")
    text = (tmp_path / "report.md").read_text()
    assert text.count(reanalyse.POINTER) == 1 and text.startswith("# title\n") and text.endswith("body\n")



def test_a_report_whose_seeded_runs_trained_at_the_fitted_lr_is_checked_at_that_lr(tmp_path):
    """attention-kv's record trains each arm at its fitted choice (``lr``), not the grid's best run (``grid_lr``)."""
    shutil.copy(REPORT.parent / "attention-kv/report.json", tmp_path / "report.json")
    (tmp_path / "report.md").write_text("# title\n")
    rep = json.loads((tmp_path / "report.json").read_text())
    data = reanalyse.reanalyse(tmp_path / "report.json")
    checks = data["lr"]
    assert any(t["grid_lr"] != t["lr"] for t in rep["tuning"].values())
    for arm, t in rep["tuning"].items():
        assert checks[arm]["trained_lr"] == t["lr"]
        assert checks[arm]["regret"] == pytest.approx(0.0, abs=1e-6)  # trained at the fitted minimum
    assert "trained at each arm's fitted choice" in (tmp_path / "reanalysis/verdicts.md").read_text()

def test_a_missing_report_is_named():
    with pytest.raises(SystemExit, match="no such report.json"):
        reanalyse.main(["docs/experiments/nowhere/report.json"])


def test_the_ceg_panel_draws_the_reference_line_inside_the_panel(tmp_path, monkeypatch):
    """The evolution report re-read: the dashed line at 1 lies well inside the CEG panel's x range."""
    from matplotlib.figure import Figure

    figures, original = [], Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: (figures.append(fig), original(fig, *a, **k))[1])
    evolution = REPORT.parent / "evolution"
    shutil.copy(evolution / "report.json", tmp_path / "report.json")
    (tmp_path / "report.md").write_text("# title\n")
    reanalyse.reanalyse(tmp_path / "report.json")
    panels = [ax for fig in figures for ax in fig.axes if ax.get_title().startswith("compute-equivalent gain")]
    assert len(panels) == 1
    lo, hi = panels[0].get_xlim()
    at = math.log(1.0 / lo) / math.log(hi / lo)  # where 1 lies across the log axis
    assert 0.05 < at < 0.95
    # no arm has a paired CEG there (the reference's seed 1 lies above its curve): a short mark per row, the reason
    # once below the panel
    fig = panels[0].figure
    marks = [t.get_text() for t in panels[0].texts]
    assert marks and all(m.strip() == "no CEG" for m in marks)
    (note,) = [t.get_text() for t in fig.texts]
    assert "lies outside the curve's measured range" in note.replace("\n", " ")

