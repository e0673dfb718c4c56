"""Real multi-process runs: ``accelerate launch`` with 2 processes over gloo (DDP, DeepSpeed ZeRO-2
and ZeRO-3), and a real signal sent to a training process."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import archlab
from archlab.data import TokenBatches, prepare_data
from archlab.train import checkpoint as ckpt
from archlab.train import train
from archlab.train.parallel import _deepspeed_safe_globals

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes/llama/tiny.yaml"


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def _launch(args: list[str], probe: Path, overrides: list[str], timeout: int = 240,
            recipe: Path = RECIPE) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "accelerate.commands.launch", *args, str(ROOT / "tests/train/train_shard_probe.py"),
           str(probe), str(recipe), *overrides]
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


def _losses(run_dir, kind: str = "train") -> list[float]:
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if r["kind"] == kind]


def _launch_refused(args: list[str], recipe: Path, overrides: list[str]) -> str:
    """``accelerate launch ... -m archlab.train`` that must be refused: the stderr of the launch. The
    launcher itself exits 1 whenever a rank fails; the ranks' own exit statuses are in its report
    (the rank that fails second may be stopped by the launcher first, SIGTERM: -15)."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch", *args, "-m", "archlab.train", str(recipe), *overrides]
    p = subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=240)
    statuses = [int(s) for s in re.findall(r"exitcode\s*:\s*(-?\d+)", p.stderr)]
    assert p.returncode != 0 and 2 in statuses and set(statuses) <= {2, -15}, p.stderr[-3000:]
    return p.stderr


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


def test_ddp_muon_two_processes_match_one_process(setup, tmp_path):
    """train.optimizer=muon under DDP: every rank runs torch.optim.Muon's step on the averaged gradient,
    so 2 processes give the losses of 1 process at the same global batch (equal here; the tolerance
    allows for the bf16 Newton-Schulz's sensitivity to the gradient's summation order)."""
    muon = ["train.optimizer=muon", "train.lr=0.01"]
    ref = train(archlab.load_recipe(RECIPE, [*setup["base"], *muon, "train.grad_accum=2", "train.run_name=muon-ref"]))
    _launch(["--multi_gpu", "--num_processes", "2"], tmp_path / "probe.json",
            [*setup["base"], *muon, "train.run_name=muon-ddp"])
    run = setup["out"] / "muon-ddp"
    assert ckpt.load_state(ckpt.latest(run))["optimizer"] == "muon"
    one, two = _losses(ref["run_dir"]), _losses(run)
    assert one != setup["ref"]  # Muon, not AdamW
    np.testing.assert_allclose(two, one, rtol=1e-4)


@pytest.mark.parametrize("family, launch", [("bert", "ddp"), ("t5", "ddp"), ("t5", "zero2")])
def test_encoder_and_encoder_decoder_under_ddp_and_zero2_match_one_process(setup, tmp_path, family, launch):
    """BERT (masked LM) and T5 (span corruption) under 2 processes: the 1-process losses at the same global
    batch (each rank draws its own micro batch's masks or spans by its index in the step)."""
    args = (["--multi_gpu", "--num_processes", "2"] if launch == "ddp"
            else ["--config_file", str(ROOT / "recipes/launch/zero2.yaml")])
    recipe = ROOT / f"recipes/{family}/tiny.yaml"
    ref = train(archlab.load_recipe(recipe, [*setup["base"], "train.grad_accum=2",
                                             f"train.run_name={family}-{launch}-ref"]))
    _launch(args, tmp_path / "probe.json", [*setup["base"], f"train.run_name={family}-{launch}"], timeout=400,
            recipe=recipe)
    np.testing.assert_allclose(_losses(setup["out"] / f"{family}-{launch}"), _losses(ref["run_dir"]), rtol=2e-5)


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


def test_deepspeed_zero3_matches_resumes_and_consolidates(setup, tmp_path):
    """ZeRO-3 (parameters partitioned too): the 1-process losses at the same global batch, an exact
    resume, and a consolidated model.safetensors that gives the engine's logits in one process."""
    probe = tmp_path / "probe.json"
    args = ["--config_file", str(ROOT / "recipes/launch/zero3.yaml")]
    _launch(args, probe, [*setup["base"], "train.run_name=zero3"], timeout=400)
    _check_shards(probe, setup["cfg"])
    run, ref = setup["out"] / "zero3", setup["out"] / "ref"
    env = json.loads((run / "env.json").read_text())
    assert env["world_size"] == 2 and env["accelerate_distributed_type"].endswith("DEEPSPEED")
    zero = env["deepspeed_config"]["zero_optimization"]
    assert zero["stage"] == 3 and zero["stage3_param_persistence_threshold"] == 10 * 32  # "auto": 10 * d_model
    full = _losses(run)
    np.testing.assert_allclose(full, setup["ref"], rtol=2e-5)
    np.testing.assert_allclose(_losses(run, "val"), _losses(ref, "val"), rtol=2e-5)  # eval through the engine
    # really partitioned: the engine's module state holds no weights, each rank's fp32 partition about half
    step4 = run / "checkpoints" / "step_00000004"
    assert ckpt.load_state(step4)["zero_stage"] == 3
    n = archlab.num_params(setup["cfg"])
    parts = []
    for rank in (0, 1):
        states = step4 / "zero" / "state" / f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt"
        assert all(t.numel() == 0 for t in torch.load(states, weights_only=True)["module"].values())
        with torch.serialization.safe_globals(_deepspeed_safe_globals()):
            optim = torch.load(states.with_name(states.name.replace("model", "optim")), weights_only=True)
        parts.append(sum(t.numel() for t in optim["optimizer_state_dict"]["fp32_flat_groups"]))
    assert sum(parts) >= n and max(parts) < 0.6 * n, (parts, n)
    # the consolidated weights, loaded in this process: the engine's logits, and the 1-process run's
    model, _ = ckpt.load_model(run)
    ref_model, _ = ckpt.load_model(ref)
    engine = torch.load(f"{probe}.logits.pt", weights_only=True)
    with torch.no_grad():
        logits = model(engine["input_ids"]).logits
        torch.testing.assert_close(logits, engine["logits"], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(logits, ref_model(engine["input_ids"]).logits, rtol=1e-4, atol=1e-5)
    # resumed at ZeRO-3 from the step-4 checkpoint (optimizer partitions loaded with weights_only=True)
    _launch(args, tmp_path / "probe2.json", [*setup["base"], f"train.resume={step4}"], timeout=400)
    assert _losses(run) == full
    # at ZeRO-2 the same checkpoint is refused, naming both stages
    err = _launch_refused(["--config_file", str(ROOT / "recipes/launch/zero2.yaml")], RECIPE,
                          [*setup["base"], f"train.resume={step4}"])
    assert "written at DeepSpeed ZeRO stage 3, this launch uses stage 2" in err, err[-3000:]


def test_moe_under_zero3_refused(setup):
    """MoE (here with expert parallelism) at ZeRO-3: exit status 2 with the reason and what to use
    instead, before anything is built (no run folder, no data cache)."""
    cache = setup["out"] / "moe3-cache"
    overrides = [*setup["base"], f"data.cache_dir={cache}", "train.run_name=moe3", "model.moe.ep_size=2"]
    err = _launch_refused(["--config_file", str(ROOT / "recipes/launch/zero3.yaml")],
                          ROOT / "recipes/mixtral/tiny.yaml", overrides)
    assert "error: model.moe (with model.moe.ep_size=2) under DeepSpeed ZeRO stage 3" in err, err[-3000:]
    assert "recipes/launch/zero2.yaml" in err
    assert not (setup["out"] / "moe3").exists() and not cache.exists()


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


def test_trackers_log_on_the_main_process_only(tmp_path, data_cache, tiny_overrides):
    """train.trackers under 2 processes: one TensorBoard writer (rank 0's: accelerate starts and
    feeds trackers on the main process only) holding every train row; both ranks exit cleanly."""
    pytest.importorskip("tensorboard", reason="TensorBoard not installed (pip install tensorboard)")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    overrides = [*tiny_overrides, f"data.cache_dir={data_cache}", f"train.out_dir={tmp_path}", "train.run_name=tb",
                 "train.eval_context_multipliers=[1]", "train.trackers=[tensorboard]"]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "-m", "archlab.train", str(RECIPE), *overrides]
    p = subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    logdir = tmp_path / "tb" / "tb" / "archlab"
    assert len(list(logdir.glob("events.out.tfevents.*"))) == 1, sorted(logdir.rglob("*"))
    events = EventAccumulator(str(logdir))
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == list(range(1, 9))
    assert len(_losses(tmp_path / "tb")) == 8
