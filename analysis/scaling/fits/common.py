"""What every scaling fit shares: named statuses and flags, bound checks, percentile intervals and strict-JSON
output (the robust (Huber) loss is ``analysis.curve_fit.huber``, shared with the compute curve).

A result carries a ``status`` ("ok" or a named degeneracy) and, when computed but not to be read as sound,
named ``flags``; tables and fits.json show :func:`reported_status`. Why, and what each flag means:
docs/methods/scaling.md ("Statuses and flags").
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

Q = (2.5, 97.5)  # 95% percentile interval
# statuses (strings, so that fits.json and fits.md read without a legend)
OK = "ok"
NO_FINITE = "no-finite-points"
TOO_FEW_POINTS = "too-few-points"
ONE_SIZE = "one-model-size"
TOO_FEW_SIZES = "too-few-model-sizes"
ONE_TOKENS = "one-token-count"
TOO_FEW_TOKENS = "too-few-token-counts"
COLLINEAR = "n-d-collinear"
FAILED = "failed"
NOT_CONVEX = "not-convex"
UNBRACKETED = "minimum-outside-sampled-range"
NO_BUDGET = "no-usable-budget"
ONE_BUDGET = "one-budget"
DEGENERATE = "degenerate-exponents"
NO_SEEDS = "no-seed-groups"
# a value within BOUND_TOL of its bound's span from an optimiser bound is at that bound; an irreducible loss E
# under NEGLIGIBLE times the smallest loss is at its lower bound (~0) in effect
BOUND_TOL = 1e-3
NEGLIGIBLE = 1e-3
AT_BOUND = "interval at bound"  # an end of the 95% interval at an optimiser bound
ESTIMATE_AT_BOUND = "estimate at bound"  # no interval, the point estimate at the bound
NOT_BRACKETED = "minimum not bracketed"
N_OPT_OUTSIDE = "N_opt outside the trained sizes"


def reported_status(obj) -> str:
    """The status that tables and fits.json show: a computed result's flags in place of "ok", else
    its ``status``."""
    flags = getattr(obj, "flags", None)
    return "; ".join(flags) if obj.status == OK and flags else obj.status


def bound_flags(checks) -> list[str]:
    """Named flags of the fitted parameters at an optimiser bound. ``checks``: one tuple per bounded
    coordinate of the optimiser, (value, interval or None, lower, upper, lower label, upper label):
    the value and the interval in the optimiser's coordinate (e.g. ln E when it fits ln E), lower and
    upper the thresholds at or beyond which a value counts as at its bound (:func:`bound_thresholds`),
    the labels the bound as a reader sees it ("alpha >= 0", "E >= 1e-06"). "interval at bound
    (alpha <= 5)" when an end of the 95% interval is at a bound, "estimate at bound (...)" when there
    is no interval and the estimate is."""
    out = []
    for value, ci, lo_at, hi_at, lo_label, hi_label in checks:
        if value is None or not math.isfinite(value):
            continue
        ends = [x for x in ci if x is not None and not math.isnan(x)] if ci else []
        what, vals = (AT_BOUND, ends) if ci else (ESTIMATE_AT_BOUND, [value])
        if any(x <= lo_at for x in vals):
            out.append(f"{what} ({lo_label})")
        if any(x >= hi_at for x in vals):
            out.append(f"{what} ({hi_label})")
    return out


def bound_thresholds(lo: float, hi: float, floor: Optional[float] = None) -> tuple[float, float]:
    """(lower, upper) thresholds of :func:`bound_flags` for an optimiser bound [lo, hi]: within
    ``BOUND_TOL`` of the span from either end. ``floor`` (for ln E, whose lower bound stands for E = 0):
    the ln E below which E no longer changes the fit (it is then at its bound in effect: the objective is
    flat down to it, and where the optimiser stops is not the data's)."""
    tol = BOUND_TOL * (hi - lo)
    return (max(lo + tol, floor) if floor is not None else lo + tol), hi - tol


def _log_ci(ci: Optional[list]) -> Optional[list]:
    """An interval of a positive quantity in logs (a non-positive end -> -inf)."""
    if not ci:
        return None
    return [math.log(x) if x is not None and x > 0 else -math.inf for x in ci]


def _g(x: float) -> str:
    return format(x, ".3g")


def _interval(samples: np.ndarray) -> Optional[list]:
    """95% percentile interval by rank (order statistics), so that +-inf samples (a minimum that
    runs off to infinity) give an unbounded side instead of NaN. None with < 10 samples."""
    s = np.sort(np.asarray(samples, dtype=float)[~np.isnan(samples)])
    if len(s) < 10:
        return None
    lo, hi = s[int(math.floor(Q[0] / 100 * (len(s) - 1)))], s[int(math.ceil(Q[1] / 100 * (len(s) - 1)))]
    return [float(lo), float(hi)]


def json_safe(obj):
    """Non-finite floats -> None (strict JSON), recursively through dicts, lists and tuples."""
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.ndarray):
        return json_safe(obj.tolist())
    return obj


def _finite_positive(*arrays: np.ndarray) -> np.ndarray:
    ok = np.ones(len(arrays[0]), dtype=bool)
    for x in arrays:
        ok &= np.isfinite(x) & (x > 0)
    return ok


def difference_interval(x_samples, y_samples, *, n: int = 2000, seed: int = 0) -> Optional[list]:
    """95% interval of y - x from bootstrap draws of two estimates, paired at random (as if their
    errors were independent; two estimates from the same data err together, so this is wider than
    the interval of a joint bootstrap: a conservative test of disagreement). None with < 10 draws
    of either."""
    x = np.asarray(x_samples, dtype=float)
    y = np.asarray(y_samples, dtype=float)
    x, y = x[np.isfinite(x)], y[np.isfinite(y)]
    if len(x) < 10 or len(y) < 10:
        return None
    rng = np.random.default_rng(seed)
    return _interval(y[rng.integers(0, len(y), n)] - x[rng.integers(0, len(x), n)])


ND_CLUSTER_MIN = 5  # fewer clusters (trunks) than this: flip each cluster's residuals instead of resampling clusters


def _cluster_members(labels: Optional[np.ndarray], n: int) -> tuple[Optional[list], Optional[np.ndarray]]:
    """(indices of each cluster, cluster index of each point), or (None, None) when every point is its own."""
    if labels is None:
        return None, None
    _, inv = np.unique(labels, return_inverse=True)
    n_clusters = int(inv.max()) + 1 if n else 0
    if n_clusters >= n:
        return None, None
    return [np.flatnonzero(inv == g) for g in range(n_clusters)], inv


def n_opt_flags(N_opt: Optional[float], N_range: Optional[Sequence[float]]) -> list[str]:
    """["N_opt outside the trained sizes (...)"] when N_opt lies outside ``N_range`` (the smallest and
    largest N trained), else []."""
    if N_opt is None or not N_range or not math.isfinite(N_opt):
        return [] if N_opt is None or not N_range else [f"{N_OPT_OUTSIDE} (N_opt = {_g(N_opt)})"]
    lo, hi = N_range
    if N_opt < lo:
        return [f"{N_OPT_OUTSIDE} (N_opt = {_g(N_opt)} < smallest trained N = {_g(lo)})"]
    if N_opt > hi:
        return [f"{N_OPT_OUTSIDE} (N_opt = {_g(N_opt)} > largest trained N = {_g(hi)})"]
    return []


def group_budgets(C: Sequence[float], *, tolerance: float = 0.1,
                  tags: Optional[Sequence[Optional[float]]] = None) -> list[np.ndarray]:
    """Indices of the points of each compute budget, in increasing C. Points with a budget tag
    (the sweep's FLOPs budget) group by it; the others chain in increasing C while each is within
    ``tolerance`` (relative) of its group's first point."""
    C = np.asarray(C, dtype=float)
    tags = [None] * len(C) if tags is None else list(tags)
    groups: list[list[int]] = []
    by_tag: dict[float, list[int]] = {}
    for i, t in enumerate(tags):
        if t is not None and math.isfinite(C[i]):
            by_tag.setdefault(float(t), []).append(i)
    groups.extend(by_tag.values())
    rest = sorted((i for i, t in enumerate(tags) if t is None and math.isfinite(C[i])), key=lambda i: C[i])
    for i in rest:
        if groups and groups[-1][0] in rest and C[i] <= C[groups[-1][0]] * (1 + tolerance):
            groups[-1].append(i)
        else:
            groups.append([i])
    return sorted((np.asarray(g) for g in groups), key=lambda g: float(np.min(C[g])))
