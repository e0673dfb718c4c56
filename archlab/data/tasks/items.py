"""What every understanding task hands the trainer: one split's items, and per-item scores for intervals.

Shape legend: N items, S window length, L label entries per item (tagging: S; span: 2; classification: 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

IGNORE = -100  # a position with no label (cross-entropy's ignore_index)


@dataclass
class Items:
    """``x`` (N, S) input ids, ``y`` (N, L) labels, ``doc`` (N,) the document each item comes from (intervals
    resample documents, since overlapping windows of one document are not independent), ``chance`` (N,) the
    expected score of a uniform guess per item."""

    x: np.ndarray
    y: np.ndarray
    doc: np.ndarray
    chance: np.ndarray
    guess: Optional[np.ndarray] = None  # (N, L) a baseline's answer per item, where the task defines one from the item

    def __len__(self) -> int:
        return len(self.x)


def stack(xs: list, ys: list, docs: list, chances: list, seq_len: int, width: int) -> Items:
    """Items from per-item lists (empty lists give zero items of the right shapes)."""
    return Items(np.array(xs, dtype=np.int64).reshape(-1, seq_len), np.array(ys, dtype=np.int64).reshape(-1, width),
                 np.array(docs, dtype=np.int64), np.array(chances, dtype=np.float64))
