"""The plan's per-GPU peak against torch's own accounting: one training step (forward with the trainer's fused
loss, backward, AdamW step) of the real archlab model in FakeTensorMode, its memory tracked by torch's
MemTracker, under each precision regime; DDP's gradient buckets under a fake process group; the launch
configs; bad input refused.

    python tests/costs/test_costs_plan.py   # the plan-vs-torch table of every case below
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker
from torch.nn.parallel import DistributedDataParallel
from torch.testing._internal.distributed.fake_pg import FakeStore

import archlab
from archlab.costs.measure import real_routed_rows, training_loss
from archlab.costs.plan import Launch, memory_plan, read_launch, training_plan
from archlab.optim.adamw import AdamWOptimizer, adamw_kernel

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = 0.10
# 125M: GPT-3 Small (recipes/dense/125m.yaml) and an MoE at its width on recipes/mixtral/s.yaml (8 experts of 1024,
# top-2); 350M and 1B: the recipes as users run them (GPT-3 Medium, Mixtral-style 350m, TinyLlama-shaped 1B and
# its Mixtral-style peer), with their micro-batches and gradient accumulation
CASES = {
    "125m-dense": ("recipes/dense/125m.yaml", []),
    "125m-moe": ("recipes/mixtral/s.yaml", ["model.vocab_size=32000", "model.max_seq_len=2048", "train.seq_len=2048",
                                            "train.micro_batch_size=8", "model.d_model=768", "model.n_layers=12",
                                            "model.n_heads=12", "model.n_kv_heads=4", "model.moe.expert_hidden=1024"]),
    "350m-dense": ("recipes/dense/350m.yaml", []),
    "350m-moe": ("recipes/mixtral/350m.yaml", []),
    "1b-dense": ("recipes/llama/1b.yaml", []),
    "1b-moe": ("recipes/mixtral/1b.yaml", []),
    # OLMoE-1B-7B's shape (16 layers, d 2048, 64 experts of 1024, top-8): the experts' gradients outweigh a
    # block's activations, so the peak falls inside backward
    "1b-7b-moe": ("recipes/mixtral/s.yaml", ["model.vocab_size=32000", "model.max_seq_len=2048", "train.seq_len=2048",
                                             "train.micro_batch_size=4", "model.d_model=2048", "model.n_layers=16",
                                             "model.n_heads=16", "model.n_kv_heads=16", "model.moe.num_experts=64",
                                             "model.moe.top_k=8", "model.moe.expert_hidden=1024"]),
}
REGIMES = {"autocast": Launch(), "deepspeed bf16": Launch(backend="deepspeed")}


def _recipe(case: str, *extra: str):
    path, overrides = CASES[case]
    return archlab.load_recipe(ROOT / path, [*overrides, *extra])


def measured_peak(recipe, regime: str = "autocast", checkpointing: str = "none") -> int:
    """Peak bytes MemTracker sees over one training step in FakeTensorMode (fake CPU tensors), AdamW's
    state already there (a step after the first); two micro-batches when the recipe accumulates gradients.
    ``autocast``: fp32 model under torch.autocast(bf16), the trainer's AdamW; ``deepspeed bf16``: the model cast
    to bf16 as DeepSpeed's engine does, AdamW on fp32 master copies, the gradients converted to fp32 for its step."""
    cfg = archlab.model_config(recipe)
    B, S = recipe.train.micro_batch_size, recipe.train.seq_len
    with FakeTensorMode():
        if regime == "deepspeed bf16":
            torch.set_default_dtype(torch.bfloat16)  # a fake module cannot be cast in place (.to swaps tensors)
        try:
            model = archlab.build_model(cfg, device="cpu")
        finally:
            torch.set_default_dtype(torch.float32)
        model.checkpointing = checkpointing
        params = list(model.parameters())
        master = [p.detach().float() for p in params] if regime == "deepspeed bf16" else []
        spec = AdamWOptimizer(recipe.train)
        if master:  # the trainer's AdamW (its groups, its CPU kernel) over the fp32 copies
            index = {id(p): m for p, m in zip(params, master)}
            groups = [{**g, "params": [index[id(p)] for p in g["params"]]} for g in spec.param_groups(model)]
            opt = torch.optim.AdamW(groups, lr=1e-4, **adamw_kernel(cuda=False))
        else:
            opt = spec.build(model)
        for p in master or params:  # AdamW's m, v exist from the first step on
            p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad()
        x = torch.randint(0, cfg.vocab_size, (B, S + 1))
        tracker = MemTracker()
        tracker.track_external(model, opt, x, *master)
        with tracker, real_routed_rows(model):  # MoE: the grouped GEMM on the routed rows, as on a GPU
            for _ in range(min(recipe.train.grad_accum, 2)):  # accumulation: the gradients live through the next
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=regime == "autocast"):
                    loss = training_loss(model, x)
                loss.backward()
                tracker.reset_mod_stats()  # per-module stats only (one forward each); the peak is kept
            for m, p in zip(master, params):  # the bf16 gradients stay until the step is done
                m.grad = p.grad.float()
            opt.step()
            for m, p in zip(master, params):
                p.data.copy_(m)
                p.grad = None
            opt.zero_grad()
            peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    return int(peak)


def planned_peak(recipe, regime: str = "autocast", checkpointing: str = "none") -> float:
    return memory_plan(recipe, REGIMES[regime], precision="bf16", checkpointing=checkpointing, device="cpu").peak


def _check(case: str, regime: str, checkpointing: str = "none") -> None:
    recipe = _recipe(case)
    plan, measured = planned_peak(recipe, regime, checkpointing), measured_peak(recipe, regime, checkpointing)
    assert plan == pytest.approx(measured, rel=TOLERANCE), (case, regime, checkpointing, plan / measured)


@pytest.mark.parametrize("case, regime", [("125m-dense", "autocast"), ("125m-dense", "deepspeed bf16"),
                                           ("125m-moe", "autocast"),
                                           pytest.param("125m-moe", "deepspeed bf16", marks=pytest.mark.slow)])
def test_plan_peak_within_10_percent_of_torch_at_125m(case, regime):
    _check(case, regime)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["full", "selective"])
def test_plan_peak_with_activation_checkpointing(mode):
    _check("125m-dense", "autocast", mode)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["350m-dense", "350m-moe", "1b-dense", "1b-moe", "1b-7b-moe"])
def test_plan_peak_within_10_percent_of_torch_at_350m_and_1b(case):
    _check(case, "autocast")


@pytest.mark.slow
def test_plan_peak_deepspeed_regime_at_1b_moe():
    _check("1b-7b-moe", "deepspeed bf16")


def test_ddp_gradient_buckets_are_what_torch_allocates():
    """DDP over a fake process group of 8: the buffers its reducer allocates are the plan's grad_buckets."""
    recipe = archlab.load_recipe(ROOT / "recipes/llama/tiny.yaml")
    model = archlab.build_model(archlab.model_config(recipe))
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    try:
        tracker = MemTracker()
        tracker.track_external(model)
        with tracker:
            before = tracker.get_tracker_snapshot("current")[torch.device("cpu")]["Total"]
            ddp = DistributedDataParallel(model)
            after = tracker.get_tracker_snapshot("current")[torch.device("cpu")]["Total"]
        del ddp
    finally:
        dist.destroy_process_group()
    plan = memory_plan(recipe, Launch(world=8), precision="bf16", device="cpu")
    assert after - before == plan.grad_buckets > 0
    assert memory_plan(recipe, Launch(world=1), precision="bf16", device="cpu").grad_buckets == 0


def test_regimes_bytes_per_parameter():
    """autocast: fp32 weights + fp32 grads + fp32 m, v (16 bytes); DeepSpeed bf16: 2 + 2 + 12; ZeRO shards."""
    recipe = _recipe("125m-dense")
    n = sum(p.numel() for p in archlab.build_model(archlab.model_config(recipe), device="meta").parameters())
    auto = memory_plan(recipe, Launch(), precision="bf16")
    assert (auto.weights, auto.grads, auto.optimizer) == (4 * n, 4 * n, 8 * n)
    assert auto.weight_copies > 0 and auto.regime == "autocast"
    ds = memory_plan(recipe, Launch(backend="deepspeed"), precision="bf16")
    assert (ds.weights, ds.grads, ds.optimizer, ds.weight_copies) == (2 * n, 2 * n, 12 * n, 0)
    z2 = memory_plan(recipe, Launch(world=8, backend="deepspeed", zero_stage=2), precision="bf16")
    assert (z2.weights, z2.grads, z2.optimizer) == (2 * n, 2 * n / 8, 12 * n / 8)
    z3 = memory_plan(recipe, Launch(world=8, backend="deepspeed", zero_stage=3), precision="bf16")
    assert z3.weights == 2 * n / 8 and z3.peak < z2.peak < ds.peak
    assert memory_plan(recipe, Launch(), precision="bf16", checkpointing="full").activations < auto.activations
    accum = memory_plan(recipe, Launch(), precision="bf16", grad_accum=2)
    assert accum.peak == pytest.approx(auto.peak + auto.grads)  # the gradients live through the next micro-batch
    assert auto.backward > auto.weight_copies + auto.activations  # + one block's backward working set


def test_read_launch_from_accelerate_and_deepspeed_configs():
    assert read_launch() == Launch(world=1, source="no launch config")
    assert read_launch(None, gpus=4).world == 4 and read_launch(None, gpus=4).backend == "plain"
    ddp = read_launch(ROOT / "recipes/launch/ddp.yaml")
    assert (ddp.world, ddp.backend, ddp.zero_stage) == (2, "plain", 0)
    for stage in range(4):
        launch = read_launch(ROOT / f"recipes/launch/zero{stage}.yaml", gpus=8)
        assert (launch.world, launch.backend, launch.zero_stage) == (8, "deepspeed", stage)
        assert read_launch(ROOT / f"recipes/launch/zero{stage}.json").zero_stage == stage


def test_throughput_and_hours_follow_mfu_and_peak_flops():
    recipe = _recipe("125m-dense")
    plan = training_plan(recipe, Launch(world=8), gpu="h100", mfu=0.4)
    t = recipe.train
    assert plan.tokens == t.max_steps * t.micro_batch_size * t.grad_accum * 8 * t.seq_len
    assert plan.tokens_per_s == pytest.approx(8 * 0.4 * 989e12 / plan.flops_per_token)
    assert plan.hours == pytest.approx(plan.tokens / plan.tokens_per_s / 3600)
    assert plan.gpu_hours == pytest.approx(8 * plan.hours) and plan.fits
    a100 = training_plan(recipe, Launch(world=8), gpu="a100", mfu=0.4)
    assert a100.hours == pytest.approx(plan.hours * 989 / 312)
    assert training_plan(recipe, Launch(world=8), gpu="h100", mfu=0.2).hours == pytest.approx(2 * plan.hours)
    big = _recipe("1b-dense", "train.micro_batch_size=20")  # about 95 GiB: an H200's 141 GB, not an H100's 80
    assert not training_plan(big, Launch(world=8), gpu="h100").fits
    assert training_plan(big, Launch(world=8), gpu="h200").fits


@pytest.mark.parametrize("call, message", [
    (lambda r: training_plan(r, gpu="v100"), "gpu='v100': must be one of h100, h200, a100"),
    (lambda r: training_plan(r, mfu=40), "mfu=40: must be a fraction in (0, 1]"),
    (lambda r: memory_plan(r, precision="fp16"), "precision='fp16': must be one of bf16, fp32"),
    (lambda r: read_launch(None, gpus=0), "gpus=0: must be a positive integer"),
    (lambda r: read_launch("nope.yaml"), "nope.yaml: no such launch config"),
    (lambda r: read_launch(ROOT / "recipes/dense/125m.yaml"), "not an accelerate config (no distributed_type)"),
])
def test_bad_input_is_refused_naming_what_is_wrong(call, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        call(_recipe("125m-dense"))


def test_expert_parallelism_needs_deepspeed_and_a_dividing_world():
    recipe = _recipe("125m-moe", "model.moe.ep_size=2")
    with pytest.raises(ValueError, match="expert parallelism runs under DeepSpeed only"):
        memory_plan(recipe, Launch(world=2))
    with pytest.raises(ValueError, match="must divide the number of GPUs"):
        memory_plan(recipe, Launch(world=3, backend="deepspeed"))
    with pytest.raises(ValueError, match="ZeRO-3 with an MoE model"):
        memory_plan(recipe, Launch(world=2, backend="deepspeed", zero_stage=3))
    one, two = (memory_plan(recipe, Launch(world=2, backend="deepspeed"), ep=ep) for ep in (1, 2))
    assert two.weights < one.weights  # the routed experts split over the two ranks


if __name__ == "__main__":  # python tests/costs/test_costs_plan.py [CASE ...]: the table (every case by default)
    rows = [(case, regime, "none") for case in CASES for regime in REGIMES]
    rows += [("125m-dense", "autocast", "full"), ("125m-dense", "autocast", "selective")]
    print("| case | regime | checkpointing | plan peak GiB | torch peak GiB | plan / torch | seconds |")
    print("|---|---|---|---|---|---|---|")
    if sys.argv[1:]:  # the cases named, in their order
        rows = [row for name in sys.argv[1:] for row in rows if row[0] == name]
    for case, regime, mode in rows:
        start = time.time()
        recipe = _recipe(case)
        plan, measured = planned_peak(recipe, regime, mode), measured_peak(recipe, regime, mode)
        print(f"| {case} | {regime} | {mode} | {plan / 2**30:.2f} | {measured / 2**30:.2f} | {plan / measured:.3f} | "
              f"{time.time() - start:.0f} |", flush=True)
