"""tools.launch multi-node: one SLURM job whose tasks each start ``accelerate launch`` as one machine of the run.

The slow test runs on the single-node SLURM of .ci/slurm_up.sh: ONE job of 2 tasks standing in for 2 machines,
1 process each on gloo, a Mixtral recipe with expert parallelism (ep_size=2, DeepSpeed stage 0) across them.
Its losses equal the single-process run's at the same global batch; ``scancel`` and the same command again
continue it from its checkpoint; a job sbatch refuses is one line, exit 2. The others check the options."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import archlab
from archlab.train import train
from tests.tools.sweep.helpers import TINY as SWEEP_TINY
from tests.tools.test_tools_launch_slurm import slurm_cluster  # noqa: F401 - the cluster fixture
from tests.train.conftest import TINY
from tools import launch
from tools.launch import multinode
from tools.launch.slurm import SlurmLauncher, SlurmOptions

ROOT = Path(__file__).resolve().parents[2]
MIXTRAL = ["model.moe.num_experts=4", "model.moe.expert_hidden=32", "train.max_steps=30", "train.ckpt_every=5",
           "train.eval_every=30", "train.run_name=ep2"]
LAUNCH = ["--launcher", "slurm", "--nodes", "1", "--slurm-set", "ntasks_per_node=2", "--slurm-cpus", "1",
          "--slurm-time", "10", "--accelerate-config", "recipes/launch/zero0.yaml"]


def _rows(run_dir: Path) -> list[dict]:
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").open()) if r.get("kind", "train") == "train"]


def _launch(args: list[str], timeout: int = 420) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tools.launch", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout)


@pytest.mark.slow
def test_one_job_of_two_tasks_trains_expert_parallel_and_resumes_after_scancel(slurm_cluster, tmp_path,  # noqa: F811
                                                                                 monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    common = [*TINY, *MIXTRAL, f"data.cache_dir={tmp_path / 'cache'}"]
    ref = train(archlab.load_recipe(ROOT / "recipes/mixtral/tiny.yaml",  # one process, the same global batch
                                    [*common, "train.grad_accum=2", f"train.out_dir={tmp_path / 'ref'}"]))
    out = tmp_path / "runs"
    cmd = ["recipes/mixtral/tiny.yaml", *common, f"train.out_dir={out}", "model.moe.ep_size=2", *LAUNCH]

    # a partition the cluster lacks: sbatch refuses, one line, exit 2
    refused = _launch([*cmd, "--slurm-partition", "no-such-partition"], timeout=60)
    assert refused.returncode == 2 and refused.stderr.startswith("error: sbatch refused the job of ep2: ")
    assert "no-such-partition" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert not list((out / "slurm").glob("*.pkl"))  # nor is the refused job's pickle left behind

    first = _launch([*cmd, "--detach"], timeout=60)
    assert first.returncode == 0, first.stderr
    job = json.loads((out / "slurm" / "ep2.job.json").read_text())["id"]
    run = out / "ep2"
    for _ in range(6000):  # stop it once the step-5 checkpoint is written and training went on
        if (run / "metrics.jsonl").is_file() and any(r["step"] > 6 for r in _rows(run)):
            break
        time.sleep(0.05)
    subprocess.run(["scancel", job], check=True)
    assert max(r["step"] for r in _rows(run)) < 30, "the run ended before scancel: make it longer"
    for _ in range(300):
        state = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
        if "JobState=CANCELLED" in state:
            break
        time.sleep(0.2)
    assert "JobState=CANCELLED" in state, state

    again = _launch(cmd)  # the same command: a new job, which continues from the newest checkpoint
    assert again.returncode == 0, again.stderr + again.stdout
    log, log1 = (out / "logs" / "ep2.log").read_text(), (out / "logs" / "ep2.task1.log").read_text()
    second = json.loads((out / "slurm" / "ep2.job.json").read_text())["id"]
    assert second != job and f"# SLURM job {job} on" in log and f"# SLURM job {second} on" in log
    assert log.count("# machine 0 of 2, main process") == 2 and log1.count("# machine 1 of 2, main process") == 2
    assert "--num_machines 2 --machine_rank 1" in log1 and "--num_processes 2" in log1
    assert "resuming from" in log, log[-3000:]
    env = json.loads((run / "env.json").read_text())
    assert env["world_size"] == 2 and env["backend"] == "expert-zero0"  # 2 ranks, experts sharded over them
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"
    rows, ref_rows = _rows(run), _rows(Path(ref["run_dir"]))
    assert [r["step"] for r in rows] == list(range(1, 31))
    np.testing.assert_allclose([r["loss"] for r in rows], [r["loss"] for r in ref_rows], rtol=0, atol=1e-5)


def _args(**kw) -> argparse.Namespace:
    base = {k: None for k in launch.SLURM_FLAGS}
    return argparse.Namespace(**{**base, "slurm_set": [], "launcher": "slurm", **kw})


def test_multinode_options_fail_clearly(tmp_path):
    pytest.importorskip("submitit", reason="submitit not installed: pip install -e '.[slurm]'")
    with pytest.raises(launch.LaunchError, match="--nodes: SLURM options need --launcher slurm"):
        launch.from_args(_args(launcher="python", nodes=2))
    for kw, said in ((dict(nodes=0), "--nodes 0: must be > 0"),
                     (dict(nodes=2, gpus_per_node=-1), "--gpus-per-node -1: must be >= 0"),
                     (dict(nodes=2, gpus_per_node=8, slurm_gpus=8), "--slurm-gpus 8 and --gpus-per-node 8: give one"),
                     (dict(accelerate_config="recipes/launch/zero0.yaml"), "needs --nodes"),
                     (dict(nodes=2, accelerate_config=str(tmp_path / "no.yaml")), "no.yaml: file not found"),
                     (dict(slurm_set=["ntasks_per_node=2"]), "several tasks need --nodes"),
                     (dict(nodes=2, gpus_per_node=8, slurm_set=["ntasks_per_node=2"]), "each node runs one task"),
                     (dict(nodes=2, slurm_set=["nodes=3"]), "set it with --nodes")):
        with pytest.raises(launch.LaunchError, match=said):
            launch.from_args(_args(**kw), cluster="local")


def test_job_shape_and_each_machines_accelerate_command():
    o = SlurmOptions(nodes=2, gpus_per_node=8)
    assert (o.machines, o.world_size) == (2, 16)
    params = o.parameters("run")
    assert (params["nodes"], params["tasks_per_node"], params["gpus_per_node"]) == (2, 1, 8)
    assert SlurmOptions(nodes=1, extra={"ntasks_per_node": 2}).world_size == 2
    assert SlurmOptions(gpus=4).world_size == 1 and "nodes" not in SlurmOptions(gpus=4).parameters("run")
    cmd = multinode.accelerate_command([sys.executable, "-m", "archlab.train", "r.yaml", "a=1"],
                                       multinode.Rendezvous(machines=2, rank=1, host="node01", port=20007), 8,
                                       "recipes/launch/multinode-8gpu.yaml")
    assert cmd[3:] == ["--config_file", "recipes/launch/multinode-8gpu.yaml", "--num_machines", "2", "--machine_rank",
                       "1", "--main_process_ip", "node01", "--main_process_port", "20007", "--num_processes", "16",
                       "--rdzv_backend", "static", "--same_network", "--deepspeed_multinode_launcher", "standard",
                       "-m", "archlab.train", "r.yaml", "a=1"]
    with pytest.raises(launch.LaunchError, match="SLURM_JOB_ID, SLURM_NTASKS, SLURM_PROCID, SLURM_JOB_NODELIST "
                                                 "not set"):
        multinode.rendezvous({})
    assert multinode.port_of("123") == multinode.port_of("123") != multinode.port_of("124")


def test_every_machines_processes_count_in_a_sweeps_and_an_experiments_steps(tmp_path, capsys):
    import re

    from tools.experiment.cli import main as experiment
    from tools.sweep.cli import main as sweep

    base = ["--recipes", "recipes/dense/tiny.yaml", "--tokens", "8192", "--set", *SWEEP_TINY, "--out",
            str(tmp_path / "sw"), "--dry-run"]
    assert sweep(base) == 0
    assert "train.max_steps=32" in capsys.readouterr().out  # 8192 tokens / 256 per step
    assert sweep([*base, "--launcher", "slurm", "--nodes", "2", "--gpus-per-node", "8"]) == 0
    assert "train.max_steps=2" in capsys.readouterr().out  # 16 processes: 4096 tokens per step

    plan = ["plan", "experiments/balancing.yaml", "--quick", "--out", str(tmp_path / "x")]
    assert experiment(plan) == 0
    one = {int(m) for m in re.findall(r"train\.max_steps=(\d+) \S+ train\.run_name=mixtral-\w+-seed0-tok",
                                      capsys.readouterr().out)}
    with launch.use(SlurmLauncher(SlurmOptions(nodes=1, extra={"ntasks_per_node": 2}))):  # 2 machines
        assert experiment(plan) == 0
    two = {int(m) for m in re.findall(r"train\.max_steps=(\d+) \S+ train\.run_name=mixtral-\w+-seed0-tok",
                                      capsys.readouterr().out)}
    assert one and two == {s // 2 for s in one}  # each step holds both machines' tokens
