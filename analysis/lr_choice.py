"""The lr chosen from the whole tuning grid, with an interval on it that holds where the valley is not a parabola:
a weighted least-squares fit in ln lr through every finite grid point of an asymmetric parabola (its own curvature
on each side of the optimum m: loss = c + a_low min(x - m, 0)^2 + a_high max(x - m, 0)^2, x = ln lr), its minimum
taken inside the bracket (between the best point's neighbours), and an interval on m from its profile: the m0 whose
best fit with the optimum held at m0 is not distinguishable from the best fit overall, the cut-off calibrated by a
parametric bootstrap of the grid (the fitted curve plus fresh seed noise at every point, refitted), with the loss
the fitted curve says each end of the interval costs.

One tuning run per lr differs from its neighbours by its seed's luck as well as by its lr; the grid's argmin follows
that luck when neighbouring losses differ by less than the seed sd, and a curve through every point averages it. A
symmetric parabola's minimum lies well off the optimum of a valley that rises faster towards divergence than
towards small lrs, and its Fieller interval then almost never holds the optimum (``analysis.lr_coverage``); the
asymmetric fit follows such a valley and contains the parabola (equal curvatures). Both curvatures are held >= 0.
With fewer than 5 distinct finite lrs the two curvatures are one (a parabola: 4 points leave no residual otherwise).
Where the interval reaches an end of the grid, that side is open: the grid does not bound the optimum there.

The seed sd that weights the points and scales the interval comes from, in this order: repeated lrs in the grid
(the pooled sd within them), the caller's ``noise_sd`` (the report passes the seeded runs' pooled sd), the fit's
own residuals (when the grid has more distinct lrs than the fit has parameters). Where the residuals say the noise
is larger than the sd given (chi-square p < 0.05: a curve the fit does not follow, or a seed sd too small), the
residuals give the sd, so lack of fit widens the interval instead of hiding behind a small sd. The bootstrap draws
the sd's own uncertainty as it was estimated (residuals refitted, or a chi-square for repeated lrs).
``method="fieller"`` keeps the earlier interval (a symmetric parabola and Fieller's) for comparison.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Optional, Sequence

import numpy as np
from scipy import optimize, stats

LEVEL = 0.8  # the interval's two-sided coverage
LACK_OF_FIT_P = 0.05  # residuals this unlikely under the sd given replace it
BOOTSTRAP = 200  # simulated grids that calibrate the profile interval's cut-off (its 80% quantile to ~0.03)
STEPS = 141  # candidate optima across the grid's range in ln lr (0.025 apart on a 32x grid)
METHODS = ("profile", "fieller")


def choose(lrs: Sequence[float], losses: Sequence[Optional[float]], noise_sd: Optional[float] = None,
           level: float = LEVEL, method: str = "profile", rng: Optional[np.random.Generator] = None) -> dict:
    """{lr, grid_lr, kind ("parabola" | "grid"), reason, points, coef, curvature, sd, sd_from, level, low, high,
    open_low, open_high, cost_low, cost_high, flat_low, flat_high, method}.

    ``lrs`` non-decreasing (a repeated lr: several seeds at it); ``losses`` None or inf for runs that diverged or did
    not learn (left out of the fit). ``lr``: the fitted curve's minimum, clamped to the bracket; the grid's best when
    it is at an end of the grid, fewer than 3 distinct finite lrs exist, or a parabola through the points does not
    curve upwards. ``low`` / ``high``: the ``level`` interval on the optimal lr, clipped to the grid (``open_*``: it
    reaches that end); ``cost_*``: the fitted loss there above the fitted loss at ``lr`` (nats). ``flat_*``: where the
    fit is within one sd of its minimum. Interval keys are None where no sd is known. ``method``: "profile" (module
    docstring) or "fieller" (the earlier symmetric parabola); ``rng`` seeds the bootstrap (fixed by default, so a
    report reads the same each time)."""
    if method not in METHODS:
        raise ValueError(f"method={method!r}: one of {', '.join(METHODS)}")
    vals = [math.inf if v is None or not math.isfinite(v) else float(v) for v in losses]
    i = int(np.argmin(vals))
    out = {"lr": float(lrs[i]), "grid_lr": float(lrs[i]), "kind": "grid", "reason": "", "points": 1, "coef": None,
           "curvature": None, "sd": None, "sd_from": None, "level": level, "low": None, "high": None,
           "open_low": False, "open_high": False, "cost_low": None, "cost_high": None, "flat_low": None,
           "flat_high": None, "method": method}
    if not math.isfinite(vals[i]):
        return {**out, "reason": "no lr learned"}
    groups = _by_lr(lrs, vals)
    x = np.log(list(groups))
    y = np.array([np.mean(v) for v in groups.values()])
    n_at = np.array([len(v) for v in groups.values()], dtype=float)
    out["points"] = int(n_at.sum())
    # an end of the whole grid (a diverged or not-learned lr beyond the best bounds that side: it is the worst)
    edge = "low" if lrs[i] == min(lrs) else "high" if lrs[i] == max(lrs) else None
    if len(x) < 3:
        out["reason"] = f"{len(x)} finite lr{'s' if len(x) != 1 else ''} (a parabola needs 3)"
        if edge:  # nothing bounds the optimum on that side
            out.update(low=float(lrs[i]), high=float(lrs[i]), open_low=edge == "low", open_high=edge == "high")
        else:  # the best's neighbours in the grid (worse, or diverged) bound it
            out.update(low=max(v for v in lrs if v < lrs[i]), high=min(v for v in lrs if v > lrs[i]))
        return out
    sd, sd_from, df = _seed_sd(groups, noise_sd)
    coef, cov, chi2_red = _fit(x, y, n_at, sd or 1.0)
    if not coef[0] > 0:
        out["reason"] = "the points do not curve upwards (flat or noisy): the grid's best"
        if edge:  # nothing bounds the optimum on that side: the interval starts at the edge and is open
            out.update(reason="the best lr is at an end of the grid (not bracketed)", low=float(lrs[i]),
                       high=float(lrs[i]), open_low=edge == "low", open_high=edge == "high")
        return out
    grid = (math.log(min(lrs)), math.log(max(lrs)), math.log(lrs[i]))  # the grid's range, every lr tried; its best
    bracket = (math.log(max((v for v in lrs if v < lrs[i]), default=lrs[i])),  # the best's grid neighbours
               math.log(min((v for v in lrs if v > lrs[i]), default=lrs[i])))
    seed = (sd, sd_from, df)
    if method == "fieller":
        out.update(_fieller_choice(x, y, n_at, seed, (coef, cov, chi2_red), grid, bracket, edge, level))
    else:
        out.update(_profile_choice(x, y, n_at, seed, grid, bracket, edge, level,
                                   rng if rng is not None else np.random.default_rng(0)))
    if edge:  # the optimum is not bracketed: no extrapolation; the grid extends there (tools.experiment_tuning)
        out.update(kind="grid", reason="the best lr is at an end of the grid (not bracketed)", lr=float(lrs[i]))
    return out


def _fieller_choice(x, y, n_at, seed, fitted, grid, bracket, edge, level) -> dict:
    """The earlier rule: a symmetric parabola's minimum and Fieller's interval on it (sd scaled by the Birge ratio
    where the residuals reject it)."""
    (sd, sd_from, df), (coef, cov, chi2_red) = seed, fitted
    x_lo, x_hi, x_best = grid
    a, b, c = coef
    if sd is None and len(x) > 3:  # the residuals are the only estimate of the noise
        sd, sd_from, df = math.sqrt(chi2_red), "the parabola's residuals", len(x) - 3
        cov = cov * chi2_red
    elif sd is not None and len(x) > 3 and stats.chi2.sf(chi2_red * (len(x) - 3), len(x) - 3) < LACK_OF_FIT_P:
        cov, sd_from = cov * chi2_red, f"{sd_from}, scaled by the fit's reduced chi-square {chi2_red:.2g}"
        sd = sd * math.sqrt(chi2_red)
    x_star = x_best if edge else float(np.clip(-b / (2 * a), *bracket))
    out = {"kind": "parabola", "curvature": float(a), "coef": [float(a), float(b), float(c)], "sd": sd,
           "sd_from": sd_from, "lr": math.exp(x_star)}
    if sd is not None:
        q = stats.norm.ppf(0.5 + level / 2) if df is None else stats.t.ppf(0.5 + level / 2, df)
        low, high = _fieller(coef, cov, q)
        out.update(_ends(out["coef"], low < x_lo, high > x_hi, max(low, x_lo), min(high, x_hi), x_star, edge))
        out.update(_flat(out["coef"], sd, x_star, x))
    return out


def _profile_choice(x, y, n_at, seed, grid, bracket, edge, level, rng) -> dict:
    """The asymmetric parabola's minimum and its bootstrap-calibrated profile interval (module docstring)."""
    sd, sd_from, df = seed
    x_lo, x_hi, x_best = grid
    symmetric = len(x) < 5
    m_grid = np.linspace(x_lo, x_hi, STEPS)
    rss = _profile(x, y[None], n_at, m_grid, symmetric)[0][0]
    m_hat = _refine(x, y, n_at, m_grid, rss, symmetric)
    rss_min_at, coef_hat = _profile(x, y[None], n_at, np.array([m_hat]), symmetric)
    rss_min = min(float(rss.min()), float(rss_min_at[0, 0]))
    c, a_low, a_high = (float(v) for v in (*coef_hat[0, 0], coef_hat[0, 0, -1])[:3])  # symmetric: one curvature
    curve = [m_hat, a_low, a_high, c]
    resid_df = len(x) - (3 if symmetric else 4)
    mode = "given" if df is None else "repeats"
    if sd is None and resid_df > 0:  # the residuals are the only estimate of the noise
        sd, sd_from, mode = math.sqrt(rss_min / resid_df), "the fit's residuals", "residuals"
    elif sd is not None and resid_df > 0 and stats.chi2.sf(rss_min / sd ** 2, resid_df) < LACK_OF_FIT_P:
        scaled = math.sqrt(rss_min / resid_df)  # the points scatter more than the sd says
        sd_from, mode = f"{sd_from}, replaced by the fit's residuals ({scaled:.3g}: they reject it)", "residuals"
        sd = scaled
    x_star = x_best if edge else float(np.clip(m_hat, *bracket))
    out = {"kind": "parabola", "shape": "parabola" if symmetric else "asymmetric parabola",
           "curvature": float((curve[1] + curve[2]) / 2), "curvature_low": curve[1],
           "curvature_high": curve[2], "coef": curve, "sd": sd, "sd_from": sd_from, "lr": math.exp(x_star)}
    if sd is None:
        return out
    s2 = rss_min / resid_df if mode == "residuals" else sd ** 2
    crit = _critical(x, _curve(curve, x), n_at, m_grid, m_hat, (sd, mode, df, resid_df), symmetric, level, rng)
    low, high = _crossings(m_grid, (rss - rss_min) / s2, crit, m_hat)
    out.update(_ends(curve, low <= x_lo, high >= x_hi, min(low, m_hat), max(high, m_hat), x_star, edge))
    out.update(_flat(curve, sd, x_star, x))
    return out


def _crossings(m_grid: np.ndarray, t: np.ndarray, crit: float, m_hat: float) -> tuple[float, float]:
    """The outermost m where the profile statistic ``t`` (on ``m_grid``) is at most ``crit``, each end placed
    where ``t`` crosses ``crit`` between its grid neighbours (linear in between): the interval's hull."""
    inside = np.flatnonzero(t <= crit)
    if not inside.size:
        return m_hat, m_hat
    ends = []
    for j, k in ((inside[0], inside[0] - 1), (inside[-1], inside[-1] + 1)):
        if k < 0 or k >= len(m_grid):
            ends.append(float(m_grid[j]))
            continue
        share = (crit - t[j]) / (t[k] - t[j])  # t[k] > crit >= t[j]
        ends.append(float(m_grid[j] + share * (m_grid[k] - m_grid[j])))
    return ends[0], ends[1]


def _ends(coef, open_low: bool, high_open: bool, low: float, high: float, x_star: float, edge) -> dict:
    """The interval's keys, open on the side of a grid end the optimum is not bracketed at."""
    if edge == "high":
        low = min(low, x_star)
    if edge == "low":
        high = max(high, x_star)
    return {"low": math.exp(low), "high": math.exp(high), "open_low": bool(open_low or edge == "low"),
            "open_high": bool(high_open or edge == "high"), "cost_low": _rise(coef, low, x_star),
            "cost_high": _rise(coef, high, x_star)}


def _flat(coef, sd: float, x_star: float, x: np.ndarray) -> dict:
    f_lo, f_hi = _within(coef, sd, x_star)
    return {"flat_low": math.exp(max(f_lo, x.min())), "flat_high": math.exp(min(f_hi, x.max())),
            "flat_open_low": bool(f_lo < x.min()), "flat_open_high": bool(f_hi > x.max())}


def _columns(x: np.ndarray, m: np.ndarray, symmetric: bool) -> np.ndarray:
    """(M, n, p): the fit's columns at each candidate optimum: 1, then (x - m)^2 or its two one-sided halves."""
    d_MN = x[None, :] - m[:, None]
    ones = np.ones_like(d_MN)
    if symmetric:
        return np.stack([ones, d_MN ** 2], axis=-1)
    return np.stack([ones, np.minimum(d_MN, 0) ** 2, np.maximum(d_MN, 0) ** 2], axis=-1)


def _profile(x: np.ndarray, y_BN: np.ndarray, n_at: np.ndarray, m: np.ndarray,
             symmetric: bool) -> tuple[np.ndarray, np.ndarray]:
    """(rss (B, M), coef (B, M, p)): for each of B sets of point means and each candidate optimum m, the weighted
    least squares with curvatures >= 0 (the best of the fits with each curvature free or held at 0, among those
    that are feasible: the constrained optimum). rss in units of one run's variance times n_at weights."""
    X_MNP = _columns(x, m, symmetric) * np.sqrt(n_at)[None, :, None]
    y_NB = (y_BN * np.sqrt(n_at)[None, :]).T
    p = X_MNP.shape[-1]
    best_rss = np.full((len(m), y_NB.shape[1]), np.inf)
    best = np.zeros((len(m), p, y_NB.shape[1]))
    for keep in ([(0, 1), (0,)] if symmetric else [(0, 1, 2), (0, 1), (0, 2), (0,)]):
        Xs = X_MNP[:, :, keep]
        coef_MKB = np.linalg.pinv(Xs) @ y_NB
        rss = np.sum((y_NB[None] - Xs @ coef_MKB) ** 2, axis=1)
        ok = np.all(coef_MKB[:, 1:] >= 0, axis=1) & (rss < best_rss)
        best_rss = np.where(ok, rss, best_rss)
        full = np.zeros_like(best)
        full[:, list(keep)] = coef_MKB
        best = np.where(ok[:, None], full, best)
    return best_rss.T, best.transpose(2, 0, 1)


def _refine(x, y, n_at, m_grid, rss, symmetric) -> float:
    """The profile's minimum between the grid neighbours of its best candidate."""
    j = int(np.argmin(rss))
    lo, hi = m_grid[max(j - 1, 0)], m_grid[min(j + 1, len(m_grid) - 1)]
    res = optimize.minimize_scalar(lambda v: float(_profile(x, y[None], n_at, np.array([v]), symmetric)[0][0, 0]),
                                   bounds=(lo, hi), method="bounded", options={"xatol": 1e-10})
    return float(res.x) if res.fun <= rss[j] else float(m_grid[j])


def _critical(x, y_fit, n_at, m_grid, m_hat, noise, symmetric, level, rng) -> float:
    """The ``level`` quantile of the profile statistic at the true optimum over grids simulated from the fit: the
    fitted curve plus normal seed noise at every point, the sd re-estimated as it was (``noise``: sd, mode, its
    degrees of freedom from repeats, the residual degrees of freedom)."""
    sd, mode, df, resid_df = noise
    y_BN = y_fit[None, :] + sd * rng.standard_normal((BOOTSTRAP, len(x))) / np.sqrt(n_at)[None, :]
    rss_BM = _profile(x, y_BN, n_at, m_grid, symmetric)[0]
    at_true = _profile(x, y_BN, n_at, np.array([m_hat]), symmetric)[0][:, 0]
    rss_min = np.minimum(rss_BM.min(axis=1), at_true)
    if mode == "residuals":
        s2 = rss_min / resid_df
    elif mode == "repeats":
        s2 = sd ** 2 * rng.chisquare(df, BOOTSTRAP) / df
    else:
        s2 = np.full(BOOTSTRAP, sd ** 2)
    return float(np.quantile((at_true - rss_min) / np.maximum(s2, 1e-300), level))


def _curve(coef: Sequence[float], x) -> np.ndarray:
    """The fitted loss at ``x``: [a, b, c] a parabola (``method="fieller"``), [m, a_low, a_high, c] asymmetric."""
    x = np.asarray(x, dtype=float)
    if len(coef) == 3:
        return np.polyval(coef, x)
    m, a_low, a_high, c = coef
    return c + a_low * np.minimum(x - m, 0) ** 2 + a_high * np.maximum(x - m, 0) ** 2


def regret(res: dict, lr: float) -> Optional[float]:
    """The fitted loss at ``lr`` above the fitted loss at the chosen lr (nats): what training at ``lr`` instead
    costs on the fitted curve; None without one."""
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
    return float(_curve(coef, x) - _curve(coef, x_star))


def _within(coef: Sequence[float], sd: float, x_star: float) -> tuple[float, float]:
    """The x where the fitted curve is ``sd`` above its value at ``x_star`` (the chosen lr), on both sides
    (-inf / inf on a side with no curvature)."""
    if len(coef) == 3:
        a, b, _ = coef
        coef = [-b / (2 * a), a, a, float(np.polyval(coef, -b / (2 * a)))]
    m, a_low, a_high, _ = coef
    rise = _rise(coef, x_star, m) + sd  # > sd when the minimum was clamped
    return (m - math.sqrt(rise / a_low) if a_low > 0 else -math.inf,
            m + math.sqrt(rise / a_high) if a_high > 0 else math.inf)


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
    """'2.9e-3 (asymmetric parabola through all 5 points; grid best 4e-3; interval 2.1e-3 .. 4.2e-3 (...))'."""
    text = f"{res['lr']:.2g}"
    if res["kind"] == "parabola":
        text += f" ({res.get('shape', 'parabola')} through all {res['points']} points; grid best {res['grid_lr']:g}"
    else:
        text += f" (grid best: {res['reason']}"
    if res.get("low") is not None:
        text += f"; interval {interval_text(res)}"
    return text + ")"
