"""What a probe task is (:class:`ProbeTask`), the sets it generates (:class:`ProbeSet`), the one registry of
tasks (:data:`PROBES`) and the seeded generator of each split (:func:`split_rng`).

A probe is a synthetic sequence task whose answers sit at known positions (target -100 elsewhere): a model trained
on the task's train set from scratch is scored by its accuracy at the answer positions of the test set. Train and
test come from two generators of the same seed (:func:`split_rng`: ``numpy``'s ``SeedSequence([seed, split])``),
so that they are disjoint by seed and each is the same for a given seed.

Shape legend: N sequences, S sequence length, K key-value pairs (or tokens to copy).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from archlab.errors import RecipeError
from archlab.registry import Registry

IGNORE = -100  # the target of a position that is not scored (torch's cross_entropy ignore_index)
SPLITS = {"train": 0, "test": 1}


@dataclass(frozen=True)
class ProbeSet:
    """``inputs_NS`` (int64 ids) and ``targets_NS`` (the id to predict at each position, IGNORE elsewhere)."""

    inputs_NS: Tensor
    targets_NS: Tensor

    @property
    def answers(self) -> int:
        """How many positions are scored."""
        return int((self.targets_NS != IGNORE).sum())


def split_rng(seed: int, split: str) -> np.random.Generator:
    """The generator of ``split`` ("train" | "test") for ``seed``: distinct streams, so the splits are disjoint."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r}: expected one of {', '.join(SPLITS)}")
    return np.random.default_rng([int(seed), SPLITS[split]])


@dataclass(frozen=True)
class ProbeTask:
    """One probe task with its settings as fields (each task a frozen dataclass with defaults).

    Subclasses set :attr:`name`, :attr:`title`, ``vocab_size`` and ``seq_len`` fields, and implement
    :meth:`sample` (one split's sequences), :attr:`answer_ids` and :attr:`chance` (the accuracy of a uniform
    guess over the answer ids; a model that reads which ids the context offers can score more without recall)."""

    name: ClassVar[str] = ""
    title: ClassVar[str] = ""

    def __post_init__(self):
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise RecipeError(f"probe {self.name}: {f.name}={v!r}: expected a number")
        self.check()

    def check(self) -> None:
        """Raise RecipeError naming the setting that makes the task impossible (subclasses)."""

    @classmethod
    def settings(cls) -> tuple[str, ...]:
        """The settings a spec may give this task."""
        return tuple(f.name for f in fields(cls))

    @property
    def chance(self) -> float:
        raise NotImplementedError

    @property
    def answer_ids(self) -> np.ndarray:
        """The ids an answer is drawn from (a uniform guess over them scores :attr:`chance`)."""
        raise NotImplementedError

    def sample(self, n: int, rng: np.random.Generator, split: str) -> tuple[np.ndarray, np.ndarray]:
        """(inputs (N, S), targets (N, S)) of ``n`` sequences; ``split`` may change what is scored."""
        raise NotImplementedError

    def generate(self, n: int, seed: int, split: str) -> ProbeSet:
        """``n`` sequences of ``split`` ("train" | "test"), the same for the same seed."""
        inputs, targets = self.sample(int(n), split_rng(seed, split), split)
        return ProbeSet(torch.as_tensor(inputs, dtype=torch.long), torch.as_tensor(targets, dtype=torch.long))


PROBES: Registry[type[ProbeTask]] = Registry("probe")


def check_setting(task: ProbeTask, ok: bool, key: str, rule: str) -> None:
    """RecipeError ``probe <name>: <key>=<value>: <rule>`` unless ``ok``."""
    if not ok:
        raise RecipeError(f"probe {task.name}: {key}={getattr(task, key)!r}: {rule}")


def distinct(rng: np.random.Generator, n: int, k: int, low: int, high: int) -> np.ndarray:
    """(n, k) ids drawn without replacement from [low, high) in each row."""
    return rng.random((n, high - low)).argsort(axis=1)[:, :k] + low
