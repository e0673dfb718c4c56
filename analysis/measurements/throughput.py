"""``throughput: {steps, rounds}``: the training step of every arm timed side by side in this
process, interleaved in ``rounds`` rounds (default 5) of ``steps`` steps (default 10) of each arm
(:func:`benchmark`), so that the arms' tokens/s compare under the same machine load; cached
as ``<out>/measurements/throughput.json``. ``tools.experiment`` runs it before the time-matched
arms train (their budgets use these speeds); the cost tables show it; its section comes last.

The benchmark: several recipes' training steps measured side by side, interleaved, in one process. The
tokens/s a run logs depend on whatever else the machine was doing while it trained; on a shared machine
two arms trained an hour apart are not comparable to better than a factor of two. Here every arm's
trainer is built once (``archlab.train.loop.Trainer``, its run folder in a temporary folder) and its own
training step (``Trainer.optimizer_step``: the fused-loss forward, backward, gradient clipping,
optimizer step and MoE bookkeeping, exactly what a run does) is timed in rounds: round r times ``steps``
steps of arm 1, then of arm 2, ..., so that load changes hit every arm alike; the result per arm is the
median over rounds.

    from analysis.measurements.throughput import benchmark
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

from analysis.experiments import Context, Section, fmt_count, table
from analysis.measurements.base import Measurement, cached, check_int, measurement_folder, record_arms, register
from archlab.config import load_recipe
from archlab.train.loop import Trainer


def _stepper(recipe: str, overrides: list[str], seed: int = 0, out_dir: Optional[str] = None):
    """A closure that runs one training step of the recipe's model and returns the tokens it trained:
    :meth:`archlab.train.loop.Trainer.optimizer_step`, the trainer's own step, on a trainer whose run
    folder lies under ``out_dir`` (a temporary folder; nothing is evaluated or checkpointed)."""
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


@register
class Throughput(Measurement):
    """Every arm's tokens/s, measured side by side."""

    name = "throughput"
    title = "Throughput, measured side by side"
    keys = ("steps", "rounds")
    quick = {"steps": 2, "rounds": 2}
    last = True

    def check(self, settings, where: str) -> dict:
        s = super().check(settings, where)
        check_int(s, "steps", where)
        check_int(s, "rounds", where)
        return s

    def run(self, record: dict, log=print) -> dict:
        """{arm: {"tokens_per_s", "rounds", ...}} of the interleaved benchmark; arms that train the same
        model (the same recipe and overrides, e.g. a time-matched copy) are timed once."""
        m = self.settings(record)
        steps, rounds = int(m.get("steps", 10)), int(m.get("rounds", 5))
        threads = record.get("threads")
        models: dict[str, tuple[str, list]] = {}  # first arm of each distinct model -> (recipe, overrides)
        same_as: dict[str, str] = {}
        for a in record_arms(record):
            first = next((n for n, spec in models.items() if spec == (a.recipe, a.overrides)), None)
            if first is None:
                models[a.name] = (a.recipe, a.overrides)
            same_as[a.name] = first or a.name
        settings = {"steps": steps, "rounds": rounds, "threads": threads,
                    "arms": {n: list(spec) for n, spec in models.items()}}
        path = measurement_folder(record) / "throughput.json"
        if not path.is_file():
            log(f"throughput: {len(models)} models, {rounds} interleaved rounds of {steps} steps")
        timed = cached(path, settings, lambda: benchmark(models, steps=steps, rounds=rounds, threads=threads))
        return {name: {**timed[first], "timed_as": first} for name, first in same_as.items()}

    def section(self, ctx: Context) -> Section:
        bench = ctx.measures.get("throughput") or {}
        ref = bench.get(ctx.reference, {}).get("tokens_per_s")
        rows, data = [], []
        for name, b in bench.items():
            rounds = b["rounds"]
            rel = b["tokens_per_s"] / ref if ref else None
            data.append({"arm": name, **b, "relative_to_reference": rel})
            rows.append([f"{ctx.arms[name].label} (`{name}`)", fmt_count(b["tokens_per_s"]),
                         f"{fmt_count(min(rounds))} - {fmt_count(max(rounds))}", f"{rel:.2f}" if rel else "-",
                         fmt_count(ctx.costs[name]["flops_per_token"])])
        first = next(iter(bench.values()), {})
        md = (f"Every arm's training step timed side by side in this process: {len(first.get('rounds', []))} rounds, "
              f"each timing {first.get('steps', 0)} steps of every arm in turn, {first.get('threads')} torch "
              "thread(s); the median over rounds. The arms see the same machine load, so their ratios mean something "
              "even on a shared machine (the runs' own tokens/s do not).\n\n"
              + table(["arm", "tokens/s (median over rounds)", "range over rounds", "relative to reference",
                       "train FLOPs/token"], rows))
        return Section(self.title, md, [], {"arms": data})
