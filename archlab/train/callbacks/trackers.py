"""Experiment trackers (``train.trackers``: TensorBoard, wandb, MLflow; :mod:`archlab.trackers`):
each gets a copy of every metrics row, the recipe as hyperparameters, and the run folder's name.
metrics.jsonl stays the run's record. Chosen on the main process when the recipe names a tracker.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from archlab import trackers
from archlab.train.callbacks.base import Callback, Trainer


class Trackers(Callback):
    def on_run_folder(self, trainer: Trainer, resume_from: Optional[Path]) -> None:
        trackers.start(trainer.accelerator, trainer.run_dir, trainer.cfg)  # a resumed run starts a new tracker run

    def on_row(self, trainer: Trainer, row: dict[str, Any]) -> None:
        trackers.log(trainer.accelerator, row)

    def on_end(self, trainer: Trainer, status: str) -> None:
        trackers.finish(trainer.accelerator)

    def on_close(self, trainer: Trainer) -> None:
        trackers.finish(trainer.accelerator)  # also for a trainer that never ran
