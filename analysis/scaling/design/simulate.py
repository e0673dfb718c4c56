"""Many simulated studies of one planned grid: losses drawn from the assumed law with the noise model,
each fitted as the real study will be (approaches 3 and 2), and the spread of the estimates.

The simulation's conventions (N, C = 6 N D, noise, cost): docs/methods/scaling-design.md.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Optional, Sequence

import numpy as np

from analysis.scaling.design.result import Design, Spread
from analysis.scaling.design.spec import DesignSpec, Law, Noise, Plan
from analysis.scaling.fits.common import OK
from analysis.scaling.fits.isoflop import IsoFLOPResult, isoflop_profiles
from analysis.scaling.fits.loss_nd import NDFit, compute_multiplier, fit_loss_nd

Q = (2.5, 97.5)  # the spread reported: 95% of the simulated point estimates


def draw_losses(plan: Plan, law: Law, noise: Noise, rng: np.random.Generator) -> np.ndarray:
    """(P,) losses of one simulated study: each run L(N, D) exp(eps), averaged over the seeds of its point."""
    P, S = len(plan.N), plan.seeds
    if plan.decay_fraction is None:
        eps_SP = rng.normal(0.0, noise.sigma, (S, P))
    else:
        T = int(plan.trunk.max()) + 1
        u_ST = rng.normal(0.0, noise.sigma * math.sqrt(noise.trunk_share), (S, T))
        eps_SP = u_ST[:, plan.trunk] + rng.normal(0.0, noise.sigma * math.sqrt(1.0 - noise.trunk_share), (S, P))
    return (law.loss(plan.N, plan.D)[None, :] * np.exp(eps_SP)).mean(axis=0)


def fit_study(plan: Plan, L: np.ndarray, spec: DesignSpec, *, seed: int = 0) -> tuple[NDFit, IsoFLOPResult]:
    """Approach 3 and approach 2 on one simulated study's seed-averaged losses, as analysis.scaling
    calls them (budget tags from the FLOPs budgets, ``spec.bootstrap`` resamples; with WSD trunks, the
    branches of one trunk are one cluster of the bootstrap, as the study's)."""
    clusters = plan.trunk if plan.decay_fraction is not None else None
    nd = fit_loss_nd(plan.N, plan.D, L, huber_delta=spec.huber_delta, n_boot=spec.bootstrap, seed=seed,
                     n_polish=spec.n_polish, C=plan.C, budget_tolerance=spec.budget_tolerance, budget_tags=plan.budget,
                     clusters=clusters)
    iso = isoflop_profiles(plan.N, plan.C, L, tolerance=spec.budget_tolerance, tags=plan.budget,
                           point_sem=spec.noise.sigma * L / math.sqrt(plan.seeds), n_boot=spec.bootstrap, seed=seed,
                           clusters=clusters)
    return nd, iso


QUANTITIES = ("approach 3 alpha", "approach 3 beta", "approach 3 a", "approach 2 a")


def summarise(quantity: str, true: float, estimates: Sequence[float], covered: Sequence[Optional[bool]] = (),
              seed: int = 0, n_boot: int = 200, log: bool = False,
              own_widths: Sequence[Optional[float]] = ()) -> Spread:
    """Median, bias, 95% percentile range and its width (``log``: width as the ratio hi / lo, bias as the
    ratio median / true) of the finite estimates; a bootstrap over simulations for the width's precision.
    ``covered`` / ``own_widths``: per simulation, whether its own bootstrap interval held the truth and
    that interval's width (None: no interval)."""
    x = np.asarray(estimates, dtype=float)
    ok = x[np.isfinite(x)]
    out = Spread(quantity=quantity, true=float(true), n_ok=len(ok), n_sims=len(x), estimates=x.tolist())
    cov = [c for c in covered if c is not None]
    out.coverage = float(np.mean(cov)) if cov else None
    own = [w for w in own_widths if w is not None and math.isfinite(w)]
    out.own_width = float(np.median(own)) if own else None
    out.own_width_range = [float(v) for v in np.percentile(own, Q)] if len(own) >= 2 else None
    if len(ok) < 2:
        return out

    def width(v: np.ndarray) -> float:
        lo, hi = np.percentile(v, Q)
        return float(hi / lo) if log else float(hi - lo)

    out.median = float(np.median(ok))
    out.bias = out.median / true if log else out.median - true
    out.interval = [float(v) for v in np.percentile(ok, Q)]
    out.width = width(ok)
    rng = np.random.default_rng(seed)
    widths = [width(ok[rng.integers(0, len(ok), len(ok))]) for _ in range(n_boot)]
    out.width_ci = [float(v) for v in np.percentile(widths, Q)]
    return out


def grid_facts(plan: Plan, law: Law, flops_per_s: Optional[float] = None, data_tokens: Optional[float] = None,
               max_epochs: float = 4.0) -> dict:
    """Points, sizes, budgets, runs, training FLOPs (and CPU time), per budget whether the law's
    N_opt lies inside the sizes trained at it (an IsoFLOP parabola needs its minimum bracketed), and
    with the corpus's unique tokens, the epochs of the longest point and the points past
    ``max_epochs`` (Muennighoff et al. 2023: up to about 4 epochs repeated data is worth nearly as
    much as new data; past that the assumed law no longer holds)."""
    C = plan.C
    budgets = []
    tags = sorted({b for b in plan.budget if b is not None})
    for b in tags:
        sel = np.array([t == b for t in plan.budget])
        n_opt = float(law.n_opt(b, plan.fpt)[0])
        N = plan.N[sel]
        budgets.append({"flops": b, "n_sizes": int(sel.sum()), "N_min": float(N.min()), "N_max": float(N.max()),
                        "N_opt": n_opt, "bracketed": bool(N.min() <= n_opt <= N.max())})
    flops = plan.train_flops()
    return {"n_points": len(plan.N), "n_sizes": len(np.unique(plan.N)), "N_range": [float(plan.N.min()),
            float(plan.N.max())], "N_decades": float(np.log10(plan.N.max() / plan.N.min())),
            "D_range": [float(plan.D.min()), float(plan.D.max())], "C_range": [float(C.min()), float(C.max())],
            "C_decades": float(np.log10(C.max() / C.min())), "C_counts": "F(N) D" if plan.fpt else "6ND",
            "flops_budgets": budgets,
            "token_budgets": sorted({float(d) for d, b in zip(plan.D, plan.budget) if b is None}),
            "seeds": plan.seeds, "cooldown": plan.decay_fraction, "runs": plan.n_runs, "train_flops": flops,
            "flops_per_s": flops_per_s, "cpu_seconds": flops / flops_per_s if flops_per_s else None,
            "data_tokens": data_tokens, "max_epochs": max_epochs,
            "epochs_max": float(plan.D.max() / data_tokens) if data_tokens else None,
            "points_past_max_epochs": int(np.sum(plan.D > max_epochs * data_tokens)) if data_tokens else None}


def _covers(ci: Optional[list], truth: float) -> Optional[bool]:
    return None if not ci else bool(ci[0] <= truth <= ci[1])


def simulate(spec: DesignSpec, *, sims: Optional[int] = None, seed: Optional[int] = None) -> Design:
    """Simulate ``sims`` studies of the spec's grid per family (independent noise per family and study),
    fit each with approaches 3 and 2, and summarise the spread of the estimates (:class:`Design`)."""
    t0 = time.perf_counter()
    M = spec.sims if sims is None else int(sims)
    seed = spec.seed if seed is None else int(seed)
    if M < 1:
        raise ValueError(f"sims={M}: must be >= 1")
    rng = np.random.default_rng(seed)
    ref_flops = spec.ref_flops or float(spec.plan_of(next(iter(spec.families))).C.max())
    est = {f: {q: [] for q in QUANTITIES} for f in spec.families}
    cov = {f: {q: [] for q in QUANTITIES} for f in spec.families}
    own = {f: {q: [] for q in QUANTITIES} for f in spec.families}
    statuses = {f: {"approach 3": {}, "approach 2": {}} for f in spec.families}
    fits = {f: [] for f in spec.families}
    for m in range(M):
        for name, law in spec.families.items():
            plan = spec.plan_of(name)
            nd, iso = fit_study(plan, draw_losses(plan, law, spec.noise, rng), spec, seed=seed + m)
            fits[name].append(nd)
            ok3 = nd.status == OK
            st = statuses[name]
            st["approach 3"][nd.status] = st["approach 3"].get(nd.status, 0) + 1
            st["approach 2"][iso.status] = st["approach 2"].get(iso.status, 0) + 1
            pl = iso.power_law if iso.status == OK else None
            for q, v, ci, truth in (("approach 3 alpha", nd.alpha, nd.ci.get("alpha"), law.alpha),
                                    ("approach 3 beta", nd.beta, nd.ci.get("beta"), law.beta),
                                    ("approach 3 a", nd.a_opt, nd.ci.get("a_opt"), law.a),
                                    ("approach 2 a", pl.slope if pl else None, pl.ci.get("slope") if pl else None,
                                     law.a)):
                ok = (ok3 if q.startswith("approach 3") else pl is not None) and v is not None
                est[name][q].append(float(v) if ok else math.nan)
                cov[name][q].append(_covers(ci, truth) if ok else None)
                own[name][q].append(ci[1] - ci[0] if ok and ci else None)
    spreads = {f: {q: summarise(q, _truth(spec.families[f], q), est[f][q], cov[f][q], seed=seed,
                                own_widths=own[f][q]) for q in QUANTITIES}
               for f in spec.families}
    multipliers = {}
    names = list(spec.families)
    for name in names[1:]:
        truth = compute_multiplier(spec.families[names[0]].as_fit(), spec.families[name].as_fit(), ref_flops)
        ks = [compute_multiplier(r, o, ref_flops) for r, o in zip(fits[names[0]], fits[name])]
        multipliers[name] = summarise(f"compute multiplier vs {names[0]} at C = {ref_flops:.3g}", truth, ks, seed=seed,
                                   log=True)
    facts = {name: grid_facts(spec.plans[name], law, spec.flops_per_s, spec.data_tokens, spec.max_epochs)
             for name, law in spec.families.items() if name in spec.plans}
    return Design(spec=replace(spec, sims=M, seed=seed),
                  grid=grid_facts(spec.plan, spec.families[names[0]], spec.flops_per_s, spec.data_tokens,
                                  spec.max_epochs), spreads=spreads,
                  statuses=statuses, multipliers=multipliers, ref_flops=ref_flops, seconds=time.perf_counter() - t0,
                  family_grids=facts)


def _truth(law: Law, quantity: str) -> float:
    return {"alpha": law.alpha, "beta": law.beta, "a": law.a}[quantity.rsplit(" ", 1)[1]]
