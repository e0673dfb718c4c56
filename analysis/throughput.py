"""Training throughput of several recipes measured side by side, interleaved, in one process.

The tokens/s a run logs depend on whatever else the machine was doing while it trained; on a
shared machine two arms trained an hour apart are not comparable to better than a factor of two.
Here every arm's trainer is built once (``archlab.train.loop.Trainer``, its run folder in a
temporary folder) and its own training step (``Trainer.optimizer_step``: the fused-loss forward,
backward, gradient clipping, optimizer step and MoE bookkeeping, exactly what a run does) is timed in
rounds: round r times ``steps`` steps of arm 1, then of arm 2, ..., so that load changes hit every
arm alike; the result per arm is the median over rounds.

    from analysis.throughput import benchmark
    benchmark({"dense": ("recipes/llama/tiny.yaml", []), "moe": ("recipes/mixtral/tiny.yaml", [])},
              steps=10, rounds=5, threads=1)

Shape legend: B windows, S positions.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from typing import Optional

import torch

from archlab.config import load_recipe


def _stepper(recipe: str, overrides: list[str], seed: int = 0, out_dir: Optional[str] = None):
    """A closure that runs one training step of the recipe's model and returns the tokens it trained:
    :meth:`archlab.train.loop.Trainer.optimizer_step`, the trainer's own step, on a trainer whose run
    folder lies under ``out_dir`` (a temporary folder; nothing is evaluated or checkpointed)."""
    from archlab.train.loop import Trainer

    folder = out_dir or tempfile.mkdtemp(prefix="archlab-throughput-")
    cfg = load_recipe(recipe, [*overrides, f"train.seed={seed}", f"train.out_dir={folder}",
                               f"train.run_name=bench-{abs(hash((recipe, tuple(overrides)))) % 10**8}",
                               "train.resume=none"])
    trainer = Trainer(cfg)

    def step() -> int:
        trainer.optimizer_step()
        return trainer.tokens_per_step

    step.model = trainer.model  # the model it trains, to inspect
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
