"""The compute-optimal allocation of a fitted L(N, D) when each size has its own training FLOPs per token.

Chinchilla's closed form (:func:`analysis.scaling.fits.loss_nd.compute_optimal`) assumes C = k N D with one
k. archlab's cost model counts what a size really spends: attention and the LM head make FLOPs per token
per parameter fall with width (84 to 10 for non-embedding N at d_model 8 to 168; 3.9 to 4.8 for total N).
Here C = F(N) D, F interpolated in log-log through a family's measured sizes (and extended along its
end segments); a family trained on several shapes (sweep ladders: depth/width rules) has one such curve per
shape, and F(N) is the cheapest shape's (:class:`CheapestShape`). N_opt(C) = argmin_N L(N, C / F(N)) is found
numerically; a is the slope of ln N_opt against ln C over a stated compute range (the study's: F is piecewise, so a
local slope would jump at its knots), or its local slope without one. With F = k N everything reduces to
the closed form (tested).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import numpy as np

from analysis.scaling.fits.common import DEGENERATE, OK, _interval, n_opt_flags
from analysis.scaling.fits.loss_nd import ComputeOptimal, NDFit

LOG_N_GRID = np.linspace(math.log(1e2), math.log(1e13), 6001)  # the optimum's search grid: step 0.005 in ln N
SLOPE_STEP = 0.5  # ln C either side of C for the local slope


@dataclass(frozen=True)
class FlopsPerToken:
    """Training FLOPs per token F(N), log-log linear between measured sizes, along the end segments beyond."""

    log_N: tuple
    log_F: tuple

    @classmethod
    def measured(cls, N: Sequence[float], F: Sequence[float]) -> "FlopsPerToken":
        """Through each distinct size's FLOPs per token (the median where one N has several)."""
        pairs: dict[float, list] = {}
        for n, f in zip(N, F):
            if n > 0 and f > 0 and math.isfinite(n) and math.isfinite(f):
                pairs.setdefault(float(n), []).append(float(f))
        if not pairs:
            raise ValueError("FlopsPerToken.measured: no size with a positive N and FLOPs per token")
        ns = sorted(pairs)
        return cls(tuple(math.log(n) for n in ns), tuple(math.log(float(np.median(pairs[n]))) for n in ns))

    @classmethod
    def proportional(cls, k: float) -> "FlopsPerToken":
        """F = k N (Kaplan's and Chinchilla's C = 6 N D with k = 6)."""
        return cls((0.0, 1.0), (math.log(k), math.log(k) + 1.0))

    def __call__(self, N) -> np.ndarray:
        return np.exp(self.log_of(np.log(np.asarray(N, dtype=float))))

    def log_of(self, x: np.ndarray) -> np.ndarray:
        """ln F at ln N = x."""
        xs, ys = np.asarray(self.log_N), np.asarray(self.log_F)
        if len(xs) == 1:  # one size: F proportional to N through it
            return ys[0] + (x - xs[0])
        y = np.interp(x, xs, ys)
        lo_slope = (ys[1] - ys[0]) / (xs[1] - xs[0])
        hi_slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        y = np.where(x < xs[0], ys[0] + lo_slope * (x - xs[0]), y)
        return np.where(x > xs[-1], ys[-1] + hi_slope * (x - xs[-1]), y)

    def to_json(self) -> dict:
        return {"N": [math.exp(x) for x in self.log_N], "flops_per_token": [math.exp(y) for y in self.log_F]}


@dataclass(frozen=True)
class CheapestShape:
    """F(N) of a family trained at several shapes (e.g. 2 and 4 layers over the same widths): each shape's
    own :class:`FlopsPerToken`, and at each N the lowest of them.

    One log-log curve through sizes of different shapes would zigzag (at equal N a deeper model spends more
    per token), putting false kinks in N_opt(C). A law fitted over the shapes says the loss depends on N and D
    alone; under it the compute-optimal model at C is built the cheapest way the study trained."""

    shapes: tuple  # ((label, FlopsPerToken), ...), sorted by label

    def __call__(self, N) -> np.ndarray:
        return np.exp(self.log_of(np.log(np.asarray(N, dtype=float))))

    def log_of(self, x: np.ndarray) -> np.ndarray:
        """ln F at ln N = x: the cheapest shape's."""
        return np.min([f.log_of(x) for _, f in self.shapes], axis=0)

    def to_json(self) -> dict:
        return {"rule": "at each N the cheapest shape's F", "shapes": {label: f.to_json() for label, f in self.shapes}}


FPT = Union[FlopsPerToken, CheapestShape]  # what the allocation reads F(N) from


def flops_per_token(N: Sequence[float], F: Sequence[float], shapes: Optional[Sequence[str]] = None):
    """F(N) through measured sizes: one :class:`FlopsPerToken`, or a :class:`CheapestShape` where ``shapes``
    (one label per size: its sweep ladder) names more than one shape."""
    labels = list(shapes) if shapes is not None else []
    if len(set(labels)) <= 1:
        return FlopsPerToken.measured(N, F)
    if len(labels) != len(N):
        raise ValueError(f"flops_per_token: {len(labels)} shape labels for {len(N)} sizes")
    by: dict[str, tuple[list, list]] = {}
    for n, f, label in zip(N, F, labels):
        by.setdefault(str(label), ([], []))
        by[str(label)][0].append(n)
        by[str(label)][1].append(f)
    return CheapestShape(tuple((label, FlopsPerToken.measured(*by[label])) for label in sorted(by)))


def _n_opt(E, A, alpha, B, beta, C, fpt: FPT) -> np.ndarray:
    """ln N_opt at compute C for each law (arrays of shape (S,)), on :data:`LOG_N_GRID` refined by a parabola."""
    x = LOG_N_GRID
    log_D = math.log(C) - fpt.log_of(x)  # (G,)
    with np.errstate(over="ignore", invalid="ignore"):
        L = (A[:, None] * np.exp(-alpha[:, None] * x[None, :])
             + B[:, None] * np.exp(-beta[:, None] * log_D[None, :]))  # E adds nothing to the argmin
    L = np.where(np.isfinite(L), L, np.inf)
    i = np.clip(np.argmin(L, axis=1), 1, len(x) - 2)
    rows = np.arange(len(i))
    y0, y1, y2 = L[rows, i - 1], L[rows, i], L[rows, i + 1]
    denom = y0 - 2 * y1 + y2
    with np.errstate(divide="ignore", invalid="ignore"):
        shift = np.where(denom > 0, 0.5 * (y0 - y2) / denom, 0.0)
    return x[i] + np.clip(shift, -1, 1) * (x[1] - x[0])


def allocation(E, A, alpha, B, beta, C: float, fpt: FPT,
               C_range: Optional[tuple] = None) -> dict:
    """N_opt, D_opt, D/N, L_opt at C = F(N) D and the exponents a (of N_opt) and b (of D_opt) in C: their
    log-log slopes over ``C_range`` (lo, hi), or at C (over C e^-0.5 .. C e^0.5) without one; for one law or
    arrays of laws."""
    E, A, alpha, B, beta = (np.atleast_1d(np.asarray(v, dtype=float)) for v in (E, A, alpha, B, beta))
    x = _n_opt(E, A, alpha, B, beta, C, fpt)
    c_lo, c_hi = (C * math.exp(-SLOPE_STEP), C * math.exp(SLOPE_STEP)) if C_range is None else C_range
    span = math.log(c_hi / c_lo)
    x_lo = _n_opt(E, A, alpha, B, beta, c_lo, fpt)
    x_hi = _n_opt(E, A, alpha, B, beta, c_hi, fpt)
    N = np.exp(x)
    D = C / fpt(N)
    a = (x_hi - x_lo) / span
    b = ((fpt.log_of(x_lo) - fpt.log_of(x_hi)) + span) / span
    with np.errstate(over="ignore", invalid="ignore"):
        L = E + A * N ** (-alpha) + B * D ** (-beta)
    return {"a": a, "b": b, "N_opt": N, "D_opt": D, "tokens_per_param": D / N, "L_opt": L, "k": fpt(N) / N}


def loss_opt(fit: NDFit, C: float, fpt: FPT) -> float:
    """The fitted law's compute-optimal loss at C = F(N) D."""
    return float(allocation(fit.E, fit.A, fit.alpha, fit.B, fit.beta, C, fpt)["L_opt"][0])


def compute_to_reach(fit: NDFit, L: float, fpt: FPT, C_hint: float) -> float:
    """The compute C at which ``fit``'s compute-optimal loss is L (bisection in ln C; L_opt falls with C).
    inf when L is at or below the law's E; NaN when no C in 1e-6 to 1e6 times ``C_hint`` reaches it."""
    if not L > fit.E:
        return math.inf
    lo, hi = math.log(C_hint) - 14.0, math.log(C_hint) + 14.0
    if loss_opt(fit, math.exp(lo), fpt) < L or loss_opt(fit, math.exp(hi), fpt) > L:
        return math.nan
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if loss_opt(fit, math.exp(mid), fpt) > L:
            lo = mid
        else:
            hi = mid
    return math.exp(0.5 * (lo + hi))


def measured_multiplier(ref: NDFit, other: NDFit, C: float, fpt_ref: FPT, fpt_other: FPT) -> float:
    """How many times the compute the reference needs for the loss ``other`` reaches compute-optimally at C,
    each family at its own sizes' FLOPs per token. NaN without both fits; inf when the other beats the
    reference's E."""
    if ref.status != OK or other.status != OK or not (ref.alpha > 0 and ref.beta > 0 and other.alpha > 0
                                                      and other.beta > 0):
        return math.nan
    L_other = loss_opt(other, C, fpt_other)
    if not math.isfinite(L_other):
        return math.nan
    return compute_to_reach(ref, L_other, fpt_ref, C) / C


def measured_optimum(fit: NDFit, C: float, fpt: FPT, k_note: Optional[str] = None,
                     C_range: Optional[tuple] = None) -> ComputeOptimal:
    """:class:`ComputeOptimal` at C = F(N) D (``k``: F / N at the optimum; a and b over ``C_range``, see
    :func:`allocation`; ``G`` has no closed form here and stays empty), intervals over the fit's bootstrap
    draws."""
    if fit.status != OK:
        return ComputeOptimal(status=fit.status, message=f"no L(N, D) fit: {fit.message}", C=C)
    if not (fit.alpha > 0 and fit.beta > 0):
        return ComputeOptimal(status=DEGENERATE, C=C,
                              message=f"alpha = {fit.alpha:.3g}, beta = {fit.beta:.3g}: no interior optimum")
    point = {key: float(v[0]) for key, v in allocation(fit.E, fit.A, fit.alpha, fit.B, fit.beta, C, fpt,
                                                       C_range).items()}
    out = ComputeOptimal(status=OK, C=float(C), **point)
    out.flags = n_opt_flags(out.N_opt, fit.N_range) + [f"L(N, D): {f}" for f in fit.flags]
    if fit.samples is not None:
        E, A, alpha, B, beta = fit.samples.T
        good = (alpha > 0) & (beta > 0)
        per = allocation(E[good], A[good], alpha[good], B[good], beta[good], C, fpt, C_range)
        out.ci = {key: _interval(v) for key, v in per.items()}
        if (~good).any():
            out.message = f"{int((~good).sum())} bootstrap fits with a zero exponent left out"
    if k_note:
        out.message = "; ".join(m for m in (out.message, k_note) if m)
    return out
