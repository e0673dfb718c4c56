"""Real multi-process runs: ``accelerate launch`` with 2 processes over gloo (DDP and DeepSpeed
ZeRO-2), and a real signal sent to a training process."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import archlab
from archlab.data import TokenBatches, prepare_data
from archlab.train import checkpoint as ckpt
from archlab.train import train

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes/llama/tiny.yaml"


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def _launch(args: list[str], probe: Path, overrides: list[str], timeout: int = 240) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "accelerate.commands.launch", *args, str(ROOT / "tests/train/train_shard_probe.py"),
           str(probe), str(RECIPE), *overrides]
    p = subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=timeout)
    assert p.returncode == 0, p.stderr[-3000:]
    _check_clean_exit(probe)
    return p


def _check_clean_exit(probe: Path) -> None:
    """Both ranks reached the end of the probe's teardown with every group destroyed (the default
    one and DeepSpeed's)."""
    for rank in (0, 1):
        left = json.loads(Path(f"{probe}.exit-rank{rank}.json").read_text())
        assert left == {"initialized": False, "deepspeed_groups": 0}, f"rank {rank}: {left}"


def _losses(run_dir) -> list[float]:
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if r["kind"] == "train"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory, data_cache, tiny_overrides):
    """Overrides for a tiny run and the single-process reference: same global batch (grad_accum 2)."""
    out = tmp_path_factory.mktemp("dist-runs")
    base = [*tiny_overrides, f"data.cache_dir={data_cache}", f"train.out_dir={out}", "train.ckpt_every=4",
            "train.eval_context_multipliers=[1]"]
    ref = train(archlab.load_recipe(RECIPE, [*base, "train.grad_accum=2", "train.run_name=ref"]))
    return {"base": base, "out": out, "ref": _losses(ref["run_dir"]), "cfg": archlab.load_recipe(RECIPE, base)}


def _check_shards(probe: Path, cfg) -> None:
    """Two ranks read disjoint windows whose union is what one process with grad_accum 2 reads."""
    rec = json.loads(probe.read_text())
    assert rec["world_size"] == 2
    r0, r1 = (r["starts"] for r in sorted(rec["ranks"], key=lambda r: r["rank"]))
    single = TokenBatches(prepare_data(cfg).train, cfg.train.seq_len, cfg.train.micro_batch_size, 2, 0, 1,
                          cfg.train.seed)
    for step in range(3):
        a, b = set(r0[step]), set(r1[step])
        assert not a & b
        one_process = np.concatenate([single.starts(step, m) for m in range(2)])
        assert sorted(r0[step] + r1[step]) == sorted(one_process.tolist())


def test_ddp_two_processes_match_one_process(setup, tmp_path):
    probe = tmp_path / "probe.json"
    _launch(["--multi_gpu", "--num_processes", "2"], probe, [*setup["base"], "train.run_name=ddp"])
    _check_shards(probe, setup["cfg"])
    run = setup["out"] / "ddp"
    env = json.loads((run / "env.json").read_text())
    assert env["world_size"] == 2 and env["accelerate_distributed_type"].endswith("MULTI_CPU")
    np.testing.assert_allclose(_losses(run), setup["ref"], rtol=2e-5)
    assert ckpt.latest(run).name == "step_00000008"


def test_deepspeed_zero2_matches_and_resumes(setup, tmp_path):
    probe = tmp_path / "probe.json"
    args = ["--config_file", str(ROOT / "recipes/launch/zero2.yaml")]
    _launch(args, probe, [*setup["base"], "train.run_name=zero2"], timeout=400)
    _check_shards(probe, setup["cfg"])
    run = setup["out"] / "zero2"
    env = json.loads((run / "env.json").read_text())
    assert env["world_size"] == 2 and env["accelerate_distributed_type"].endswith("DEEPSPEED")
    assert env["deepspeed_config"]["train_batch_size"] == 8  # 4 per micro batch x 1 x 2 ranks
    full = _losses(run)
    np.testing.assert_allclose(full, setup["ref"], rtol=2e-5)
    # resume from the step-4 checkpoint (ZeRO optimizer shards loaded with weights_only=True)
    step4 = run / "checkpoints" / "step_00000004"
    _launch(args, tmp_path / "probe2.json", [*setup["base"], f"train.resume={step4}"], timeout=400)
    assert _losses(run) == full


def test_real_sigterm_then_resume(setup):
    out = setup["out"]
    overrides = [*setup["base"], "train.max_steps=40", "train.ckpt_every=100", "train.run_name=sig"]
    cmd = [sys.executable, "-m", "archlab.train", str(RECIPE), *overrides]
    proc = subprocess.Popen(cmd, env=_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = out / "sig" / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if metrics.is_file() and len(metrics.read_text().splitlines()) >= 2:
            proc.send_signal(signal.SIGTERM)
            break
        time.sleep(0.02)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    summary = json.loads((out / "sig" / "summary.json").read_text())
    assert summary["status"] == "interrupted" and 2 <= summary["step"] < 40, summary
    assert "SIGTERM received" in err
    stopped = ckpt.latest(out / "sig")
    assert ckpt.verify(stopped)["step"] == summary["step"]
    p = subprocess.run([*cmd, "train.resume=auto"], env=_env(), cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-2000:]
    done = json.loads((out / "sig" / "summary.json").read_text())
    assert done["status"] == "completed" and done["step"] == 40
    assert len(_losses(out / "sig")) == 40
