"""The sampling error of the validation set: percentile bootstrap over the validation windows (items) of one
run, or of the per-window difference of two runs evaluated on the same windows. The half-width is set beside
the seed interval (``analysis.measurements.val_sampling``) to show how much of it the finite validation set
explains; the windows' losses come from ``analysis.val_sampling``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

LEVEL = 0.95


def _bootstrap_means(x: np.ndarray, n_boot: int, seed: int, chunk: int = 2_000_000) -> np.ndarray:
    """Means of ``n_boot`` resamples of x with replacement, in chunks of about ``chunk`` draws."""
    rng = np.random.default_rng(seed)
    n = len(x)
    rows = max(1, chunk // n)
    out = []
    for start in range(0, n_boot, rows):
        m = min(rows, n_boot - start)
        out.append(x[rng.integers(0, n, (m, n))].mean(axis=1))
    return np.concatenate(out) if out else np.empty(0)


def _summary(x: np.ndarray, level: float, n_boot: int, seed: int) -> dict:
    x = x[np.isfinite(x)]
    n = len(x)
    if n == 0:
        return {"mean": None, "low": None, "high": None, "half_width": None, "se": None, "n": 0}
    means = _bootstrap_means(x, n_boot, seed)
    tail = 100 * (1 - level) / 2
    lo, hi = (float(v) for v in np.percentile(means, [tail, 100 - tail]))
    return {"mean": float(x.mean()), "low": lo, "high": hi, "half_width": (hi - lo) / 2,
            "se": float(means.std(ddof=1)) if len(means) > 1 else None, "n": n}


def bootstrap_mean_interval(per_item_losses: Sequence[float], level: float = LEVEL, n_boot: int = 2000,
                            seed: int = 0) -> dict:
    """Percentile bootstrap interval of the mean loss over validation items (windows):
    {mean, low, high, half_width, se (sd of the bootstrap means), n}."""
    return _summary(np.asarray(per_item_losses, dtype=float), level, n_boot, seed)


def paired_bootstrap_difference(a_items: Sequence[float], b_items: Sequence[float], level: float = LEVEL,
                                n_boot: int = 2000, seed: int = 0) -> dict:
    """Percentile bootstrap interval of mean(a - b) over the same validation items (windows) evaluated by
    two models, the items resampled jointly: {mean, low, high, half_width, se, n}."""
    a, b = np.asarray(a_items, dtype=float), np.asarray(b_items, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"paired_bootstrap_difference: {len(a)} and {len(b)} items; pairs need the same windows")
    return _summary(a - b, level, n_boot, seed)
