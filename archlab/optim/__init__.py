"""Optimizers and learning-rate schedules, one registry each.

- :data:`OPTIMIZERS` (``train.optimizer``): ``adamw`` (:mod:`.adamw`), ``muon`` (:mod:`.muon`: torch's
  Muon for the hidden matrices, AdamW for the rest). The protocol is :class:`.base.OptimizerSpec`.
- :data:`SCHEDULES` (``train.schedule``): ``cosine``, ``constant``, ``wsd`` (:mod:`.schedules`).

    opt = build_optimizer(model, cfg.train)       # the torch optimizer train.optimizer names
    set_lr(opt, lr_at(step, cfg.train))           # every step: the schedule's lr times each group's lr_scale

This package sits with the components, below the recipe schema, which composes the optimizers' config
dataclasses (``MuonConfig``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from archlab.optim import adamw, muon  # noqa: F401  (registration)
from archlab.optim.adamw import AdamWOptimizer, adamw_param_groups
from archlab.optim.base import OPTIMIZERS, ROLES, OptimizerSpec, optimizer_class, optimizer_for, param_roles
from archlab.optim.muon import MuonConfig, MuonOptimizer, MuonWithAdamW
from archlab.optim.schedules import SCHEDULES, Schedule, lr_at, schedule_class, set_lr


def build_optimizer(model: nn.Module, train_cfg: Any, expert_groups: bool = False) -> torch.optim.Optimizer:
    """The optimizer ``train.optimizer`` names over ``model``'s parameters (``expert_groups``: DeepSpeed's
    expert-parallel groups, AdamW only)."""
    return optimizer_for(train_cfg).build(model, expert_groups=expert_groups)


__all__ = ["OPTIMIZERS", "ROLES", "SCHEDULES", "AdamWOptimizer", "MuonConfig", "MuonOptimizer", "MuonWithAdamW",
           "OptimizerSpec", "Schedule", "adamw_param_groups", "build_optimizer", "lr_at", "optimizer_class",
           "optimizer_for", "param_roles", "schedule_class", "set_lr"]
