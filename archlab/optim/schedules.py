"""Learning-rate schedules: one class per ``train.schedule`` name, registered in :data:`SCHEDULES`.

The lr is a pure function of the optimizer step, so a resumed run sets exactly the learning rate
an uninterrupted one would (no scheduler state to save). Every schedule starts with the same
linear warmup from lr / warmup_steps to ``train.lr`` over ``train.warmup_steps`` steps; a class
says what follows (:meth:`Schedule.after_warmup`), which ``train`` keys it reads besides ``lr``,
``warmup_steps`` and ``max_steps`` (``options``: ``archlab.config.options`` refuses the keys of
another schedule set to anything but their default), its rules on them (``validate``) and whether
it decays (``decays``: a schedule that does not is the stable trunk of WSD cooldown branches).

A new schedule is one class here (or in a module imported by ``archlab/optim/__init__.py``) and
its tests; a key of its own is one field of ``TrainConfig``.
"""

from __future__ import annotations

import math
from typing import Any, Callable, ClassVar

import torch

from archlab.errors import fail
from archlab.registry import Registry

SCHEDULES: Registry = Registry("schedule")


def _register(name: str):
    def deco(cls):
        cls.name = name
        return SCHEDULES.register(name)(cls)

    return deco


class Schedule:
    """One learning-rate schedule after the shared warmup."""

    name: ClassVar[str]
    options: ClassVar[frozenset[str]] = frozenset()
    decays: ClassVar[bool] = True

    @classmethod
    def validate(cls, t: Any) -> None:
        """Rules on the keys this schedule reads (``train.<key>=value: rule``)."""

    @classmethod
    def after_warmup(cls, step: int, t: Any) -> float:
        """The lr at optimizer step ``step`` >= ``train.warmup_steps`` (0-based)."""
        raise NotImplementedError


def _min_lr_ratio(t: Any) -> None:
    if not 0.0 <= t.min_lr_ratio <= 1.0:
        fail("train.min_lr_ratio", t.min_lr_ratio, "must lie in [0, 1]")


@_register("cosine")
class Cosine(Schedule):
    """Half a cosine from lr down to lr * ``min_lr_ratio`` at ``max_steps``."""

    options = frozenset({"min_lr_ratio"})

    @classmethod
    def validate(cls, t: Any) -> None:
        _min_lr_ratio(t)

    @classmethod
    def after_warmup(cls, step: int, t: Any) -> float:
        peak, total, warm = t.lr, t.max_steps, t.warmup_steps
        floor = peak * t.min_lr_ratio
        progress = (step - warm) / max(1, total - warm)
        return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


@_register("constant")
class Constant(Schedule):
    """lr after the warmup, to the end: the stable trunk of WSD cooldown branches."""

    decays = False

    @classmethod
    def after_warmup(cls, step: int, t: Any) -> float:
        return t.lr


@_register("wsd")
class WSD(Schedule):
    """Warmup-stable-decay (MiniCPM; Hägele et al. 2024): constant lr, then a decay to
    lr * ``min_lr_ratio`` over the last ``decay_steps`` steps (when > 0, else the last
    ``decay_fraction`` of the steps), reached at ``max_steps``. ``decay_shape``: a key of
    :attr:`DECAY_SHAPES` mapping the decay's progress p in [0, 1] to the share of the drop done:
    ``linear`` p, or ``sqrt`` sqrt(p) (lr * (1 - sqrt(p)) at min_lr_ratio 0: Hägele et al.'s best
    cooldown). A cooldown branch of a trunk that stopped at step s is a wsd run with
    ``max_steps = s + decay_steps``: it equals the trunk's constant lr before s."""

    options = frozenset({"min_lr_ratio", "decay_fraction", "decay_steps", "decay_shape"})
    DECAY_SHAPES: ClassVar[dict[str, Callable[[float], float]]] = {"linear": lambda p: p, "sqrt": math.sqrt}

    @classmethod
    def validate(cls, t: Any) -> None:
        _min_lr_ratio(t)
        if not 0.0 < t.decay_fraction <= 1.0:
            fail("train.decay_fraction", t.decay_fraction, "must lie in (0, 1]")
        if t.decay_shape not in cls.DECAY_SHAPES:
            fail("train.decay_shape", t.decay_shape, f"must be one of: {', '.join(cls.DECAY_SHAPES)}")
        if not 0 <= t.decay_steps <= t.max_steps - t.warmup_steps:
            fail("train.decay_steps", t.decay_steps, f"must lie in [0, max_steps - warmup_steps = "
                 f"{t.max_steps - t.warmup_steps}] (0 = train.decay_fraction of the steps)")

    @classmethod
    def after_warmup(cls, step: int, t: Any) -> float:
        peak, total, warm = t.lr, t.max_steps, t.warmup_steps
        floor = peak * t.min_lr_ratio
        decay_steps = t.decay_steps or max(1, round(t.decay_fraction * total))
        decay_start = max(warm, total - decay_steps)
        if step < decay_start:
            return peak
        progress = min(1.0, (step - decay_start) / max(1, total - decay_start))
        return peak + (floor - peak) * cls.DECAY_SHAPES[t.decay_shape](progress)


def schedule_class(train_cfg: Any) -> type[Schedule]:
    """The class of ``train.schedule``; ValueError naming the valid ones."""
    name = train_cfg.schedule
    if name not in SCHEDULES:
        raise ValueError(f"train.schedule={name!r}: must be one of {', '.join(SCHEDULES.names())}")
    return SCHEDULES.get(name)


def lr_at(step: int, train_cfg: Any) -> float:
    """Learning rate for optimizer step ``step`` (0-based): the linear warmup (all schedules), then
    the schedule's own :meth:`Schedule.after_warmup`."""
    if step < train_cfg.warmup_steps:
        return train_cfg.lr * (step + 1) / train_cfg.warmup_steps
    return schedule_class(train_cfg).after_warmup(step, train_cfg)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Every group to ``lr`` times its ``lr_scale`` (muP's per-layer multiplier, Muon's AdamW ratio;
    1 when absent)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
