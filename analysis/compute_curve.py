"""The reference's loss as a function of training compute, L_ref(C), and its inverse C_ref(L): the curve the
compute-equivalent gain (``analysis.fair``) and the verdicts (``analysis.verdicts``) read a loss against.

The curve is measured by the cooldown branches of one WSD trunk per seed: seed s gives points (C_sj, L_sj).
:func:`fit_compute_curve` fits all seeds' points pooled with

    L(C) = E + A' (C / C0)^-alpha,    A' = exp(a),    C0 = geometric mean of the measured C

(A = A' C0^alpha in L = E + A C^-alpha), by the shared L(C) fitter (``analysis.curve_fit``, on the loss scale).
Measuring C from C0 makes a the excess loss in the middle of the measured range instead of at C = 1 FLOP,
which keeps a and alpha from trading off over 12 decades; exp(a) keeps A' > 0. Bounds: 0 <= E < min(L),
0 < alpha <= 5. ``scipy.optimize.least_squares`` minimises the residuals in loss (nats), from several starts
(E a share of min L; a and alpha from the straight line of ln(L - E) on ln(C / C0)). Residuals in loss, not in
log loss, and no Huber: the noise of a measured loss (seed, evaluation batches) is additive and about as large
in nats at 3.5 as at 5, so least squares in nats is the maximum-likelihood fit under that noise, and the loss
is what gets inverted; over so narrow a range of losses log loss would weight the points almost alike anyway.

The local fit (kind "local") is a piecewise power law through the measured points: the seeds' losses
at each compute averaged, made non-increasing in C (pool adjacent violators, weighted by the number of
points), then ln L linear in ln C between neighbouring computes. It assumes nothing beyond the points
(and is exact on a pure power law). It is used instead of the power law when

- there are fewer than 4 distinct computes: 3 parameters through <= 3 points leave no check on the form;
- the optimiser fails, or the fit ends on a bound that makes it ill-conditioned: E at min(L) (the
  points flatten out and E cannot be told from the last point) or alpha at 0 or 5. E at 0 (a pure power
  law) is a legitimate fit and is kept;
- the power law misses the points: its rms residual exceeds both twice the local fit's (which, through
  the per-compute means, holds the seeds' scatter) and 2% of the measured loss range.

``kind`` and ``reason`` say which was used and why. :func:`compute_for_loss` inverts the fit:
C_ref(L) = C0 ((L - E) / A')^(-1/alpha) for the power law, and returns None when L lies outside
[L(c_max), L(c_min)] (no extrapolation) or L <= E.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from analysis.curve_fit import fit_lc, geometric_mean, line_starts

ALPHA_MAX = 5.0  # upper bound of the compute exponent
MIN_POWER_LAW_COMPUTES = 4  # distinct computes below which the local fit is used
MISFIT_NOISE = 2.0  # power-law rms above this many times the local fit's (the seeds' scatter) ...
MISFIT_RANGE = 0.02  # ... and above this share of the loss range: the power law misses the points
E_STARTS = (0.0, 0.5, 0.8, 0.9, 0.95, 0.98)  # starts of E, as shares of min(L)
SOLVER = {"x_scale": "jac", "xtol": 1e-14, "ftol": 1e-14, "gtol": 1e-14, "max_nfev": 2000}  # least_squares


def fit_compute_curve(points: Sequence[tuple[float, float]], start: Optional[dict] = None) -> dict:
    """Fit L(C) to (C FLOPs, loss) points pooled over seeds: the power law E + A' (C/C0)^-alpha, or the
    local piecewise power law when the power law is ill-conditioned (module docstring). Returns
    {kind, reason, E, A, A_c0 (= A'), alpha, c0, c_min, c_max, l_min (fitted loss at c_max), l_max (at c_min),
    rms (residual, nats), n_points, n_computes, knots (local: {log_c, loss}; power law: None)}.
    Points with a non-finite or non-positive compute or loss are left out; raises ValueError with fewer than
    2 distinct computes left. ``start``: a power-law fit of (nearly) the same points to start from (a refit;
    the usual starts are tried only if it gives no usable power law)."""
    C, L = curve_points(points)
    return fit_curve(C, L, power_law_start(start))


def power_law_start(fit: Optional[dict]) -> Optional[tuple[float, float, float]]:
    """(E, a, alpha) of a power-law fit, the start of a refit; None for a local fit or none."""
    if fit is None or fit.get("kind") != "power_law":
        return None
    return fit["E"], math.log(fit["A_c0"]), fit["alpha"]


def curve_points(points: Sequence[tuple[float, float]]) -> tuple[np.ndarray, np.ndarray]:
    """(C, L) arrays of the points with a finite positive compute and loss."""
    arr = np.asarray([(float(c), float(v)) for c, v in points], dtype=float).reshape(-1, 2)
    ok = np.isfinite(arr).all(axis=1) & (arr > 0).all(axis=1)  # losses are cross-entropies: > 0
    return arr[ok, 0], arr[ok, 1]


def fit_curve(C: np.ndarray, L: np.ndarray, start: Optional[Sequence[float]] = None) -> dict:
    """:func:`fit_compute_curve` of arrays; ``start`` (E, a, alpha) is tried first and alone, the usual starts
    after it only if it does not give a usable power law (bootstrap refits start from the point fit)."""
    if len(np.unique(C)) < 2:
        raise ValueError(f"fit_compute_curve: {len(np.unique(C))} distinct computes among {len(C)} points "
                         "with finite positive compute and loss; a curve needs >= 2")
    c0 = geometric_mean(C)
    u = C / c0
    x = np.log(u)
    base = {"c0": c0, "c_min": float(C.min()), "c_max": float(C.max()), "n_points": int(len(C)),
            "n_computes": int(len(np.unique(C)))}
    if base["n_computes"] < MIN_POWER_LAW_COMPUTES:
        return _local(C, L, base, f"{base['n_computes']} distinct computes (< {MIN_POWER_LAW_COMPUTES})")
    theta, reason = _power_law(u, L, [start]) if start is not None else (None, "")
    if theta is None:
        theta, reason = _power_law(u, L, line_starts(u, L, E_STARTS, ALPHA_MAX))
    if theta is None:
        return _local(C, L, base, reason)
    E, a, alpha = (float(v) for v in theta)
    rms = _rms(L - (E + np.exp(a - alpha * x)))
    local = _local(C, L, base, "")
    if rms > max(MISFIT_NOISE * local["rms"], MISFIT_RANGE * float(np.ptp(L))):
        return {**local, "reason": f"the power law misses the points: rms residual {rms:.3g} nats against "
                f"{local['rms']:.3g} through the per-compute means, over a loss range of {np.ptp(L):.3g}"}
    return {**base, "kind": "power_law", "reason": "", "E": E, "A": math.exp(a + alpha * math.log(c0)),
            "A_c0": math.exp(a), "alpha": alpha, "l_min": float(E + math.exp(a - alpha * x.max())),
            "l_max": float(E + math.exp(a - alpha * x.min())), "rms": rms, "knots": None}


def _power_law(u: np.ndarray, L: np.ndarray, starts: Sequence) -> tuple[Optional[np.ndarray], str]:
    """Best least-squares (E, a, alpha) over the starts, or None and why when it is not usable."""
    l_lo = float(L.min())
    e_hi = l_lo - 1e-9 * max(1.0, abs(l_lo))
    if e_hi <= 0:
        return None, f"min loss {l_lo:g} leaves no room for E in [0, min L)"
    bounds = np.array([0.0, -np.inf, 0.0]), np.array([e_hi, np.inf, ALPHA_MAX])
    theta = fit_lc(u, L, starts, on="loss", bounds=bounds, **SOLVER)
    if theta is None:
        return None, "the optimiser failed"
    E, _, alpha = theta
    span = max(float(np.ptp(L)), 1e-12)
    if E > e_hi - 1e-3 * span:
        return None, f"power law ill-conditioned: E at its bound min(L) = {l_lo:.4g}"
    if alpha < 1e-3 or alpha > ALPHA_MAX - 1e-3:
        return None, f"power law ill-conditioned: alpha = {alpha:.4g} at a bound of (0, {ALPHA_MAX:g}]"
    return theta, ""


def _local(C: np.ndarray, L: np.ndarray, base: dict, reason: str) -> dict:
    """Piecewise power law through the per-compute means, made non-increasing in C."""
    cs, inv = np.unique(C, return_inverse=True)
    w = np.bincount(inv).astype(float)
    means = np.bincount(inv, weights=L) / w
    knots = _decreasing(means, w)
    lc = np.log(cs)
    pred = np.exp(np.interp(np.log(C), lc, np.log(knots)))
    return {**base, "kind": "local", "reason": reason, "E": None, "A": None, "A_c0": None, "alpha": None,
            "l_min": float(knots[-1]), "l_max": float(knots[0]), "rms": _rms(L - pred),
            "knots": {"log_c": lc.tolist(), "loss": knots.tolist()}}


def _decreasing(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted least-squares non-increasing fit of y (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [value, weight, count]
    for v, wt in zip(y.tolist(), w.tolist()):
        blocks.append([v, wt, 1])
        while len(blocks) > 1 and blocks[-2][0] < blocks[-1][0]:
            v2, w2, n2 = blocks.pop()
            v1, w1, n1 = blocks.pop()
            blocks.append([(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    return np.array([b[0] for b in blocks for _ in range(b[2])])


def _rms(r: np.ndarray) -> float:
    return float(np.sqrt(np.mean(r * r)))


def loss_at(fit: dict, compute: float) -> float:
    """L_ref(C) on the fit. Beyond [c_min, c_max] this extrapolates (the power law's formula, the local
    fit's end segments): fine for a margin 10% off the range, never used for a CEG."""
    if fit["kind"] == "power_law":
        return fit["E"] + fit["A_c0"] * (compute / fit["c0"]) ** -fit["alpha"]
    lc, ll = np.asarray(fit["knots"]["log_c"]), np.log(np.asarray(fit["knots"]["loss"]))
    x = math.log(compute)
    i = int(np.clip(np.searchsorted(lc, x) - 1, 0, len(lc) - 2))
    return float(math.exp(ll[i] + (ll[i + 1] - ll[i]) * (x - lc[i]) / (lc[i + 1] - lc[i])))


def compute_for_loss(fit: dict, loss: float) -> Optional[float]:
    """C_ref(loss): the compute at which the fitted reference reaches ``loss``; None outside the measured
    range [l_min, l_max] (no extrapolation) or at or below E."""
    tol = 1e-12 * max(1.0, abs(loss))
    if not math.isfinite(loss) or loss < fit["l_min"] - tol or loss > fit["l_max"] + tol:
        return None
    if fit["kind"] == "power_law":
        if loss <= fit["E"]:
            return None
        c = fit["c0"] * ((loss - fit["E"]) / fit["A_c0"]) ** (-1.0 / fit["alpha"])
        return float(min(max(c, fit["c_min"]), fit["c_max"]))
    lc, ll = fit["knots"]["log_c"], fit["knots"]["loss"]
    flat = [j for j, v in enumerate(ll) if abs(v - loss) <= tol]
    if len(flat) > 1:  # the loss of a flat stretch (pooled violators): its middle
        return float(math.exp((lc[flat[0]] + lc[flat[-1]]) / 2))
    i = next((j for j in range(len(lc) - 2) if ll[j] >= loss >= ll[j + 1] and ll[j] > ll[j + 1]), len(lc) - 2)
    if ll[i] == ll[i + 1]:
        return float(math.exp((lc[i] + lc[i + 1]) / 2))
    t = (math.log(loss) - math.log(ll[i])) / (math.log(ll[i + 1]) - math.log(ll[i]))
    return float(math.exp(lc[i] + min(max(t, 0.0), 1.0) * (lc[i + 1] - lc[i])))
