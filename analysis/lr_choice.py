"""The lr chosen from the whole tuning grid, with an interval on it: a weighted least-squares parabola in log lr
through every finite grid point, its minimum taken inside the bracket (between the best point's neighbours), and
a Fieller interval on where that minimum lies, with the loss the parabola says each end of the interval costs.

One tuning run per lr differs from its neighbours by its seed's luck as well as by its lr; the grid's argmin follows
that luck when neighbouring losses differ by less than the seed sd. A parabola fitted to every point averages it,
and its minimum x* = -b / (2 a) (loss = a x^2 + b x + c, x = ln lr) carries the fit's uncertainty. The interval is
the set of x0 at which the fitted slope b + 2 a x0 is not distinguishable from 0 at the level asked (Fieller's
method: exact for normal noise on a true parabola, where the delta method is not when the curvature is uncertain).
Where that set reaches past an end of the grid, that side is open: the grid does not bound the optimum there.

The seed sd that weights the points and scales the interval comes from, in this order: repeated lrs in the grid
(the pooled sd within them), the caller's ``noise_sd`` (the report passes the seeded runs' pooled sd), the
parabola's own residuals (when more than 3 distinct lrs). Where the residuals say the noise is larger than the
sd given (a reduced chi-square above 1: a curve the parabola does not follow, or a seed sd too small), the sd is
scaled up by it (the Birge ratio), so lack of fit widens the interval instead of hiding behind a small sd.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Optional, Sequence

import numpy as np
from scipy import stats

LEVEL = 0.8  # the interval's two-sided coverage
LACK_OF_FIT_P = 0.05  # residuals this unlikely under the sd given scale it up (the Birge ratio)


def choose(lrs: Sequence[float], losses: Sequence[Optional[float]], noise_sd: Optional[float] = None,
           level: float = LEVEL) -> dict:
    """{lr, grid_lr, kind ("parabola" | "grid"), reason, points, coef, curvature, sd, sd_from, level, low, high,
    open_low, open_high, cost_low, cost_high, flat_low, flat_high}.

    ``lrs`` non-decreasing (a repeated lr: several seeds at it); ``losses`` None or inf for runs that diverged or did
    not learn (left out of the fit). ``lr``: the parabola's minimum, clamped to the bracket; the grid's best when it is
    at an end of the grid, fewer than 3 distinct finite lrs exist, or the parabola does not curve upwards. ``low`` /
    ``high``: the ``level`` interval on the optimal lr, clipped to the grid (``open_*``: it reaches past that end);
    ``cost_*``: the fitted loss there above the fitted loss at ``lr`` (nats). ``flat_*``: where the parabola is within
    one sd of its minimum. Interval keys are None where no sd is known."""
    vals = [math.inf if v is None or not math.isfinite(v) else float(v) for v in losses]
    i = int(np.argmin(vals))
    out = {"lr": float(lrs[i]), "grid_lr": float(lrs[i]), "kind": "grid", "reason": "", "points": 1, "coef": None,
           "curvature": None, "sd": None, "sd_from": None, "level": level, "low": None, "high": None,
           "open_low": False, "open_high": False, "cost_low": None, "cost_high": None, "flat_low": None,
           "flat_high": None}
    if not math.isfinite(vals[i]):
        return {**out, "reason": "no lr learned"}
    groups = _by_lr(lrs, vals)
    x = np.log(list(groups))
    y = np.array([np.mean(v) for v in groups.values()])
    n_at = np.array([len(v) for v in groups.values()], dtype=float)
    out["points"] = int(n_at.sum())
    # an end of the whole grid (a diverged or not-learned lr beyond the best bounds that side: it is the worst)
    edge = "low" if lrs[i] == min(lrs) else "high" if lrs[i] == max(lrs) else None
    x_lo, x_hi = math.log(min(lrs)), math.log(max(lrs))  # the grid's range, every lr tried
    if len(x) < 3:
        out["reason"] = f"{len(x)} finite lr{'s' if len(x) != 1 else ''} (a parabola needs 3)"
        if edge:  # nothing bounds the optimum on that side
            out.update(low=float(lrs[i]), high=float(lrs[i]), open_low=edge == "low", open_high=edge == "high")
        else:  # the best's neighbours in the grid (worse, or diverged) bound it
            out.update(low=max(v for v in lrs if v < lrs[i]), high=min(v for v in lrs if v > lrs[i]))
        return out
    sd, sd_from, df = _seed_sd(groups, noise_sd)
    coef, cov, chi2_red = _fit(x, y, n_at, sd or 1.0)
    a, b, c = coef
    if not a > 0:
        out["reason"] = "the points do not curve upwards (flat or noisy): the grid's best"
        if edge:  # nothing bounds the optimum on that side: the interval starts at the edge and is open
            out.update(reason="the best lr is at an end of the grid (not bracketed)", low=float(lrs[i]),
                       high=float(lrs[i]), open_low=edge == "low", open_high=edge == "high")
        return out
    if sd is None and len(x) > 3:  # the residuals are the only estimate of the noise
        sd, sd_from, df = math.sqrt(chi2_red), "the parabola's residuals", len(x) - 3
        cov = cov * chi2_red
    elif sd is not None and len(x) > 3 and stats.chi2.sf(chi2_red * (len(x) - 3), len(x) - 3) < LACK_OF_FIT_P:
        # the points scatter more than the sd says: a curve the parabola does not follow, or too small an sd
        cov, sd_from = cov * chi2_red, f"{sd_from}, scaled by the fit's reduced chi-square {chi2_red:.2g}"
        sd = sd * math.sqrt(chi2_red)
    out.update(kind="parabola", curvature=float(a), coef=[float(a), float(b), float(c)], sd=sd, sd_from=sd_from)
    lo_x = math.log(max((v for v in lrs if v < lrs[i]), default=lrs[i]))  # the bracket: the best's grid neighbours
    hi_x = math.log(min((v for v in lrs if v > lrs[i]), default=lrs[i]))
    x_star = float(np.clip(-b / (2 * a), lo_x, hi_x))
    if edge:  # the optimum is not bracketed: no extrapolation; the grid extends there (tools.experiment_tuning)
        out.update(kind="grid", reason="the best lr is at an end of the grid (not bracketed)")
        x_star = math.log(lrs[i])
    else:
        out["lr"] = math.exp(x_star)
    if sd is not None:
        q = stats.norm.ppf(0.5 + level / 2) if df is None else stats.t.ppf(0.5 + level / 2, df)
        low, high = _fieller(coef, cov, q)
        open_low, open_high = low < x_lo or edge == "low", high > x_hi or edge == "high"
        low, high = max(low, x_lo), min(high, x_hi)
        if edge == "high":
            low = min(low, x_star)
        if edge == "low":
            high = max(high, x_star)
        out.update(low=math.exp(low), high=math.exp(high), open_low=bool(open_low), open_high=bool(open_high),
                   cost_low=_rise(coef, low, x_star), cost_high=_rise(coef, high, x_star))
        f_lo, f_hi = _within(coef, sd, x_star)
        out.update(flat_low=math.exp(max(f_lo, x.min())), flat_high=math.exp(min(f_hi, x.max())),
                   flat_open_low=f_lo < x.min(), flat_open_high=f_hi > x.max())
    return out


def regret(res: dict, lr: float) -> Optional[float]:
    """The fitted loss at ``lr`` above the fitted loss at the chosen lr (nats): what training at ``lr`` instead
    costs on the parabola; None without one."""
    if not res.get("coef"):
        return None
    return _rise(res["coef"], math.log(lr), math.log(res["lr"]))


def _by_lr(lrs: Sequence[float], vals: Sequence[float]) -> dict[float, list[float]]:
    """{lr: its finite losses}, lrs in increasing order, those without a finite loss left out."""
    groups: dict[float, list[float]] = defaultdict(list)
    for lr, v in zip(lrs, vals):
        if math.isfinite(v):
            groups[float(lr)].append(v)
    return dict(sorted(groups.items()))


def _seed_sd(groups: dict, noise_sd: Optional[float]) -> tuple[Optional[float], Optional[str], Optional[int]]:
    """(sd, where it came from, its degrees of freedom: None when taken as known): repeated lrs first, then
    ``noise_sd``; (None, None, None) when neither (the residuals decide, :func:`choose`)."""
    ss = sum(float(np.sum((np.array(v) - np.mean(v)) ** 2)) for v in groups.values())
    df = sum(len(v) - 1 for v in groups.values())
    if df > 0 and ss > 0:
        return math.sqrt(ss / df), f"repeated lrs ({df} degrees of freedom)", df
    if noise_sd is not None and noise_sd > 0:
        return float(noise_sd), "the seed sd given", None
    return None, None, None


def _fit(x: np.ndarray, y: np.ndarray, n_at: np.ndarray, sd: float) -> tuple[np.ndarray, np.ndarray, float]:
    """Weighted least squares of y = a x^2 + b x + c (the mean of n_at runs at each x has variance sd^2 / n_at):
    (coef [a, b, c], their covariance, the reduced chi-square of the residuals; 1.0 with no residual freedom)."""
    X = np.stack([x * x, x, np.ones_like(x)], axis=1)
    w = n_at / sd ** 2
    XtW = X.T * w
    cov = np.linalg.inv(XtW @ X)
    coef = cov @ (XtW @ y)
    resid = y - X @ coef
    df = len(x) - 3
    chi2_red = float(np.sum(w * resid ** 2) / df) if df > 0 else 1.0
    return coef, cov, chi2_red


def _fieller(coef: np.ndarray, cov: np.ndarray, q: float) -> tuple[float, float]:
    """The x0 where the fitted slope b + 2 a x0 lies within q of its standard error of 0: (low, high), -inf / inf on
    a side the set does not bound (the curvature not resolved at this level)."""
    a, b, _ = coef
    va, vb, cab = cov[0, 0], cov[1, 1], cov[0, 1]
    # (b + 2 a x)^2 <= q^2 (vb + 4 x^2 va + 4 x cab)  <=>  A x^2 + B x + C <= 0
    A, B, C = 4 * (a * a - q * q * va), 4 * (a * b - q * q * cab), b * b - q * q * vb
    disc = B * B - 4 * A * C
    if A <= 0 or disc < 0:  # unbounded (the complement of an interval, or everything): nothing closes it
        return -math.inf, math.inf
    r = math.sqrt(disc)
    return (-B - r) / (2 * A), (-B + r) / (2 * A)


def _rise(coef: Sequence[float], x: float, x_star: float) -> float:
    return float(np.polyval(coef, x) - np.polyval(coef, x_star))


def _within(coef: Sequence[float], sd: float, x_star: float) -> tuple[float, float]:
    """The x where the parabola is ``sd`` above its value at ``x_star`` (the chosen lr), on both sides."""
    a, b, _ = coef
    v = -b / (2 * a)
    rise = float(np.polyval(coef, x_star) - np.polyval(coef, v))  # > 0 when the minimum was clamped
    r = math.sqrt((rise + sd) / a)
    return v - r, v + r


def interval_text(res: dict) -> str:
    """'3.1e-3 .. 1.1e-2 (80%; +0.012 / +0.020 nats at the ends)', '>= 2.1e-3 (80%, open above; ...)', or '-'."""
    if res is None or res.get("low") is None:
        return "-"
    if res.get("cost_low") is None and not (res["open_low"] or res["open_high"]):  # no parabola
        return f"{res['low']:.2g} .. {res['high']:.2g} (the best lr's neighbours in the grid; no parabola)"
    if res.get("cost_low") is None:  # at an end of the grid with no parabola: only the open side is known
        return f"{'<=' if res['open_low'] else '>='} {res['lr']:.2g} (open {'below' if res['open_low'] else 'above'})"
    lo = ("<= " if res["open_low"] else "") + f"{res['low']:.2g}"
    hi = (">= " if res["open_high"] else "") + f"{res['high']:.2g}"
    side = ("open on both sides" if res["open_low"] and res["open_high"] else "open below" if res["open_low"]
            else "open above" if res["open_high"] else "")
    cost = ("" if res.get("cost_low") is None else
            f"; +{res['cost_low']:.3f} / +{res['cost_high']:.3f} nats at the ends")
    return f"{lo} .. {hi} ({100 * res['level']:.0f}%{', ' + side if side else ''}{cost})"


def describe(res: dict) -> str:
    """'2.9e-3 (parabola through all 5 points; grid best 4e-3; 80% interval 2.1e-3 .. 4.2e-3 (...))'."""
    text = f"{res['lr']:.2g}"
    if res["kind"] == "parabola":
        text += f" (parabola through all {res['points']} points; grid best {res['grid_lr']:g}"
    else:
        text += f" (grid best: {res['reason']}"
    if res.get("low") is not None:
        text += f"; interval {interval_text(res)}"
    return text + ")"
