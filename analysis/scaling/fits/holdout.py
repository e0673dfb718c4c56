"""A prediction that can fail: approach 3 refitted without the largest size (or budget) predicts the
losses left out, with 95% prediction intervals."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Optional, Sequence

import numpy as np

from analysis.scaling.fits.common import (
    FAILED,
    NO_BUDGET,
    NO_FINITE,
    OK,
    ONE_BUDGET,
    _finite_positive,
    _interval,
    group_budgets,
    json_safe,
)
from analysis.scaling.fits.loss_nd import ND_PARAMS, NDFit, fit_loss_nd

HOLDOUT_BY = ("size", "budget")


@dataclass
class HoldoutPrediction:
    """Approach 3 fitted without the largest model size (``by="size"``: every point of that N) or
    the largest compute budget (``by="budget"``), asked for the held-out losses. Per held-out point:
    N, D, the measured loss, the prediction, its 95% prediction interval (the bootstrap fits'
    predictions, each times exp of a log residual of the fit drawn at random: the fit's uncertainty
    and a point's own scatter), the relative error and whether the measurement falls inside."""

    by: str
    status: str
    message: str = ""
    n_fit: int = 0
    n_held: int = 0
    held_N: Optional[float] = None  # by="size": the N held out
    held_budget: Optional[float] = None  # by="budget": its C (FLOPs)
    rows: list = field(default_factory=list)  # dicts: N, D, measured, predicted, lo, hi, rel_error, inside
    n_inside: int = 0
    passed: Optional[bool] = None  # every held-out point inside its interval
    fit: Optional[NDFit] = field(default=None, repr=False)

    def to_json(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k != "fit"}
        d["fit"] = None if self.fit is None else {k: getattr(self.fit, k) for k in (*ND_PARAMS, "status", "ci_method",
                                                                                      "n_boot")}
        return json_safe(d)


def holdout_prediction(N: Sequence[float], D: Sequence[float], L: Sequence[float], *, by: str = "size",
                       C: Optional[Sequence[float]] = None, budget_tags: Optional[Sequence[Optional[float]]] = None,
                       budget_tolerance: float = 0.1, clusters: Optional[Sequence] = None, huber_delta: float = 1e-3,
                       n_boot: int = 200, seed: int = 0, n_polish: Optional[int] = 20) -> HoldoutPrediction:
    """Fit L(N, D) on all but the largest size (or budget: needs ``C``) and predict what was left out
    (see :class:`HoldoutPrediction`). A prediction that can fail: the fit never sees the held-out points."""
    if by not in HOLDOUT_BY:
        raise ValueError(f"holdout by {by!r}: valid are {', '.join(HOLDOUT_BY)}")
    N, D, L = (np.asarray(x, dtype=float).ravel() for x in (N, D, L))
    ok = _finite_positive(N, D, L)
    res = HoldoutPrediction(by=by, status=OK)
    if by == "budget":
        if C is None:
            res.status, res.message = NO_BUDGET, "holdout by budget needs each point's training FLOPs"
            return res
        C = np.asarray(C, dtype=float).ravel()
        groups = group_budgets(np.where(ok, C, np.nan), tolerance=budget_tolerance, tags=budget_tags)
        if len(groups) < 2:
            res.status, res.message = ONE_BUDGET, "one compute budget: nothing to fit without it"
            return res
        held = np.zeros(len(N), dtype=bool)
        held[groups[-1]] = True
        top = groups[-1]
        tag = None if budget_tags is None else budget_tags[top[0]]
        res.held_budget = float(tag) if tag is not None else float(np.exp(np.mean(np.log(C[top]))))
    else:
        if not ok.any():
            res.status, res.message = NO_FINITE, "no finite point"
            return res
        res.held_N = float(N[ok].max())
        held = ok & (N == res.held_N)
    train = ok & ~held
    res.n_fit, res.n_held = int(train.sum()), int(held.sum())

    def sub(x):
        return None if x is None else [x[i] for i in np.flatnonzero(train)]

    fit = fit_loss_nd(N[train], D[train], L[train], huber_delta=huber_delta, n_boot=n_boot, seed=seed,
                      n_polish=n_polish, C=None if C is None else C[train], budget_tolerance=budget_tolerance,
                      budget_tags=sub(budget_tags), clusters=sub(clusters))
    res.fit = fit
    if fit.status != OK:
        res.status, res.message = fit.status, f"fit without the held-out points: {fit.message}"
        return res
    if fit.samples is None:
        res.status, res.message = FAILED, f"{fit.n_boot} bootstrap fits: no prediction interval (need >= 10)"
        return res
    r = np.log(L[train]) - np.log(fit.predict(N[train], D[train]))
    r = (r - r.mean()) * math.sqrt(len(r) / max(len(r) - 5, 1))
    rng = np.random.default_rng(seed + 1)
    E, A, alpha, B, beta = (s[:, None] for s in fit.samples.T)
    Nh, Dh, Lh = N[held], D[held], L[held]
    with np.errstate(over="ignore", invalid="ignore"):
        draws = (E + A * Nh[None, :] ** (-alpha) + B * Dh[None, :] ** (-beta))  # (n_boot, n_held)
        draws = draws * np.exp(r[rng.integers(0, len(r), draws.shape)])
    pred = fit.predict(Nh, Dh)
    for j in range(len(Nh)):
        iv = _interval(draws[:, j])
        inside = bool(iv[0] <= Lh[j] <= iv[1])
        res.rows.append({"N": float(Nh[j]), "D": float(Dh[j]), "measured": float(Lh[j]), "predicted": float(pred[j]),
                         "lo": iv[0], "hi": iv[1], "rel_error": float(pred[j] / Lh[j] - 1.0), "inside": inside})
    res.n_inside = sum(row["inside"] for row in res.rows)
    res.passed = res.n_inside == len(res.rows)
    return res
