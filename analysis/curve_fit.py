"""The one fitter of L(C) = E + A' (C / c0)^-alpha (c0 the geometric mean of the measured C, so that A' is the
reducible loss in the middle of the range) and the one robust (Huber) loss. Two callers share them: the compute
curve behind the compute-equivalent gain (``analysis.compute_curve``) and a family's L(C) in the scaling study
(``analysis.scaling.fits.power_law``). Pure numpy and scipy, on arrays.

The callers fit differently, for their reasons (their module docstrings), and say so in the arguments of
:func:`fit_lc`:

- ``on``: where the residuals are taken. "loss": L_pred - L in nats over (E, ln A', alpha), E free down to 0
  (the compute curve: the noise of a measured loss is additive in nats, and E = 0 is a legitimate fit);
  "log": ln L_pred - ln L over (ln E, ln A', alpha) (the scaling study: Chinchilla's objective on log L);
- ``huber_delta``: the Huber threshold on those residuals (scaling: 1e-3), or None for plain least squares
  (the compute curve);
- ``starts``: the points to polish, from :func:`line_starts` (compute curve) or :func:`profile_start` and a
  grid (scaling); ``keep``: a point kept, unpolished, unless a polished start beats it (scaling keeps its
  profile start);
- ``bounds``, ``margin`` (how far inside the bounds a start is moved) and the ``solver`` options of
  ``scipy.optimize.least_squares`` (tolerances, ``x_scale``, ``max_nfev``).

Every start is polished by bounded least squares (``loss="huber"`` with ``f_scale = huber_delta``, or
``"linear"``); the best by :func:`robust_cost` over the residuals is returned.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np
from scipy.optimize import least_squares, nnls

ALPHA_GRID = np.geomspace(1e-3, 5.0, 240)  # the exponents of :func:`profile_start`


def huber(r: np.ndarray, delta: float) -> np.ndarray:
    """Huber loss of each residual: r^2 / 2 within delta, linear beyond."""
    a = np.abs(r)
    return np.where(a <= delta, 0.5 * r * r, delta * (a - 0.5 * delta))


def robust_cost(r: np.ndarray, delta: Optional[float]) -> float:
    """The summed :func:`huber` loss of the residuals; with ``delta`` None the least-squares cost r.r / 2
    (``least_squares``' own ``cost``)."""
    if delta is None:
        return 0.5 * np.dot(r, r)
    return float(huber(r, delta).sum())


def geometric_mean(C: np.ndarray) -> float:
    """c0 of the fit: the geometric mean of the computes."""
    return float(np.exp(np.mean(np.log(C))))


class _OnLoss:
    """Residuals L_pred - L over (E, ln A', alpha), L_pred = E + exp(ln A' - alpha ln u)."""

    def __init__(self, u: np.ndarray, L: np.ndarray):
        self.x, self.L = np.log(u), L

    def __call__(self, t: np.ndarray) -> np.ndarray:
        return t[0] + np.exp(t[1] - t[2] * self.x) - self.L

    def jac(self, t: np.ndarray) -> np.ndarray:
        p = np.exp(t[1] - t[2] * self.x)
        return np.stack([np.ones_like(self.x), p, -self.x * p], axis=1)


class _OnLog:
    """Residuals ln L_pred - ln L over (ln E, ln A', alpha), L_pred = exp(ln E) + exp(ln A') u^-alpha."""

    def __init__(self, u: np.ndarray, L: np.ndarray):
        self.u, self.log_L = u, np.log(L)

    def __call__(self, t: np.ndarray) -> np.ndarray:
        log_E, log_A, alpha = t
        return np.log(np.exp(log_E) + np.exp(log_A) * self.u ** (-alpha)) - self.log_L

    def jac(self, t: np.ndarray) -> np.ndarray:
        log_E, log_A, alpha = t
        E, power = np.exp(log_E), np.exp(log_A) * self.u ** (-alpha)
        m = E + power
        return np.stack([E / m, power / m, -power * np.log(self.u) / m], axis=1)  # (n, 3)


SPACES = {"loss": _OnLoss, "log": _OnLog}


def residuals(theta: np.ndarray, u: np.ndarray, L: np.ndarray, on: str) -> np.ndarray:
    """The residuals of :func:`fit_lc` at ``theta`` (``on`` "loss" or "log"), u = C / c0."""
    return SPACES[on](u, L)(np.asarray(theta, dtype=float))


def fit_lc(u: np.ndarray, L: np.ndarray, starts: Sequence, *, on: str, bounds: tuple, huber_delta: Optional[float]
           = None, keep: Optional[Sequence[float]] = None, margin: float = 0.0, **solver) -> Optional[np.ndarray]:
    """The best (E or ln E, ln A', alpha) of L at u = C / c0: each start clipped ``margin`` inside ``bounds``
    and polished by ``least_squares`` (``solver``: its options), kept when its x and :func:`robust_cost` are
    finite and the cost is the lowest so far (``keep``, unpolished, is the first best). None when nothing
    finite is left."""
    res_fn = SPACES[on](u, L)
    lo, hi = bounds
    best, best_cost = None, math.inf
    if keep is not None:
        best = np.asarray(keep, dtype=float)
        best_cost = robust_cost(res_fn(best), huber_delta)
    robust = {"loss": "huber", "f_scale": huber_delta} if huber_delta is not None else {}
    for t0 in starts:
        t0 = np.clip(np.asarray(t0, dtype=float), np.add(lo, margin), np.subtract(hi, margin))
        try:
            r = least_squares(res_fn, t0, jac=res_fn.jac, bounds=(lo, hi), **robust, **solver)
        except (ValueError, FloatingPointError, np.linalg.LinAlgError):
            continue
        cost = robust_cost(res_fn(r.x), huber_delta)
        # a polish that spent its evaluation budget (status 0) counts: in the flat E-A valley it is still usable
        if np.all(np.isfinite(r.x)) and np.isfinite(cost) and cost < best_cost:
            best, best_cost = r.x, cost
    return best if best is not None and np.all(np.isfinite(best)) else None


def line_starts(u: np.ndarray, L: np.ndarray, e_shares: Sequence[float], alpha_max: float) -> list[np.ndarray]:
    """(E, ln A', alpha) starts on the "loss" scale: per E a share of min(L), the least-squares line of
    ln(L - E) on ln u (alpha clipped to [0.01, alpha_max - 0.1])."""
    out: list[np.ndarray] = []
    if L.min() <= 0:
        return out
    x = np.log(u)
    for share in e_shares:
        E = share * float(L.min())
        slope, icpt = np.polyfit(x, np.log(L - E), 1)
        out.append(np.array([E, icpt, float(np.clip(-slope, 0.01, alpha_max - 0.1))]))
    return out


def profile_start(u: np.ndarray, L: np.ndarray, huber_delta: float) -> tuple[float, float, float]:
    """A global (ln E, ln A', alpha) start on the "log" scale: for each alpha of ``ALPHA_GRID``, (E, A') >= 0
    by iteratively reweighted non-negative least squares on relative residuals (~ log residuals, Huber
    weights); keep the alpha with the lowest Huber loss on log L. For fixed alpha the model is linear in
    (E, A'), so this explores the flat E-A valley that trips local optimisers."""
    best, best_obj = None, math.inf
    log_L = np.log(L)
    for alpha in ALPHA_GRID:
        M = np.stack([np.ones_like(u), u ** (-alpha)], axis=1) / L[:, None]  # rows: (1, u^-alpha) / L
        w = np.ones_like(L)
        for _ in range(3):
            (E, A), _ = nnls(M * np.sqrt(w)[:, None], np.sqrt(w))
            r = np.log(np.maximum(E + A * u ** (-alpha), 1e-12)) - log_L
            w = np.where(np.abs(r) <= huber_delta, 1.0, huber_delta / np.maximum(np.abs(r), 1e-300))
        obj = robust_cost(r, huber_delta)
        if obj < best_obj:
            best, best_obj = (math.log(max(E, 1e-6)), math.log(max(A, 1e-12)), float(alpha)), obj
    return best
