"""L(C) = E + A C^-alpha of one family: a Huber fit on log L from a profile start (the shared L(C) fitter,
``analysis.curve_fit``, on the log scale), with 95% bootstrap intervals over points (or over residuals when there
are few points).

The fit and its intervals: docs/methods/scaling.md.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Optional, Sequence

import numpy as np

from analysis.curve_fit import fit_lc, geometric_mean, profile_start, residuals
from analysis.scaling.fits.common import NEGLIGIBLE, _log_ci, bound_flags, bound_thresholds, reported_status

MIN_POINTS = 4  # 3 parameters (E, A, alpha) + at least one degree of freedom
PAIRS_MIN_POINTS = 6  # below this, bootstrap the residuals instead of the points (see _bootstrap)


@dataclass
class PowerLawFit:
    """L(C) = E + A * C^(-alpha), with C in FLOPs and L in nats/token.

    ``A`` is stated for C in FLOPs; ``A_ref`` is the same amplitude for C measured in units of
    ``c_ref`` (the geometric mean of the fitted C values), which is the better-conditioned number
    to read: at C = c_ref the reducible loss is A_ref.
    """

    n_points: int
    status: str  # "ok" | "under-determined" | "failed"; tables and fits.json show reported_status (flags)
    message: str = ""
    E: Optional[float] = None
    A: Optional[float] = None
    alpha: Optional[float] = None
    c_ref: Optional[float] = None
    A_ref: Optional[float] = None
    ci: dict = field(default_factory=dict)  # name -> [lo, hi] (95% bootstrap percentile interval)
    n_boot: int = 0  # bootstrap resamples that gave a fit
    ci_method: str = ""  # "points" (pairs bootstrap) or "residuals" (few points), see _bootstrap
    rms_log_residual: Optional[float] = None
    flags: list = field(default_factory=list)  # parameters at an optimiser bound: "interval at bound (alpha <= 5)"
    samples: Optional[np.ndarray] = field(default=None, repr=False)  # (n_boot, 3): E, A_ref, alpha

    def to_json(self) -> dict:
        d = asdict(self)
        d.pop("samples")
        d["status"] = reported_status(self)
        return d

    def band(self, C: np.ndarray, q: tuple[float, float] = (2.5, 97.5)) -> Optional[tuple[np.ndarray, np.ndarray]]:
        """Pointwise 95% band of the fitted loss at C over the bootstrap fits (None without them)."""
        if self.samples is None or len(self.samples) < 10:
            return None
        x = np.asarray(C, dtype=float)[None, :] / self.c_ref
        s = self.samples
        preds = s[:, :1] + s[:, 1:2] * x ** (-s[:, 2:3])  # (n_boot, len(C))
        return np.percentile(preds, q[0], axis=0), np.percentile(preds, q[1], axis=0)

    def predict(self, C: np.ndarray) -> np.ndarray:
        """Fitted loss at compute C (FLOPs)."""
        if self.status != "ok":
            raise ValueError(f"no fitted curve: {self.status} ({self.message})")
        x = np.asarray(C, dtype=float) / self.c_ref
        return self.E + self.A_ref * x ** (-self.alpha)


E_MIN = 1e-6  # lower bound of E in the L(C) fit
LOG_A_REF_BOUND = 30.0  # |ln A_ref| bound
ALPHA_MAX = 5.0  # upper bound of alpha (lower: 0)


def _lc_bounds(L: np.ndarray) -> tuple[list, list]:
    """The optimiser's bounds on (ln E, ln A_ref, alpha): E in [E_MIN, the largest loss]."""
    return [math.log(E_MIN), -LOG_A_REF_BOUND, 0.0], [math.log(float(L.max())), LOG_A_REF_BOUND, ALPHA_MAX]


def lc_bound_flags(fit: PowerLawFit, L: np.ndarray) -> list[str]:
    """:func:`bound_flags` of an L(C) fit: ln E, ln A_ref and alpha (the optimiser's coordinates) against
    :func:`_lc_bounds`, from the estimate and the 95% interval; E under ``NEGLIGIBLE`` times the smallest
    loss is at its lower bound."""
    lo, hi = _lc_bounds(L)
    floor = math.log(NEGLIGIBLE * float(np.min(L)))
    return bound_flags([
        (math.log(fit.E), _log_ci(fit.ci.get("E")), *bound_thresholds(lo[0], hi[0], floor), f"E >= {E_MIN:g}",
         f"E <= {math.exp(hi[0]):.3g} (the largest loss)"),
        (math.log(fit.A_ref), _log_ci(fit.ci.get("A_ref")), *bound_thresholds(lo[1], hi[1]),
         f"A_ref >= e^-{LOG_A_REF_BOUND:g}", f"A_ref <= e^{LOG_A_REF_BOUND:g}"),
        (fit.alpha, fit.ci.get("alpha"), *bound_thresholds(lo[2], hi[2]), "alpha >= 0", f"alpha <= {ALPHA_MAX:g}")])


def _fit_once(x: np.ndarray, L: np.ndarray, huber_delta: float, extra_inits: Sequence[tuple] = (),
              max_nfev: int = 200) -> Optional[np.ndarray]:
    """Best (log E, log A_ref, alpha) by the shared L(C) fitter: the profile start and any extra starts (1e-9
    inside the bounds), each polished by bounded least squares with a Huber loss on log L, the profile start kept
    unless one beats it. None if every start fails."""
    start = np.asarray(profile_start(x, L, huber_delta))
    return fit_lc(x, L, [start, *extra_inits], on="log", bounds=_lc_bounds(L), huber_delta=huber_delta, keep=start,
                  margin=1e-9, method="trf", max_nfev=max_nfev)


def _init_grid(L: np.ndarray) -> list[tuple]:
    """Extra starting points: E a fraction of the lowest loss, alpha from shallow to steep."""
    inits = []
    for e_frac in (0.2, 0.6, 0.9):
        E0 = e_frac * float(L.min())
        A0 = max(float(np.mean(L)) - E0, 1e-3)
        for alpha0 in (0.05, 0.2, 0.5, 1.0):
            inits.append((math.log(E0), math.log(A0), alpha0))
    return inits


def fit_power_law(C: Sequence[float], L: Sequence[float], *, n_boot: int = 200, huber_delta: float = 1e-3,
                  seed: int = 0) -> PowerLawFit:
    """Fit L(C) = E + A * C^(-alpha) robustly on log L; bootstrap the points for 95% intervals.

    C: training FLOPs of each point (> 0); L: its loss (> 0). Points are (C, L) pairs; the
    bootstrap resamples pairs with replacement and skips resamples with fewer than
    ``MIN_POINTS`` distinct C values (they cannot determine three parameters).
    """
    C = np.asarray(C, dtype=float)
    L = np.asarray(L, dtype=float)
    n = len(C)
    if len(L) != n:
        raise ValueError(f"fit_power_law: {n} compute values but {len(L)} losses")
    if n and (np.any(~np.isfinite(C)) or np.any(C <= 0) or np.any(~np.isfinite(L)) or np.any(L <= 0)):
        raise ValueError("fit_power_law: compute and loss must be finite and positive "
                         "(drop failed or diverged runs before fitting)")
    n_distinct = len(np.unique(C))
    if n_distinct < MIN_POINTS:
        return PowerLawFit(n_points=n, status="under-determined",
                           message=f"{n_distinct} distinct compute values; 3 parameters need >= {MIN_POINTS}")
    c_ref = geometric_mean(C)
    x = C / c_ref
    theta = _fit_once(x, L, huber_delta, _init_grid(L)[::3], max_nfev=500)
    if theta is None:
        return PowerLawFit(n_points=n, status="failed", message="least squares did not converge from any start")
    fit = _to_fit(theta, n, c_ref)
    fit.rms_log_residual = float(np.sqrt(np.mean(residuals(theta, x, L, "log") ** 2)))
    _bootstrap(fit, theta, x, L, n_boot, huber_delta, seed)
    fit.flags = lc_bound_flags(fit, L)
    return fit


def _to_fit(theta: np.ndarray, n: int, c_ref: float) -> PowerLawFit:
    log_E, log_A_ref, alpha = (float(v) for v in theta)
    A_ref = math.exp(log_A_ref)
    return PowerLawFit(n_points=n, status="ok", E=math.exp(log_E), alpha=alpha, c_ref=c_ref, A_ref=A_ref,
                       A=A_ref * c_ref ** alpha)


def _bootstrap(fit: PowerLawFit, theta: np.ndarray, x: np.ndarray, L: np.ndarray, n_boot: int,
               huber_delta: float, seed: int) -> None:
    """Fill ``fit.ci`` with 95% percentile intervals of E, A_ref and alpha.

    With at least ``PAIRS_MIN_POINTS`` distinct compute values the points themselves are
    resampled. With fewer, almost every resample that still has four distinct points is the
    original set again, so those intervals would be falsely narrow; the residuals (on log L,
    inflated by sqrt(n / (n - 3)) for the three fitted parameters) are resampled instead.
    """
    rng = np.random.default_rng(seed)
    n = len(x)
    log_fit = np.log(fit.E + fit.A_ref * x ** (-fit.alpha))
    resid = np.log(L) - log_fit
    resid = (resid - resid.mean()) * math.sqrt(n / max(n - 3, 1))
    pairs = len(np.unique(x)) >= PAIRS_MIN_POINTS
    fit.ci_method = "points" if pairs else "residuals"
    inits = [tuple(theta)]  # the full fit is a good start for a resample (next to its own profile start)
    samples = []
    for _ in range(n_boot):
        if pairs:
            idx = rng.integers(0, n, n)
            if len(np.unique(x[idx])) < MIN_POINTS:
                continue
            xb, Lb = x[idx], L[idx]
        else:
            xb, Lb = x, np.exp(log_fit + resid[rng.integers(0, n, n)])
        t = _fit_once(xb, Lb, huber_delta, inits, max_nfev=100)
        if t is not None:
            samples.append((math.exp(t[0]), math.exp(t[1]), t[2]))
    fit.n_boot = len(samples)
    if len(samples) >= 10:
        s = np.asarray(samples)
        fit.samples = s
        for j, name in enumerate(("E", "A_ref", "alpha")):
            fit.ci[name] = [float(np.percentile(s[:, j], 2.5)), float(np.percentile(s[:, j], 97.5))]
