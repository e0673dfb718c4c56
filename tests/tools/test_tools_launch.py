"""tools.launch: a run launched as a submitit job (its local executor) writes the run folder a local launch
writes, a job told to stop (USR2, as before a time limit) is requeued and resumes exactly, and the SLURM
options fail clearly."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.tools.sweep.helpers import TINY
from tools import launch
from tools.sweep.schedule import run_sweep


def _spec(tmp_path, out, tokens):
    return {"out": str(tmp_path / out), "tokens": [tokens], "set": TINY + [f"data.cache_dir={tmp_path / 'cache'}"],
            "ladders": {"d": {"recipe": "recipes/dense/tiny.yaml"}}}


def _rows(run_dir):
    return [(r["step"], r["loss"], r["lr"]) for r in map(json.loads, (Path(run_dir) / "metrics.jsonl").open())
            if r.get("kind", "train") == "train" and "loss" in r]


def _files(run_dir):
    return sorted(str(p.relative_to(run_dir)) for p in Path(run_dir).rglob("*") if p.is_file())


def _job_launcher():
    pytest.importorskip("submitit", reason="submitit not installed: pip install -e '.[slurm]'")
    from tools.launch.slurm import SlurmLauncher, SlurmOptions

    return SlurmLauncher(SlurmOptions(time_min=10), cluster="local")


def test_a_job_writes_the_run_folder_a_local_launch_writes(tmp_path):
    local = run_sweep(_spec(tmp_path, "local", 4096), threads=1, log=lambda *_: None)[0]
    job = run_sweep(_spec(tmp_path, "job", 4096), threads=1, log=lambda *_: None, via=_job_launcher())[0]
    assert local.status == job.status == "finished" and job.returncode == 0
    assert job.job["launcher"] == "slurm" and job.job["state"] == "COMPLETED" and job.peak_rss_bytes > 0
    assert _files(job.run_dir) == _files(local.run_dir)
    assert _rows(job.run_dir) == _rows(local.run_dir) and len(_rows(job.run_dir)) > 0
    a, b = (json.loads((Path(p.run_dir) / "summary.json").read_text()) for p in (local, job))
    assert (a["status"], a["step"], a["final_val_loss"]) == (b["status"], b["step"], b["final_val_loss"])
    manifest = json.loads((tmp_path / "job" / "manifest.json").read_text())
    assert manifest["points"][0]["job"]["id"] == job.job["id"]


def _signal_task_when_training(controller_pid: int, metrics: Path, out: list) -> None:
    """Send USR2 (SLURM's warning before a time limit) to the job's Python once the trainer logged step 20."""
    for _ in range(1200):
        time.sleep(0.1)
        if metrics.is_file() and any(json.loads(line).get("step", 0) >= 20 for line in metrics.open()):
            children = Path(f"/proc/{controller_pid}/task/{controller_pid}/children").read_text().split()
            os.kill(int(children[0]), signal.SIGUSR2)
            out.append(True)
            return


def test_a_job_stopped_before_its_time_limit_is_requeued_and_resumes_exactly(tmp_path, monkeypatch):
    if not sys.platform.startswith("linux"):
        pytest.fail("this test finds the job's process under /proc (Linux only)")
    via = _job_launcher()
    sent: list = []
    start = via.start

    def start_and_interrupt(p, cmd, env):
        run = start(p, cmd, env)
        threading.Thread(target=_signal_task_when_training, daemon=True,
                         args=(int(run.job["id"]), Path(p.run_dir) / "metrics.jsonl", sent)).start()
        return run

    monkeypatch.setattr(via, "start", start_and_interrupt)
    job = run_sweep(_spec(tmp_path, "job", 120_000), threads=1, log=lambda *_: None, via=via)[0]
    assert sent, "the trainer never logged step 20"
    log = Path(job.log).read_text()
    assert "saving a checkpoint" in log and "resuming from" in log, log[-2000:]
    assert job.status == "finished" and log.count("# SLURM job") == 2  # one job, two attempts
    local = run_sweep(_spec(tmp_path, "local", 120_000), threads=1, log=lambda *_: None)[0]
    assert _rows(job.run_dir) == _rows(local.run_dir)  # the resumed run repeats the uninterrupted one


def _args(**kw):
    base = {k: None for k in launch.SLURM_FLAGS}
    return argparse.Namespace(**{**base, "slurm_set": [], "launcher": "python", **kw})


def test_slurm_options_fail_clearly(monkeypatch):
    with pytest.raises(launch.LaunchError, match="--slurm-cpus: SLURM options need --launcher slurm"):
        launch.from_args(_args(slurm_cpus=2))
    assert isinstance(launch.from_args(_args()), launch.LocalLauncher)
    pytest.importorskip("submitit", reason="submitit not installed: pip install -e '.[slurm]'")
    with pytest.raises(launch.LaunchError, match="did you mean account"):
        launch.from_args(_args(launcher="slurm", slurm_set=["acount=x"]), cluster="local")
    with pytest.raises(launch.LaunchError, match="set it with --slurm-partition"):
        launch.from_args(_args(launcher="slurm", slurm_set=["partition=x"]), cluster="local")
    with pytest.raises(launch.LaunchError, match="--slurm-time 0: must be > 0"):
        launch.from_args(_args(launcher="slurm", slurm_time=0), cluster="local")
    monkeypatch.setitem(sys.modules, "submitit", None)  # as if not installed
    with pytest.raises(launch.LaunchError, match=r"needs submitit.*pip install -e '\.\[slurm\]'"):
        launch.from_args(_args(launcher="slurm"), cluster="local")
