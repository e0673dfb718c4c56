"""The trainer's own run with one step profiled: ``archlab.train``'s :class:`~archlab.train.Trainer`,
built from the recipe as ``python -m archlab.train`` builds it (accelerate, the recipe's precision,
optimizer, backend and ``train.compile``), plus a :class:`KernelProbe` callback that records which
ops and CUDA kernels one optimizer step ran (``gpu_check_probe.json`` in the run folder).

    python -m tools.gpu_check.probe RECIPE [key=value ...] [--probe-step N] [--no-checkpoint]
    accelerate launch --config_file recipes/launch/zero0.yaml --num_processes 2 -m tools.gpu_check.probe ...

``--no-checkpoint``: the run writes no checkpoint (the only departure from ``python -m archlab.train``;
a benchmark has no use for gigabytes of weights). Exit status as ``python -m archlab.train``'s.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from typing import Any, Optional, Sequence

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from archlab.config import RecipeError, load_recipe
from archlab.io import write_json_atomic
from archlab.train import CheckpointError, NonFiniteError, Trainer
from archlab.train.callbacks import Callback
from archlab.train.console import closing_lines
from archlab.train.dist import exit_process, shutdown_distributed

PROBE = "gpu_check_probe.json"


def profile_names(prof) -> tuple[dict[str, int], dict[str, int]]:
    """(op name -> calls, CUDA kernel name -> launches) of a finished ``torch.profiler.profile``."""
    ops: Counter = Counter()
    kernels: Counter = Counter()
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            kernels[e.name] += 1
        else:
            ops[e.name] += 1
    return dict(ops), dict(kernels)


class KernelProbe(Callback):
    """Profiles optimizer step ``step`` (counted from 1; CPU ops, and CUDA kernels on a GPU) from its
    first micro batch to its last callback; the main process writes the names to ``PROBE``."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.prof: Optional[profile] = None
        self.result: Optional[dict[str, Any]] = None

    def before_step(self, trainer) -> None:
        if trainer.step + 1 == self.step and self.prof is None and self.result is None:
            cuda = trainer.device.type == "cuda"
            self.prof = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else []))
            self.prof.__enter__()

    def after_step(self, trainer, result: dict[str, Any]) -> None:
        if self.prof is None:
            return
        if trainer.device.type == "cuda":
            torch.cuda.synchronize(trainer.device)
        self._stop()
        ops, kernels = profile_names(self._done)
        self.result = {"step": self.step, "rank": trainer.info.rank, "world_size": trainer.info.world_size,
                       "device": str(trainer.device), "ops": ops, "kernels": kernels}
        if trainer.info.is_main:
            write_json_atomic(trainer.run_dir / PROBE, self.result)

    def on_end(self, trainer, status: str) -> None:
        if self.prof is not None:  # the run stopped inside the probed step
            self._stop()

    def _stop(self) -> None:
        self.prof.__exit__(None, None, None)
        self._done, self.prof = self.prof, None


def _origin(recipe: str, overrides: Sequence[str]) -> str:
    return " ".join([recipe, *(["+", *overrides] if overrides else [])])


def _train(recipe: str, overrides: Sequence[str], probe_step: Optional[int], checkpoint: bool) -> int:
    try:
        cfg = load_recipe(recipe, overrides)
        trainer = Trainer(cfg, _origin(recipe, overrides))
    except (RecipeError, CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        trainer.callbacks.append(KernelProbe(probe_step or cfg.train.max_steps))
        if not checkpoint:
            trainer.save_checkpoint = lambda elapsed: None  # every rank skips it alike
        summary = trainer.run()
    except NonFiniteError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        trainer.close()
    if summary["rank"] == 0:
        print(closing_lines(summary), file=sys.stderr)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.gpu_check.probe", description=__doc__.split("\n\n")[0])
    p.add_argument("recipe")
    p.add_argument("overrides", nargs="*", help="key=value overrides, as python -m archlab.train takes them")
    p.add_argument("--probe-step", type=int, default=None, help="the step profiled (default: the last)")
    p.add_argument("--no-checkpoint", action="store_true", help="write no checkpoint")
    args = p.parse_args(argv)
    status = 1
    try:
        status = _train(args.recipe, args.overrides, args.probe_step, not args.no_checkpoint)
    finally:
        shutdown_distributed(synchronize=status == 0)
    return status


if __name__ == "__main__":
    exit_process(main())
