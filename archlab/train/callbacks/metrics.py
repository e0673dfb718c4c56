"""The training log: a ``train`` row in metrics.jsonl every ``train.log_every`` steps (and at the last
step) with the step's loss, the mean loss and tokens/s over the steps since the previous row (time
spent on evaluation and checkpoints left out), lr, gradient norm, MFU, on CUDA the allocator's peak so
far (``max_memory_allocated``, bytes) and the fields other callbacks add; and the progress bar on the
main process. Always chosen.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import torch
from tqdm.auto import tqdm

from archlab.train import console
from archlab.train.callbacks.base import Callback, Trainer


class Window:
    """Tokens/s and mean loss over the steps since the last row, less the time spent between steps."""

    def __init__(self, paused: float = 0.0) -> None:
        self.t0, self.paused, self.tokens, self.losses = time.perf_counter(), paused, 0, []

    def add(self, tokens: int, loss: float) -> None:
        self.tokens += tokens
        self.losses.append(loss)

    def take(self, paused: float) -> tuple[float, float]:
        """``paused``: the trainer's seconds between steps so far (evaluation, checkpoints)."""
        dt = time.perf_counter() - self.t0 - (paused - self.paused)
        out = (self.tokens / dt if dt > 0 else float("nan"), sum(self.losses) / max(1, len(self.losses)))
        self.t0, self.paused, self.tokens, self.losses = time.perf_counter(), paused, 0, []
        return out


def memory_fields(device: torch.device) -> dict[str, int]:
    """CUDA: ``max_memory_allocated``, the allocator's peak bytes on ``device`` since the process started
    (``torch.cuda.max_memory_allocated``); nothing elsewhere."""
    return {"max_memory_allocated": torch.cuda.max_memory_allocated(device)} if device.type == "cuda" else {}


class MetricsLogger(Callback):
    def __init__(self) -> None:
        self.bar = None

    def reads_stats(self, trainer: Trainer, step: int) -> bool:
        return step % trainer.cfg.train.log_every == 0 or step == trainer.cfg.train.max_steps  # a row is due

    def on_start(self, trainer: Trainer) -> None:
        self.bar = tqdm(total=trainer.cfg.train.max_steps, initial=trainer.step, disable=not trainer.info.is_main,
                        desc=trainer.cfg.name, unit="step", dynamic_ncols=True, file=sys.stderr, mininterval=1.0)
        self.window = Window(trainer.paused_s)
        self.fields = console.BarFields(trainer.objective.eval_loss_key)

    def after_step(self, trainer: Trainer, result: dict[str, Any]) -> None:
        r = result
        if r["updated"]:
            self.window.add(trainer.tokens_per_step, r["loss"])
        if r["updated"] and self.reads_stats(trainer, trainer.step):
            tok_s, loss_avg = self.window.take(trainer.paused_s)
            row = {"kind": "train", "step": trainer.step, "tokens": trainer.tokens, "loss": r["loss"],
                   "loss_avg": loss_avg, "aux_loss": r["aux_loss"], **r["parts"], "lr": r["lr"],
                   "grad_norm": r["grad_norm"], "tokens_per_s": tok_s, "flops_per_token": trainer.flops_per_token,
                   "mfu": tok_s * trainer.flops_per_token / (trainer.peak_flops * trainer.info.world_size),
                   "elapsed_s": trainer.elapsed(), **memory_fields(trainer.device), **r["extra"]}
            trainer.write(row)
            self.bar.set_postfix(self.fields.postfix(row), refresh=False)  # loss, lr, tok/s, MFU, val, MoE routing
        self.bar.update(1)

    def on_eval(self, trainer: Trainer, row: dict[str, Any]) -> None:
        if not row.get("final"):
            self.fields.saw(row)

    def on_end(self, trainer: Trainer, status: str) -> None:
        if self.bar is not None:
            self.bar.close()
