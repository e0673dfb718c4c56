"""Resuming a checkpoint with another number of processes (CPU, gloo, 2 processes vs 1): DDP resumes it
(the same global batch continues the run's data, the losses agree with an uninterrupted run to rounding);
DeepSpeed ZeRO-2 and expert parallelism, whose optimizer files are per process, refuse it naming both sizes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import archlab
from archlab.train import checkpoint as ckpt
from archlab.train import train

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
LLAMA, MIXTRAL = ROOT / "recipes/llama/tiny.yaml", ROOT / "recipes/mixtral/tiny.yaml"
DDP = ["--multi_gpu", "--num_processes", "2"]
MOE = ["model.moe.num_experts=4", "model.moe.expert_hidden=32"]


def _run(launch: list[str], recipe: Path, overrides: list[str], ok: bool = True) -> subprocess.CompletedProcess:
    """``python -m archlab.train`` (``launch`` None: one plain process) or under ``accelerate launch``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    head = [sys.executable, "-m", "accelerate.commands.launch", *launch] if launch is not None else [sys.executable]
    p = subprocess.run([*head, "-m", "archlab.train", str(recipe), *overrides], capture_output=True, text=True,
                       env=env, cwd=ROOT, timeout=400)
    assert (p.returncode == 0) == ok, p.stderr[-3000:]
    return p


def _losses(run: Path) -> list[float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if r["kind"] == "train"]


@pytest.fixture(scope="module")
def base(tmp_path_factory, data_cache, tiny_overrides):
    out = tmp_path_factory.mktemp("world-size-runs")
    return out, [*tiny_overrides, f"data.cache_dir={data_cache}", f"train.out_dir={out}", "train.max_steps=4",
                 "train.ckpt_every=2", "train.eval_every=100", "train.eval_context_multipliers=[1]"]


def test_ddp_checkpoint_resumes_with_one_process_and_back(base):
    """2 processes (grad_accum 1) -> 1 process (grad_accum 2) from step 2, and 1 -> 2: each resumed run
    repeats the uninterrupted one's losses (to rounding: the same windows per step, summed in another
    order), the log says what happened to the data and the RNG."""
    out, common = base
    _run(DDP, LLAMA, [*common, "train.run_name=two"])
    full_two = _losses(out / "two")
    one = train(archlab.load_recipe(LLAMA, [*common, "train.grad_accum=2", "train.run_name=one"]))
    full_one = _losses(Path(one["run_dir"]))
    np.testing.assert_allclose(full_two, full_one, rtol=2e-5)

    p = _run(None, LLAMA, [*common, "train.grad_accum=2", f"train.resume={out / 'two/checkpoints/step_00000002'}"])
    assert "checkpoint was written by 2 processes, this run has 1: weights and optimizer state restored" in p.stderr
    assert "the global batch is unchanged (8 windows)" in p.stderr and "no RNG state" not in p.stderr
    resumed = _losses(out / "two")
    np.testing.assert_allclose(resumed, full_two, rtol=2e-5)
    assert ckpt.load_state(ckpt.latest(out / "two"))["world_size"] == 1  # steps 3-4 trained by one process

    p = _run(DDP, LLAMA, [*common, f"train.resume={Path(one['run_dir']) / 'checkpoints/step_00000002'}"])
    assert "checkpoint was written by 1 process, this run has 2" in p.stderr
    assert "rank 1: no RNG state in the checkpoint" in p.stderr
    np.testing.assert_allclose(_losses(Path(one["run_dir"])), full_one, rtol=2e-5)


def test_zero2_checkpoint_is_refused_by_one_process(base):
    """ZeRO-2's optimizer state is partitioned over the 2 processes: 1 process refuses it before
    the engine is built, naming both sizes and the launch that wrote it."""
    out, common = base
    zero2 = ["--config_file", str(ROOT / "recipes/launch/zero2.yaml")]
    _run(zero2, LLAMA, [*common, "train.run_name=zero2"])
    step2 = out / "zero2/checkpoints/step_00000002"
    p = _run([*zero2, "--num_processes", "1"], LLAMA, [*common, "train.grad_accum=2", f"train.resume={step2}"],
             ok=False)
    assert (f"error: {step2}: checkpoint was written by 2 processes (DeepSpeed ZeRO-2), this run has 1: DeepSpeed "
            "keeps one optimizer file per process") in p.stderr, p.stderr[-3000:]
    assert "resume with 2 processes (accelerate launch --num_processes 2)" in p.stderr
    assert ckpt.latest(out / "zero2").name == "step_00000004"  # nothing written


def test_expert_parallel_checkpoint_with_one_process(base):
    """model.moe.ep_size=2 (ZeRO-0, 2 processes) -> 1 process: at ep_size=2 refused (it needs 2
    processes); at ep_size=1 the consolidated weights load and the optimizer state restarts, as the log
    says (each process's optimizer file holds its own experts)."""
    out, common = base
    moe = [*common, *MOE]
    _run(["--config_file", str(ROOT / "recipes/launch/zero0.yaml")], MIXTRAL,
         [*moe, "model.moe.ep_size=2", "train.run_name=ep2"])
    step2 = out / "ep2/checkpoints/step_00000002"
    p = _run(None, MIXTRAL, [*moe, "model.moe.ep_size=2", "train.grad_accum=2", f"train.resume={step2}"], ok=False)
    assert "model.moe.ep_size=2: expert parallelism runs under DeepSpeed" in p.stderr, p.stderr[-3000:]
    p = _run(None, MIXTRAL, [*moe, "train.grad_accum=2", f"train.resume={step2}"])
    assert ("checkpoint was written at model.moe.ep_size=2, this run uses 1: weights loaded, the optimizer state "
            "(AdamW moments) restarts from zero") in p.stderr
    assert "checkpoint was written by 2 processes, this run has 1: weights restored (the optimizer state restarts" \
        in p.stderr
    assert len(_losses(out / "ep2")) == 4
