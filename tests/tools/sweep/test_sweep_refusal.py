"""A sweep point whose submission the launcher refuses (sbatch: no such partition, more memory than a node):
one line on stderr, exit 2, the point ``refused`` in manifest.json (not ``pending``), nothing of the
submission left in the sweep folder. Against a fake launcher, and against the single-node SLURM that
.ci/slurm_up.sh starts (the fixture of tests/tools/test_tools_launch_slurm.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.tools.sweep.helpers import TINY
from tests.tools.test_tools_launch_slurm import slurm_cluster  # noqa: F401  (the fixture)
from tools import launch
from tools.sweep.cli import main


class RefusingLauncher:
    """Writes what submitit writes before sbatch answers (the pickled job, the submission script), then refuses."""

    name = "slurm"

    def start(self, p, cmd, env):
        folder = Path(p.run_dir).parent / "slurm"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / ".submission_file_0123.sh").write_text("#!/bin/bash\n")
        raise launch.LaunchError(f"sbatch refused the job of {p.name}: invalid partition specified: nosuchpart")


def _args(out) -> list[str]:
    return ["--recipes", "recipes/dense/tiny.yaml", "--tokens", "4096", "--out", str(out), "--set", *TINY,
            "--yes"]


def _check_refused(out, err: str, why: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: sbatch refused the job of ") and why in lines[0], err
    (point,) = json.loads((out / "manifest.json").read_text())["points"]
    assert point["status"] == "refused" and why in point["refused"]
    assert f"manifest.json records {point['name']} as refused" in lines[0]
    assert not (out / "slurm").exists() or not any((out / "slurm").rglob("*")), list((out / "slurm").rglob("*"))


def test_a_refused_submission_is_one_line_and_the_point_is_refused_in_the_manifest(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(launch, "from_args", lambda args: RefusingLauncher())
    out = tmp_path / "sweep"
    assert main(_args(out)) == 2
    _check_refused(out, capsys.readouterr().err, "invalid partition specified: nosuchpart")


@pytest.mark.slow
@pytest.mark.usefixtures("slurm_cluster")
@pytest.mark.parametrize("option, why", [(["--slurm-partition", "nosuchpart"], "invalid partition"),
                                         (["--slurm-mem", "100000"], "Memory specification can not be satisfied")])
def test_slurm_refusals_are_one_line_and_leave_the_point_refused(tmp_path, monkeypatch, capsys, option, why):
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    out = tmp_path / "sweep"
    assert main(_args(out) + ["--launcher", "slurm", *option]) == 2
    _check_refused(out, capsys.readouterr().err, why)
    assert not list(out.rglob("*.pkl"))
