"""tools.experiment status: each stage's runs counted by what their run folders say, failed ones named,
stages in training order, and an untouched folder said to be so."""

from __future__ import annotations

import json
from pathlib import Path

from archlab.train.run_folder import SUMMARY
from tools import experiment
from tools.experiment import status
from tools.sweep.manifest import MANIFEST


def write_stage(folder: Path, runs: dict[str, tuple[str, str]]) -> None:
    """A stage folder: a manifest whose points have ``(last launch status, run folder state)``."""
    folder.mkdir(parents=True)
    points = []
    for name, (last, state) in runs.items():
        run_dir = folder / name
        if state != "new":
            run_dir.mkdir()
        if state in ("completed", "nonfinite"):
            (run_dir / SUMMARY).write_text(json.dumps({"status": state}))
        points.append({"name": name, "run_dir": str(run_dir), "status": last, "job": {}})
    (folder / MANIFEST).write_text(json.dumps({"kind": "archlab-sweep", "version": 1, "points": points}))


def test_stages_in_training_order_with_counts_from_the_run_folders(tmp_path):
    write_stage(tmp_path / "ceg", {"ref-seed0-stable": ("pending", "new")})
    write_stage(tmp_path / "sweep", {"a-seed0": ("finished", "completed"), "b-seed0": ("failed", "started"),
                                     "c-seed0": ("running", "nonfinite")})
    write_stage(tmp_path / "tune", {"a-lr0.001": ("finished", "completed")})
    (tmp_path / "notes").mkdir()  # no manifest: not a stage
    assert [p.name for p in status.stage_folders(tmp_path)] == ["tune", "sweep", "ceg"]
    s = status.stage_status(tmp_path / "sweep")
    # the manifest said "running" for c: its run folder says it diverged, and that is what counts
    assert (s["points"], s["finished"], s["diverged"], s["started"], s["new"]) == (3, 1, 1, 1, 0)
    assert s["failed"] == ["b-seed0"]
    text = status.status_text(tmp_path, experiment.RECORD)
    assert text.splitlines()[1:4] == [
        "- tuning (tune/): 1 runs: 1 finished, 0 diverged, 0 to go (0 of them started)",
        "- seeded runs (sweep/): 3 runs: 1 finished, 1 diverged, 1 to go (1 of them started); failed at their "
        "last launch: b-seed0 (see sweep/logs/)",
        "- compute curve (ceg/): 1 runs: 0 finished, 0 diverged, 1 to go (0 of them started)",
    ]
    assert "not yet" in text.splitlines()[-1]


def test_status_of_an_untrained_experiment_trains_nothing(root, tmp_path, capsys):
    out = tmp_path / "runs"
    assert experiment.main(["status", str(root / "experiments/attention-kv.yaml"), "--out", str(out)]) == 0
    assert "nothing trained yet" in capsys.readouterr().out
    assert not out.exists()
