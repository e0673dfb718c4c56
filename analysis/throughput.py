"""Training throughput of several recipes measured side by side, interleaved, in one process.

The tokens/s a run logs depend on whatever else the machine was doing while it trained; on a
shared machine two arms trained an hour apart are not comparable to better than a factor of two.
Here every arm's model is built once and its training step (the fused-loss forward, backward,
gradient clipping and AdamW step of ``archlab.train``, with the MoE balancing bookkeeping before and
after it, ``start_step`` and ``balance_step``, on the arm's own batch shape) is timed in
rounds: round r times ``steps`` steps of arm 1, then of arm 2, ..., so that load changes hit every
arm alike; the result per arm is the median over rounds.

    from analysis.throughput import benchmark
    benchmark({"dense": ("recipes/llama/tiny.yaml", []), "moe": ("recipes/mixtral/tiny.yaml", [])},
              steps=10, rounds=5, threads=1)

Shape legend: B windows, S positions.
"""

from __future__ import annotations

import statistics
import time
from typing import Optional

import torch

from archlab.config import load_recipe
from archlab.data import TokenBatches, prepare_data
from archlab.model.build import build_model
from archlab.nn.moe import balance_step, start_step
from archlab.train.optim import build_optimizer


def _stepper(recipe: str, overrides: list[str], seed: int = 0):
    """A closure that runs one training step of the recipe's model and returns the tokens it trained."""
    cfg = load_recipe(recipe, [*overrides, f"train.seed={seed}"])
    t = cfg.train
    data = prepare_data(cfg)
    torch.manual_seed(seed)
    model = build_model(cfg)
    model.train()
    opt = build_optimizer(model, t)
    stream = TokenBatches(data.train, int(t.seq_len), int(t.micro_batch_size), int(t.grad_accum), 0, 1, seed)
    state = {"step": 0}

    def step() -> int:
        start_step(model)  # global-batch balancing: the step's counts start at zero (as the trainer)
        for micro in range(int(t.grad_accum)):
            x_BS1 = stream.get(state["step"], micro)
            out = model(x_BS1[:, :-1], targets=x_BS1[:, 1:])
            (out.loss + out.aux_loss).backward()
        if t.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        balance_step(model, lambda x: x)  # the aux-loss-free bias update (one process: nothing to sum)
        state["step"] += 1
        return int(t.seq_len) * int(t.micro_batch_size) * int(t.grad_accum)

    step.model = model  # the model it trains, to inspect
    return step


def benchmark(arms: dict[str, tuple[str, list[str]]], steps: int = 10, rounds: int = 5, warmup: int = 2,
              threads: Optional[int] = None) -> dict[str, dict]:
    """{arm: {"tokens_per_s": median over rounds, "rounds": [tokens/s of each round], "steps", "threads"}}."""
    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        steppers = {name: _stepper(recipe, list(overrides)) for name, (recipe, overrides) in arms.items()}
        for step in steppers.values():
            for _ in range(warmup):
                step()
        samples: dict[str, list[float]] = {name: [] for name in steppers}
        for _ in range(rounds):
            for name, step in steppers.items():
                t0 = time.perf_counter()
                tokens = sum(step() for _ in range(steps))
                samples[name].append(tokens / (time.perf_counter() - t0))
        used = torch.get_num_threads()
    finally:
        torch.set_num_threads(previous)
    return {name: {"tokens_per_s": statistics.median(s), "rounds": s, "steps": steps, "threads": used}
            for name, s in samples.items()}
