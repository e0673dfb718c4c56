"""A power law through points, log y = log c + a log x, with a bootstrap interval of the slope: N*(C)
through the IsoFLOP minima (approach 2) and N against C on the envelope (approach 1)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Optional, Sequence

import numpy as np

from analysis.scaling.fits.common import (
    NO_FINITE,
    OK,
    ONE_BUDGET,
    TOO_FEW_POINTS,
    Q,
    _finite_positive,
    _interval,
    json_safe,
)


@dataclass
class LogLogFit:
    """y = prefactor * x^slope fitted as a line in log-log, with a 95% interval on the slope."""

    status: str
    message: str = ""
    n_points: int = 0
    slope: Optional[float] = None
    log_prefactor: Optional[float] = None
    ci: dict = field(default_factory=dict)  # slope, log_prefactor
    n_boot: int = 0
    ci_method: str = ""  # "per-point samples" | "residuals" | ""
    samples: Optional[np.ndarray] = field(default=None, repr=False)  # (n_boot, 2): slope, log_prefactor

    def to_json(self) -> dict:
        d = asdict(self)
        d.pop("samples")
        return json_safe(d)

    def predict(self, x) -> np.ndarray:
        if self.status != OK:
            raise ValueError(f"no fitted power law: {self.status} ({self.message})")
        return np.exp(self.log_prefactor) * np.asarray(x, dtype=float) ** self.slope

    def band(self, x) -> Optional[tuple[np.ndarray, np.ndarray]]:
        if self.samples is None:
            return None
        lx = np.log(np.asarray(x, dtype=float))[None, :]
        pred = np.exp(self.samples[:, 1:2] + self.samples[:, :1] * lx)
        return np.percentile(pred, Q[0], axis=0), np.percentile(pred, Q[1], axis=0)


def fit_log_log(x: Sequence[float], y: Sequence[float], *, log_y_samples: Optional[Sequence[np.ndarray]] = None,
                n_boot: int = 200, seed: int = 0, what: str = "points") -> LogLogFit:
    """Least-squares line ln y = ln c + slope ln x. Interval: with ``log_y_samples`` (one array of
    bootstrap draws of ln y per point, e.g. each IsoFLOP minimum's) refit the line on one draw per
    point per replicate; else, with >= 3 points, resample the residuals (inflated by
    sqrt(n / (n - 2))); with 2 points and no draws: no interval."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    ok = _finite_positive(x, y)
    n = int(ok.sum())
    if n == 0:
        return LogLogFit(status=NO_FINITE, message=f"no {what} with finite, positive values")
    if n == 1:
        return LogLogFit(status=ONE_BUDGET if what == "budgets" else TOO_FEW_POINTS, n_points=1,
                         message=f"one {what[:-1]}: a slope needs >= 2")
    lx, ly = np.log(x[ok]), np.log(y[ok])
    if np.ptp(lx) == 0:
        return LogLogFit(status=TOO_FEW_POINTS, n_points=n, message=f"all {what} have one x value")
    slope, icpt = np.polyfit(lx, ly, 1)
    fit = LogLogFit(status=OK, n_points=n, slope=float(slope), log_prefactor=float(icpt))
    rng = np.random.default_rng(seed)
    samples = []
    if log_y_samples is not None:
        draws = [np.asarray(s, dtype=float) for s, k in zip(log_y_samples, ok) if k]
        if all(len(s) >= 10 for s in draws):
            fit.ci_method = "per-point samples"
            skipped = 0
            for _ in range(n_boot):
                yb = np.array([s[rng.integers(0, len(s))] for s in draws])
                if not np.all(np.isfinite(yb)):
                    skipped += 1
                    continue
                samples.append(np.polyfit(lx, yb, 1))
            if skipped:
                fit.message = f"{skipped} of {n_boot} replicates had an unbounded {what[:-1]} minimum and were left out"
    if not fit.ci_method and n >= 3:
        fit.ci_method = "residuals"
        pred = np.polyval([slope, icpt], lx)
        r = (ly - pred) * math.sqrt(n / (n - 2))
        for _ in range(n_boot):
            samples.append(np.polyfit(lx, pred + r[rng.integers(0, n, n)], 1))
    if not fit.ci_method:
        fit.message = f"2 {what} and no per-point uncertainty: no interval"
    fit.n_boot = len(samples)
    if len(samples) >= 10:
        fit.samples = np.asarray(samples)
        fit.ci = {"slope": _interval(fit.samples[:, 0]), "log_prefactor": _interval(fit.samples[:, 1])}
    return fit
