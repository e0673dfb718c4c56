"""Approach 2: IsoFLOP profiles. Points grouped by compute budget, a parabola of loss in ln N per budget
and its minimum N*, then N*(C) through the bracketed minima (bootstrapped jointly over budgets when WSD
trunks span them).

Grouping, brackets and intervals: docs/methods/scaling.md.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Optional, Sequence

import numpy as np

from analysis.scaling.fits.common import (
    ND_CLUSTER_MIN,
    NO_BUDGET,
    NOT_BRACKETED,
    NOT_CONVEX,
    OK,
    ONE_BUDGET,
    TOO_FEW_SIZES,
    UNBRACKETED,
    _cluster_members,
    _finite_positive,
    _g,
    _interval,
    group_budgets,
    json_safe,
    n_opt_flags,
    reported_status,
)
from analysis.scaling.fits.log_log import LogLogFit, fit_log_log

PARABOLA_PAIRS_MIN = 6  # distinct N per budget for the points bootstrap (as fit_power_law)


@dataclass
class IsoFLOPProfile:
    """One compute budget: loss against ln N fitted by a parabola, its minimum N* (the optimal size)."""

    budget: float  # C (FLOPs): the sweep's budget tag, else the geometric mean of the points' C
    status: str
    message: str = ""
    n_points: int = 0
    n_sizes: int = 0
    N: list = field(default_factory=list)
    C: list = field(default_factory=list)
    L: list = field(default_factory=list)
    L_err: list = field(default_factory=list)  # spread shown as error bars (std over seeds), 0 if none
    coef: Optional[list] = None  # [c2, c1, c0] of L = c2 x^2 + c1 x + c0, x = ln N - x0
    x0: Optional[float] = None
    N_opt: Optional[float] = None
    L_opt: Optional[float] = None
    bracketed: bool = False  # N* within the sampled sizes
    ci: dict = field(default_factory=dict)  # N_opt
    n_boot: int = 0
    ci_method: str = ""  # points | residuals | parametric (seed noise) | ""
    flags: list = field(default_factory=list)  # "minimum not bracketed (...)", "N_opt outside the trained sizes (...)"
    log_N_samples: Optional[np.ndarray] = field(default=None, repr=False)

    def to_json(self) -> dict:
        d = asdict(self)
        d.pop("log_N_samples")
        d["status"] = reported_status(self)
        return json_safe(d)

    def curve(self, N) -> np.ndarray:
        x = np.log(np.asarray(N, dtype=float)) - self.x0
        return np.polyval(self.coef, x)


def _parabola_min(x: np.ndarray, L: np.ndarray) -> tuple[np.ndarray, float]:
    """(coefficients, x at the minimum); the minimum is +-inf when the parabola is not convex
    (on the side where the loss falls)."""
    coef = np.polyfit(x, L, 2)
    if coef[0] > 0:
        return coef, float(-coef[1] / (2 * coef[0]))
    return coef, math.copysign(math.inf, -coef[1]) if coef[1] != 0 else math.nan


def fit_isoflop_profile(N: Sequence[float], L: Sequence[float], *, budget: float, C: Optional[Sequence[float]] = None,
                        L_err: Optional[Sequence[float]] = None, point_sem: Optional[Sequence[float]] = None,
                        n_boot: int = 200, seed: int = 0) -> IsoFLOPProfile:
    """Parabola of loss in ln N at one budget and its minimum N* with a 95% bootstrap interval.

    Needs >= 3 distinct N. Interval: points bootstrap with >= 6 distinct N, residual bootstrap
    (inflated by sqrt(n / (n - 3))) with 4-5, and with exactly 3 points (an exact parabola)
    a parametric bootstrap from ``point_sem`` (each point's standard error, e.g. the seed noise
    floor / sqrt(seeds)) when given, else none.
    """
    N, L = np.asarray(N, dtype=float), np.asarray(L, dtype=float)
    C = np.full_like(N, budget) if C is None else np.asarray(C, dtype=float)
    L_err = np.zeros_like(N) if L_err is None else np.asarray(L_err, dtype=float)
    ok = _finite_positive(N, L)
    prof = IsoFLOPProfile(budget=float(budget), status=OK, n_points=int(ok.sum()), n_sizes=len(np.unique(N[ok])),
                          N=N[ok].tolist(), C=C[ok].tolist(), L=L[ok].tolist(), L_err=L_err[ok].tolist())
    if (~ok).any():
        prof.message = f"{int((~ok).sum())} non-finite point(s) left out"
    if prof.n_sizes < 3:
        prof.status = TOO_FEW_SIZES
        prof.message = (f"{prof.n_sizes} distinct model size(s) at this budget; a parabola needs >= 3 "
                        + ("; " + prof.message if prof.message else "")).strip()
        return prof
    N, L = N[ok], L[ok]
    x0 = float(np.mean(np.log(N)))
    x = np.log(N) - x0
    coef, xm = _parabola_min(x, L)
    prof.coef, prof.x0 = [float(c) for c in coef], x0
    if not coef[0] > 0:
        prof.status = NOT_CONVEX
        prof.message = "the fitted parabola opens downward or is flat: no minimum (loss still falls with N?)"
        return prof
    prof.N_opt, prof.L_opt = math.exp(xm + x0), float(np.polyval(coef, xm))
    prof.bracketed = bool(x.min() <= xm <= x.max())
    if not prof.bracketed:
        prof.status = UNBRACKETED
        prof.message = (f"N* = {prof.N_opt:.3g} lies outside the sampled sizes [{N.min():.3g}, {N.max():.3g}]: "
                        "extrapolated, left out of N*(C)")
        prof.flags = [f"{NOT_BRACKETED} (the parabola's vertex outside the trained sizes)",
                      *n_opt_flags(prof.N_opt, [float(N.min()), float(N.max())])]
    else:
        prof.flags = _data_bracket_flags(N, L)
    _parabola_bootstrap(prof, x, L, coef, point_sem if point_sem is None else np.asarray(point_sem)[ok],
                        n_boot, seed)
    return prof


def _data_bracket_flags(N: np.ndarray, L: np.ndarray) -> list[str]:
    """["minimum not bracketed (...)"] when the lowest measured loss (mean over a size's points) is at
    the smallest or the largest size trained (e.g. loss monotone in N): no trained size on one side
    of the minimum, which only the parabola's shape then places; else []."""
    sizes = np.unique(N)
    mean = np.array([L[N == n].mean() for n in sizes])
    i = int(np.argmin(mean))
    if i == 0:
        return [f"{NOT_BRACKETED} (lowest loss at the smallest trained size, N = {_g(sizes[0])})"]
    if i == len(sizes) - 1:
        return [f"{NOT_BRACKETED} (lowest loss at the largest trained size, N = {_g(sizes[-1])})"]
    return []


def _parabola_bootstrap(prof: IsoFLOPProfile, x, L, coef, sem, n_boot, seed) -> None:
    rng = np.random.default_rng(seed)
    n = len(x)
    pred = np.polyval(coef, x)
    if prof.n_sizes >= PARABOLA_PAIRS_MIN:
        prof.ci_method = "points"
    elif n >= 4:
        prof.ci_method = "residuals"
        r = (L - pred) * math.sqrt(n / (n - 3))
    elif sem is not None and np.all(np.isfinite(sem)) and np.any(sem > 0):
        prof.ci_method = "parametric (seed noise floor)"
    else:
        prof.message = (prof.message + "; " if prof.message else "") + "3 points, no seed noise: no interval"
        return
    out = []
    for _ in range(n_boot):
        if prof.ci_method == "points":
            idx = rng.integers(0, n, n)
            if len(np.unique(x[idx])) < 3:
                continue
            xb, Lb = x[idx], L[idx]
        elif prof.ci_method == "residuals":
            xb, Lb = x, pred + r[rng.integers(0, n, n)]
        else:
            xb, Lb = x, pred + rng.normal(0.0, 1.0, n) * sem
        out.append(_parabola_min(xb, Lb)[1] + prof.x0)
    s = np.asarray(out)
    prof.n_boot = len(s)
    if len(s) >= 10:
        prof.log_N_samples = s
        iv = _interval(s)
        prof.ci = {"N_opt": [float(np.exp(iv[0])), float(np.exp(iv[1]))]} if iv else {}


@dataclass
class IsoFLOPResult:
    """All budgets' profiles and the power law N*(C) = c C^a through the usable minima."""

    status: str
    message: str = ""
    tolerance: float = 0.1
    profiles: list = field(default_factory=list)  # IsoFLOPProfile, increasing budget
    power_law: Optional[LogLogFit] = None  # N* against C (the budget)
    flags: list = field(default_factory=list)  # N*(C) through flagged minima

    def to_json(self) -> dict:
        return json_safe({"status": reported_status(self), "flags": self.flags, "message": self.message,
                          "tolerance": self.tolerance,
                          "profiles": [p.to_json() for p in self.profiles],
                          "power_law": self.power_law.to_json() if self.power_law else None})


def isoflop_profiles(N: Sequence[float], C: Sequence[float], L: Sequence[float], *, tolerance: float = 0.1,
                     tags: Optional[Sequence[Optional[float]]] = None, L_err: Optional[Sequence[float]] = None,
                     point_sem: Optional[Sequence[float]] = None, n_boot: int = 200, seed: int = 0,
                     clusters: Optional[Sequence] = None) -> IsoFLOPResult:
    """Chinchilla approach 2 on points (N parameters, C training FLOPs, L loss): group by budget
    (:func:`group_budgets`), fit each budget's parabola (:func:`fit_isoflop_profile`), then
    N*(C) ∝ C^a through the convex, bracketed minima (:func:`fit_log_log`, its interval from the
    minima's bootstrap draws). With ``clusters`` (one label per point; e.g. a WSD trunk, whose
    branches sit at every budget) the interval of a comes from a joint bootstrap instead: whole
    clusters resampled (or, with fewer than ``ND_CLUSTER_MIN``, each cluster's residuals flipped
    together) and every budget's parabola and the line refitted on each replicate, since the minima
    of different budgets then share noise."""
    N, C, L = (np.asarray(x, dtype=float) for x in (N, C, L))
    L_err = np.zeros_like(N) if L_err is None else np.asarray(L_err, dtype=float)
    sem = None if point_sem is None else np.asarray(point_sem, dtype=float)
    profiles = []
    groups = group_budgets(C, tolerance=tolerance, tags=tags)
    for j, g in enumerate(groups):
        tag = None if tags is None else tags[g[0]]
        budget = float(tag) if tag is not None else float(np.exp(np.mean(np.log(C[g]))))
        profiles.append(fit_isoflop_profile(N[g], L[g], budget=budget, C=C[g], L_err=L_err[g],
                                            point_sem=None if sem is None else sem[g], n_boot=n_boot, seed=seed + j))
    res = IsoFLOPResult(status=OK, tolerance=tolerance, profiles=profiles)
    usable = [p for p in profiles if p.status == OK]
    if not profiles:
        res.status, res.message = NO_BUDGET, "no finite point"
        return res
    if not usable:
        counts = {}
        for p in profiles:
            counts[p.status] = counts.get(p.status, 0) + 1
        res.status = NO_BUDGET if len(profiles) > 1 else ONE_BUDGET
        res.message = (f"{len(profiles)} budget(s), none with a bracketed minimum: "
                       + ", ".join(f"{v} {k}" for k, v in counts.items()))
        if len(profiles) > 1 and all(p.n_sizes == 1 for p in profiles):
            res.message += (" (every budget holds one size: at token budgets each size spends its own FLOPs; "
                            "IsoFLOP needs FLOPs budgets, e.g. tools.sweep --flops, or a wider --budget-tolerance)")
        return res
    samples = [p.log_N_samples for p in usable]
    res.power_law = fit_log_log([p.budget for p in usable], [p.N_opt for p in usable], what="budgets",
                                log_y_samples=samples if all(s is not None for s in samples) else None,
                                n_boot=n_boot, seed=seed)
    res.status = res.power_law.status
    if clusters is not None and res.power_law.status == OK:
        _joint_cluster_bootstrap(res.power_law, [(p, g) for p, g in zip(profiles, groups) if p.status == OK], N, L,
                                 np.asarray([str(c) for c in clusters]), n_boot, seed)
    flagged = [p for p in usable if p.flags]
    if flagged and res.power_law.status == OK:
        res.flags = [f"{NOT_BRACKETED} at {len(flagged)} of the {len(usable)} budgets of N*(C) (C = "
                     + ", ".join(_g(p.budget) for p in flagged) + ")"]
    left_out = len(profiles) - len(usable)
    res.message = "; ".join(m for m in (res.power_law.message,
                                        f"{left_out} of {len(profiles)} budgets left out (see their status)"
                                        if left_out else "") if m)
    return res


def _joint_cluster_bootstrap(pl: LogLogFit, usable: list, N, L, labels, n_boot: int, seed: int) -> None:
    """Replace ``pl``'s interval by a joint cluster bootstrap over the usable budgets (see
    :func:`isoflop_profiles`); left as it is when no cluster holds two points."""
    idx_all = np.concatenate([g for _, g in usable])
    members, inv_all = _cluster_members(labels[idx_all], len(idx_all))
    if members is None:
        return
    G = len(members)
    inv = dict(zip(idx_all.tolist(), inv_all.tolist()))
    resample = G >= ND_CLUSTER_MIN
    rng = np.random.default_rng(seed)
    lx = np.log([p.budget for p, _ in usable])
    samples = []
    for _ in range(n_boot):
        if resample:
            weight = np.bincount(rng.integers(0, G, G), minlength=G)
        else:
            sign = rng.choice([-1.0, 1.0], G)
        ys = []
        for p, g in usable:
            x = np.log(N[g]) - p.x0
            if resample:
                take = np.repeat(np.arange(len(g)), weight[[inv[i] for i in g]])
                if len(np.unique(x[take])) < 3:
                    break
                xb, Lb = x[take], L[g][take]
            else:
                pred = np.polyval(p.coef, x)
                xb, Lb = x, pred + (L[g] - pred) * sign[[inv[i] for i in g]]
            xm = _parabola_min(xb, Lb)[1]
            if not math.isfinite(xm):
                break
            ys.append(xm + p.x0)
        else:
            samples.append(np.polyfit(lx, ys, 1))
    pl.n_boot = len(samples)
    how = f"clusters ({G})" if resample else f"residuals, one sign per cluster ({G})"
    pl.ci_method = how + ", joint over budgets"
    pl.samples, pl.ci = None, {}
    if len(samples) >= 10 and np.ptp(np.asarray(samples)[:, 0]) < 1e-9:  # rounding noise only
        # every draw gave the same minima: profiles of 3 sizes, whose parabolas pass through their points, leave
        # no residual to flip and no other size to draw; a zero-width interval would claim a precision not measured
        pl.ci_method += "; no spread (every profile interpolates its points exactly): no interval"
    elif len(samples) >= 10:
        pl.samples = np.asarray(samples)
        pl.ci = {"slope": _interval(pl.samples[:, 0]), "log_prefactor": _interval(pl.samples[:, 1])}
