"""Synthetic probe tasks: sequences whose answers sit at known positions, for training an architecture from
scratch and scoring its accuracy there (``analysis/measurements/mqar.py`` and ``mad.py`` run them).

    task = probe_task("mqar", {"seq_len": 128, "kv_pairs": 8})
    train = task.generate(4096, seed=0, split="train")    # ProbeSet: inputs_NS, targets_NS (-100: not scored)
    test = task.generate(256, seed=0, split="test")       # a different stream of the same seed

One module per task, registered in :data:`PROBES`: ``mqar`` (Zoology's multi-query associative recall) and the
MAD tasks ``in_context_recall``, ``noisy_recall``, ``selective_copying``. Each states its ``chance``.
"""

from __future__ import annotations

from typing import Optional

from archlab.data.probes import in_context_recall, mqar, noisy_recall, selective_copying  # noqa: F401
from archlab.data.probes.base import IGNORE, PROBES, ProbeSet, ProbeTask, split_rng
from archlab.errors import RecipeError


def probe_task(name: str, settings: Optional[dict] = None) -> ProbeTask:
    """The task ``name`` with ``settings`` (unknown names and keys refused, naming them)."""
    if name not in PROBES:
        raise RecipeError(f"probe {name!r}: unknown; valid: {', '.join(PROBES.names())}")
    cls = PROBES.get(name)
    unknown = sorted(set(settings or {}) - set(cls.settings()))
    if unknown:
        raise RecipeError(f"probe {name}: unknown settings {unknown}; valid: {', '.join(cls.settings())}")
    return cls(**(settings or {}))


__all__ = ["IGNORE", "PROBES", "ProbeSet", "ProbeTask", "probe_task", "split_rng"]
