"""tools.sweep --launcher slurm against a real single-node SLURM (Debian's slurm-wlm and munge), started by
the test with .ci/slurm_up.sh (root; apt-get installs the packages when missing) and stopped at its end.
Where that cannot start, the test fails saying why (it is never skipped)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.tools.sweep.helpers import TINY
from tools.sweep.cli import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def slurm_cluster(tmp_path, monkeypatch):
    try:
        import submitit  # noqa: F401
    except ImportError:
        pytest.fail("submitit is not installed: pip install -e '.[slurm]'")
    folder = tmp_path / "cluster"
    up = subprocess.run(["bash", str(ROOT / ".ci" / "slurm_up.sh"), str(folder)], capture_output=True, text=True,
                        timeout=600)
    try:
        if up.returncode != 0:
            pytest.fail(f"no SLURM cluster for this test: {(up.stderr or up.stdout).strip().splitlines()[-1:]}")
        monkeypatch.setenv("SLURM_CONF", str(folder / "slurm.conf"))
        yield folder
    finally:
        subprocess.run(["bash", str(ROOT / ".ci" / "slurm_down.sh"), str(folder)], timeout=60)


@pytest.mark.slow
def test_a_sweep_on_slurm_completes_with_its_run_folder(slurm_cluster, tmp_path, capsys, monkeypatch):
    out = tmp_path / "sweep"
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    args = ["--recipes", "recipes/dense/tiny.yaml", "--tokens", "4096", "--out", str(out),
            "--set", *TINY, f"data.cache_dir={tmp_path / 'cache'}"]
    assert main(args + ["--yes", "--launcher", "slurm", "--slurm-cpus", "1", "--slurm-time", "10"]) == 0
    said = capsys.readouterr().out
    point = json.loads((out / "manifest.json").read_text())["points"][0]
    assert point["status"] == "finished" and point["job"]["launcher"] == "slurm", said
    assert f"SLURM job {point['job']['id']}" in said
    summary = json.loads((out / point["name"] / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["step"] == 16
    assert (out / "slurm" / point["job"]["id"]).is_dir()  # submitit's files of the job
    script = next((out / "slurm" / point["job"]["id"]).glob("*_submission.sh")).read_text()
    assert "#SBATCH --cpus-per-task=1" in script and "#SBATCH --time=10" in script
