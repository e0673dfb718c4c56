"""``python -m tools.experiment run`` when the launcher refuses a point's submission (sbatch: no such
partition): one error line, exit 2, the point ``refused`` in its sweep's manifest.json, not ``pending``."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.tools.sweep.test_sweep_refusal import RefusingLauncher
from tools import launch
from tools.experiment.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_a_refused_submission_leaves_the_point_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(launch, "from_args", lambda args: RefusingLauncher())
    out = tmp_path / "exp"
    assert main(["run", str(ROOT / "experiments/norm-placement.yaml"), "--quick", "--out", str(out)]) == 2
    errors = re.findall(r"error: [^\r\n]*", capsys.readouterr().err)  # the progress bar may lead its line
    assert len(errors) == 1 and "invalid partition specified: nosuchpart" in errors[0], errors
    (manifest,) = out.rglob("manifest.json")
    points = json.loads(manifest.read_text())["points"]
    refused = [p for p in points if p["status"] == "refused"]
    assert len(refused) == 1 and f"manifest.json records {refused[0]['name']} as refused" in errors[0]
    assert not (manifest.parent / "slurm").exists()  # the submission script submitit wrote is gone
