"""Approach 1: the lowest-loss-per-FLOP envelope of the validation curves, and the exponent of N
against C along it."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Optional, Sequence

import numpy as np

from analysis.scaling.fits.common import NO_FINITE, OK, ONE_SIZE, TOO_FEW_SIZES, _interval, json_safe


def pareto_frontier(C: Sequence[float], L: Sequence[float]) -> np.ndarray:
    """Indices of the compute-optimal points: no other point reaches a lower loss with at most
    the same compute. Returned in increasing C."""
    C = np.asarray(C, dtype=float)
    L = np.asarray(L, dtype=float)
    order = np.lexsort((L, C))
    keep, best = [], math.inf
    for i in order:
        if L[i] < best:
            keep.append(i)
            best = L[i]
    return np.asarray(keep, dtype=int)


def envelope(curves: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]],
             n: int = 60) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Compute-optimal frontier of a family: at each compute C, the lowest validation loss any
    run reached with at most C FLOPs (Kaplan's envelope). ``curves``: (run, tokens, C, loss)
    per run. Returns (C grid, loss, run at each C)."""
    all_c = np.concatenate([c for _, _, c, _ in curves])
    grid = np.logspace(np.log10(all_c.min()), np.log10(all_c.max()), n)
    best = np.full(n, np.inf)
    who = [""] * n
    for name, _, c, loss in curves:
        for j, g in enumerate(grid):
            reached = loss[c <= g * (1 + 1e-9)]
            if len(reached) and reached.min() < best[j]:
                best[j], who[j] = reached.min(), name
    ok = np.isfinite(best)
    return grid[ok], best[ok], [w for w, k in zip(who, ok) if k]


@dataclass
class EnvelopeExponent:
    """Approach 1: N of the envelope's run against C, N_opt ∝ C^a (log-log least squares).

    Grid points won by the smallest or the largest size are left out (``trim_extremes``): there
    the optimum may lie beyond the sizes trained. Interval: bootstrap over runs (the envelope and
    the fit redone on resampled run sets)."""

    status: str
    message: str = ""
    n_runs: int = 0
    n_sizes: int = 0  # distinct N among the kept envelope points
    n_grid: int = 0  # envelope points kept
    slope: Optional[float] = None
    log_prefactor: Optional[float] = None
    ci: dict = field(default_factory=dict)
    n_boot: int = 0
    ci_method: str = "runs"
    C: list = field(default_factory=list)
    N: list = field(default_factory=list)

    def to_json(self) -> dict:
        return json_safe(asdict(self))


def _envelope_points(curves, sizes, n_grid, trim):
    C, _, who = envelope(curves, n_grid)
    N = np.array([sizes[w] for w in who], dtype=float)
    keep = np.ones(len(N), dtype=bool)
    if trim:
        all_N = [sizes[name] for name, *_ in curves]
        keep &= (N > min(all_N)) & (N < max(all_N))
    return C[keep], N[keep]


def envelope_exponent(curves: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]], sizes: dict[str, float], *,
                      n_grid: int = 60, trim_extremes: bool = True, n_boot: int = 200,
                      seed: int = 0) -> EnvelopeExponent:
    """Exponent a of N_opt ∝ C^a from the envelope of training curves (Chinchilla approach 1).

    ``curves``: (run, tokens, C, loss) per run, as :func:`envelope`; ``sizes``: run -> N. The
    curves should be finite (drop NaN rows first)."""
    curves = [c for c in curves if len(c[2]) and np.all(np.isfinite(c[2])) and np.all(np.isfinite(c[3]))]
    res = EnvelopeExponent(status=OK, n_runs=len(curves))
    distinct = sorted({sizes[name] for name, *_ in curves})
    if len(curves) == 0:
        res.status, res.message = NO_FINITE, "no run with a finite validation curve"
        return res
    if len(distinct) == 1:
        res.status, res.message = ONE_SIZE, f"one model size (N = {distinct[0]:.4g}): no optimal-size trend"
        return res
    C, N = _envelope_points(curves, sizes, n_grid, trim_extremes)
    res.C, res.N, res.n_grid, res.n_sizes = C.tolist(), N.tolist(), len(C), len(np.unique(N))
    if res.n_sizes < 2:
        res.status = TOO_FEW_SIZES
        res.message = (f"{res.n_sizes} model size(s) win the envelope away from the smallest and largest "
                       f"({len(distinct)} sizes trained): a slope needs >= 2" if trim_extremes else
                       f"{res.n_sizes} model size(s) on the envelope: a slope needs >= 2")
        return res
    res.slope, res.log_prefactor = (float(v) for v in np.polyfit(np.log(C), np.log(N), 1))
    rng = np.random.default_rng(seed)
    slopes = []
    for _ in range(n_boot):
        pick = [curves[i] for i in sorted(set(rng.integers(0, len(curves), len(curves)).tolist()))]
        if len({sizes[name] for name, *_ in pick}) < 2:
            continue
        Cb, Nb = _envelope_points(pick, sizes, n_grid, trim_extremes)
        if len(np.unique(Nb)) >= 2:
            slopes.append(np.polyfit(np.log(Cb), np.log(Nb), 1)[0])
    res.n_boot = len(slopes)
    iv = _interval(np.asarray(slopes)) if slopes else None
    if iv:
        res.ci = {"slope": iv}
    return res
