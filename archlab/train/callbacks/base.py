"""The callback base class: the points of a run where the loop's optional features act.

A :class:`~archlab.train.loop.Trainer` chooses its callbacks from the recipe once, when it is built
(:func:`archlab.train.callbacks.choose`), and calls every callback's hook, in list order, at each point
below. Each hook does nothing by default; a feature overrides the hooks it needs. The call order:

    Trainer(cfg)      on_restore (resumed or branched runs: weights and counts loaded)
                      on_run_folder (main process: recipe and tokenizer written, env.json and metrics not yet)
                      on_build (everything built, optimizer and RNG restored)
    Trainer.run()     on_start
      every step      before_step, then per micro batch before_forward and after_forward, after_backward,
                      after_update (only when loss and gradient norm are finite and the weights moved),
                      after_step (every step, ``result["updated"]`` says whether it updated)
      between steps   on_eval (a validation row); on_row for every row written to metrics.jsonl
      end             on_eval (final rows), on_end (also after an error, a signal or a non-finite stop)
    Trainer.close()   on_close

Every rank calls every hook of the callbacks it holds; the list may differ between ranks (the router
tracer lives on the main process only), so a callback held by some ranks only must not call a
collective. :meth:`Callback.reads_stats` is asked before each step: a ``True`` from any callback (the
metrics logger's when a row is due) makes the step read windowed statistics (``after_update``'s ``read``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from torch import Tensor

Trainer = Any  # archlab.train.loop.Trainer; not imported: the loop imports the callbacks


class Callback:
    """One optional feature of the loop; override the hooks it needs (the module docstring gives the order)."""

    def on_restore(self, trainer: Trainer, ckpt_dir: Path, state: dict[str, Any]) -> None:
        """A checkpoint's weights, step and tokens are loaded (``state``: its state.json)."""

    def on_run_folder(self, trainer: Trainer, resume_from: Optional[Path]) -> None:
        """Main process, while the run folder is set up: before env.json and the metrics log open."""

    def on_build(self, trainer: Trainer) -> None:
        """The trainer is built: model, optimizer, RNG and counts as training resumes them."""

    def on_start(self, trainer: Trainer) -> None:
        """:meth:`Trainer.run` begins (after the start block is printed)."""

    def reads_stats(self, trainer: Trainer, step: int) -> bool:
        """Whether optimizer step ``step`` (counted from 1) should read this callback's windowed statistics."""
        return False

    def before_step(self, trainer: Trainer) -> None:
        """Before the first micro batch of the step (``trainer.step`` is the previous step)."""

    def before_forward(self, trainer: Trainer, micro: int, x_BW: Tensor) -> None:
        """Before the forward of micro batch ``micro`` (this rank's number within the step)."""

    def after_forward(self, trainer: Trainer, micro: int, x_BW: Tensor) -> None:
        """After that forward, before its backward."""

    def after_backward(self, trainer: Trainer) -> None:
        """Every micro batch back-propagated; before the gradient is clipped."""

    def after_update(self, trainer: Trainer, result: dict[str, Any], read: bool) -> None:
        """The weights were updated and ``trainer.step`` counted. ``result["extra"]``: fields for the step's
        metrics row; ``read``: the step reads windowed statistics (see :meth:`reads_stats`)."""

    def after_step(self, trainer: Trainer, result: dict[str, Any]) -> None:
        """Every step of :meth:`Trainer.run`, updated or not (``result["updated"]``)."""

    def on_eval(self, trainer: Trainer, row: dict[str, Any]) -> None:
        """A validation row was written (``row["final"]`` at the end of the run)."""

    def on_row(self, trainer: Trainer, row: dict[str, Any]) -> None:
        """Main process: a row was appended to metrics.jsonl."""

    def on_end(self, trainer: Trainer, status: str) -> None:
        """The run ends (``completed``, ``interrupted``, ``nonfinite`` or ``failed``), before its summary."""

    def on_close(self, trainer: Trainer) -> None:
        """:meth:`Trainer.close`: let go of what the callback holds; idempotent."""
