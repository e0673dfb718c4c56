"""The optimizer and the lr schedule of a run, as the trainer, the backends and the tools call them.

The optimizers and schedules themselves are classes in :mod:`archlab.optim` (one registry each:
``train.optimizer``, ``train.schedule``); this module keeps the names the rest of archlab imports.
``param_groups(model, weight_decay)`` is AdamW's grouping (``decay``, muP's ``readout``, ``no_decay``).
"""

from __future__ import annotations

from archlab.optim import build_optimizer, lr_at, set_lr
from archlab.optim.adamw import adamw_param_groups as param_groups

__all__ = ["build_optimizer", "lr_at", "param_groups", "set_lr"]
