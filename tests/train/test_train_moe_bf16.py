"""bf16 experts under the trainer's mixed precision: with ``train.precision=bf16`` the
weights stay fp32 and accelerate runs the forward under autocast, which lowers matmul-type ops
only; the routed experts must still receive bf16 rows and weights (so that on CUDA the bf16
grouped GEMM runs). Checked in the real trainer, in one process and under 2-process DDP; and
under DeepSpeed bf16 (ZeRO-0, 2 processes), where the weights themselves are bf16 and autocast
is off, that they still do.

This file is also the script the DDP test launches (``accelerate launch ... <this file>
<out.json> <recipe.yaml> [key=value ...]``): each rank trains with the experts' matmuls recorded
and writes what it saw to ``<out.json>.rank<r>``.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from accelerate.state import AcceleratorState
from torch.utils._python_dispatch import TorchDispatchMode

import archlab
from archlab.nn.moe.experts import GroupedExperts
from archlab.train import Trainer, train

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    """accelerate keeps one process-wide state: a trainer built earlier in this process (fp32, the suite's
    other in-process runs) fixes its mixed precision, and an Accelerator asking for bf16 is then refused."""
    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)

# mixtral/tiny cut down: 4 experts of width 32, dropless, 3 steps
MIXTRAL = ["model.moe.num_experts=4", "model.moe.expert_hidden=32", "train.max_steps=3", "train.ckpt_every=100",
           "train.eval_every=100", "train.eval_context_multipliers=[1]", "train.precision=bf16"]
MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.bmm.default, torch.ops.aten._grouped_mm.default}


class ExpertMatmuls(TorchDispatchMode):
    """Records (op, dtype of each operand) of the matmul-type aten ops run under it."""

    def __init__(self, seen: list):
        super().__init__()
        self.seen = seen

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in MATMULS:
            self.seen.append((func.overloadpacket.__name__, str(args[0].dtype), str(args[1].dtype)))
        return func(*args, **(kwargs or {}))


def record_experts(monkeypatch_setattr) -> dict:
    """Make every ``GroupedExperts.forward`` run under :class:`ExpertMatmuls` (only the experts:
    attention and the router have matmuls of their own). Fills ``matmuls``, and ``calls`` with
    (autocast on?, expert weights' dtype) per forward."""
    rec, forward = {"matmuls": [], "calls": []}, GroupedExperts.forward

    def recorded(self, x_ND, d):
        rec["calls"].append((torch.is_autocast_enabled(x_ND.device.type), str(self.w_up.dtype)))
        with ExpertMatmuls(rec["matmuls"]):
            return forward(self, x_ND, d)

    monkeypatch_setattr(GroupedExperts, "forward", recorded)
    return rec


def check_bf16(rec: dict, autocast: bool = True, weights: str = "torch.float32") -> None:
    """Mixed precision as the trainer sets it up (by default autocast on, fp32 weights), and bf16
    operands only."""
    assert rec["calls"] and all(tuple(c) == (autocast, weights) for c in rec["calls"]), rec["calls"]
    seen = [tuple(m) for m in rec["matmuls"]]
    assert seen, "the experts ran no matmul"
    assert {op for op, *_ in seen} <= {"_grouped_mm", "bmm"}
    assert all(a == b == "torch.bfloat16" for _, a, b in seen), sorted(set(seen))


def test_experts_get_bf16_under_trainer_mixed_precision(tiny_cfg, rows, monkeypatch):
    """One process, ``train.precision=bf16`` (fp32 weights, autocast). The CPU's choice between
    grouped_mm and a padded bmm is pinned to one thread's (grouped_mm, the path CUDA takes), where
    the experts used to receive fp32."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    rec = record_experts(monkeypatch.setattr)
    s = train(tiny_cfg(*MIXTRAL, recipe="mixtral/tiny"))
    check_bf16(rec)
    ops = [op for op, *_ in rec["matmuls"]]
    assert set(ops) == {"_grouped_mm"} and len(ops) >= 3 * 2 * 2  # steps x MoE layers x projections, + the eval
    assert all(r["loss"] == r["loss"] for r in rows(s["run_dir"]))  # finite (not NaN)


def free_port() -> int:
    """A port no one listens on now (not accelerate's default 29500, which a concurrent launch may hold)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


LAUNCHES = {  # launcher arguments, accelerate's distributed type, (autocast on, expert weights' dtype)
    "ddp": (["--multi_gpu", "--num_processes", "2"], "MULTI_CPU", (True, "torch.float32")),
    "zero0": (["--config_file", str(ROOT / "recipes/launch/zero0.yaml")], "DEEPSPEED", (False, "torch.bfloat16")),
}


@pytest.mark.slow
@pytest.mark.parametrize("launch", sorted(LAUNCHES))
def test_experts_get_bf16_under_two_processes(tmp_path, data_cache, tiny_overrides, launch):
    """Two processes on CPU, one thread each: DDP over gloo (``--multi_gpu``; fp32 weights under
    autocast) and DeepSpeed ZeRO-0 with bf16 (bf16 weights, no autocast): every rank's experts
    receive bf16."""
    args, distributed_type, (autocast, weights) = LAUNCHES[launch]
    out = tmp_path / "seen.json"
    overrides = [*tiny_overrides, *MIXTRAL, f"data.cache_dir={data_cache}", f"train.out_dir={tmp_path / 'runs'}",
                 f"train.run_name={launch}"]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", *args, "--main_process_port", str(free_port()), __file__,
           str(out), str(ROOT / "recipes/mixtral/tiny.yaml"), *overrides]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    for rank in (0, 1):
        rec = json.loads(Path(f"{out}.rank{rank}").read_text())
        assert rec["world_size"] == 2 and rec["distributed_type"].endswith(distributed_type)
        assert rec["mixed_precision"] == "bf16"
        check_bf16(rec, autocast, weights)


def main() -> int:
    """Under ``accelerate launch``: train with the experts' matmuls recorded, write them; the rank."""
    out, recipe, overrides = sys.argv[1], sys.argv[2], sys.argv[3:]
    rec = record_experts(setattr)
    trainer = Trainer(archlab.load_recipe(recipe, overrides))
    trainer.run()
    rec.update(world_size=trainer.info.world_size, distributed_type=str(trainer.accelerator.distributed_type),
               mixed_precision=trainer.accelerator.mixed_precision)
    Path(f"{out}.rank{trainer.info.rank}").write_text(json.dumps(rec))
    trainer.close()
    return trainer.info.rank


if __name__ == "__main__":
    from archlab.train.dist import exit_process, shutdown_distributed

    main()
    shutdown_distributed(synchronize=True)
    exit_process(0)
