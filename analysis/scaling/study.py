"""One family's compute-optimal study (approaches 1-3 and the held-out prediction) at one kind of N,
the same under every other kind of N, and L(C) per family."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Optional

import numpy as np

from analysis.scaling.fits.allocation import FPT, flops_per_token, measured_optimum
from analysis.scaling.fits.common import OK, difference_interval, json_safe, reported_status
from analysis.scaling.fits.envelope import EnvelopeExponent, envelope_exponent
from analysis.scaling.fits.holdout import HoldoutPrediction, holdout_prediction
from analysis.scaling.fits.isoflop import IsoFLOPResult, isoflop_profiles
from analysis.scaling.fits.loss_nd import ComputeOptimal, NDFit, compute_optimal, fit_loss_nd
from analysis.scaling.fits.noise import DesignNoise, NoiseFloor, design_noise
from analysis.scaling.fits.power_law import PowerLawFit, fit_power_law
from analysis.scaling.read import N_KINDS, Point, cluster_labels, n_params


@dataclass
class FamilyStudy:
    """Approaches 1-3 for one family's (seed-averaged) points, with N of kind ``n_kind``."""

    family: str
    n_kind: str
    runs: list
    N: list
    D: list
    C: list
    L: list
    L_err: list  # std over seeds (0 for a single seed)
    n_seeds: list
    k: Optional[float]  # training FLOPs per token per parameter: median over the runs
    k_range: Optional[list]
    C_ref: Optional[float]  # reference compute of the optimum (FLOPs)
    nd: NDFit
    optimum: ComputeOptimal  # C = F(N) D, each size's own measured training FLOPs per token (fits.allocation)
    optimum_6nd: ComputeOptimal  # C = 6 N D
    iso: IsoFLOPResult
    env: EnvelopeExponent
    noise: NoiseFloor
    clusters: list = field(default_factory=list)  # per point: its independent unit (trunk), see cluster_labels
    holdout: Optional[HoldoutPrediction] = None  # approach 3 without the largest size (or budget), predicting it
    # the k of C = k N D that the sweep's budgets count (median of budget / (N D) over the points with one: 6 for
    # `cooldown.compute: 6nd` with this N, ~k for measured FLOPs); approach 3's N_opt(C) is drawn in it beside
    # approach 2's minima
    k_budget: Optional[float] = None
    fpt: Optional[FPT] = None  # the family's training FLOPs per token F(N) through its sizes (per shape)
    budget_compute: str = ""  # what its sweep budgets count: "measured" | "6nd" | "" (none, or mixed)

    def to_json(self) -> dict:
        out = {k: getattr(self, k) for k in ("family", "n_kind", "runs", "N", "D", "C", "L", "L_err", "n_seeds", "k",
                                             "k_range", "C_ref", "clusters", "k_budget")}
        out.update(loss_nd=self.nd.to_json(), compute_optimal=self.optimum.to_json(),
                   compute_optimal_6nd=self.optimum_6nd.to_json(), isoflop=self.iso.to_json(),
                   envelope=self.env.to_json(), noise=self.noise.to_json(), agreement=self.agreement(),
                   holdout=self.holdout.to_json() if self.holdout else None,
                   flops_per_token=self.fpt.to_json() if self.fpt else None)
        return json_safe(out)

    def agreement(self, seed: int = 0) -> dict:
        """Do approaches 2 and 3 agree on a? Their difference a3 - a2 with a 95% interval (bootstrap
        draws of each, paired at random: conservative, see :func:`difference_interval`), and whether
        their own intervals overlap. ``agree``: the difference interval holds 0 (None when either
        estimate or its draws are missing)."""
        pl, nd = self.iso.power_law, self.nd
        a2 = pl.slope if pl is not None and pl.status == OK else None
        a3 = nd.a_opt if nd.status == OK else None
        out = {"a_approach_2": a2, "a_approach_2_ci": pl.ci.get("slope") if a2 is not None else None,
               "a_approach_3": a3, "a_approach_3_ci": nd.ci.get("a_opt") if a3 is not None else None,
               "difference": None, "difference_ci": None, "intervals_overlap": None, "agree": None}
        if a2 is None or a3 is None:
            missing = [name for name, v in (("approach 2", a2), ("approach 3", a3)) if v is None]
            return {**out, "verdict": f"cannot tell: no estimate from {' and '.join(missing)}"}
        out["difference"] = a3 - a2
        c2, c3 = out["a_approach_2_ci"], out["a_approach_3_ci"]
        if c2 and c3:
            out["intervals_overlap"] = bool(c2[0] <= c3[1] and c3[0] <= c2[1])
        if pl.samples is None or nd.samples is None:
            return {**out, "verdict": "cannot tell: no bootstrap draws of both"}
        al, be = nd.samples[:, 2], nd.samples[:, 4]
        with np.errstate(divide="ignore", invalid="ignore"):
            iv = difference_interval(pl.samples[:, 0], be / (al + be), seed=seed)
        if iv is None:
            return {**out, "verdict": "cannot tell: too few bootstrap draws"}
        out["difference_ci"] = iv
        out["agree"] = bool(iv[0] <= 0.0 <= iv[1])
        verdict = "agree" if out["agree"] else "disagree"
        return {**out, "verdict": f"{verdict}: a3 - a2 = {a3 - a2:+.3f} [{iv[0]:+.3f}, {iv[1]:+.3f}]"}

    def exponents(self) -> dict:
        """The three estimates of a in N_opt ∝ C^a: value, 95% interval, status, message."""
        pl = self.iso.power_law
        return {
            "approach_1_envelope": {"a": self.env.slope, "ci": self.env.ci.get("slope"), "status": self.env.status,
                                    "message": self.env.message, "n": self.env.n_sizes, "flags": []},
            "approach_2_isoflop": {"a": pl.slope if pl else None, "ci": pl.ci.get("slope") if pl else None,
                                   "status": reported_status(self.iso), "message": self.iso.message,
                                   "n": pl.n_points if pl else 0, "flags": list(self.iso.flags)},
            "approach_3_loss_nd": {"a": self.nd.a_opt, "ci": self.nd.ci.get("a_opt"),
                                   "status": reported_status(self.nd), "message": self.nd.message,
                                   "n": self.nd.n_points, "flags": list(self.nd.flags)},
        }


def study_family(points: list[Point], curves: list, noise: NoiseFloor, *, n_kind: str = "total",
                 n_boot: int = 200, huber_delta: float = 1e-3, seed: int = 0, budget_tolerance: float = 0.1,
                 ref_flops: Optional[float] = None, holdout: Optional[str] = None,
                 n_polish: Optional[int] = 20) -> FamilyStudy:
    """Approaches 1-3 on one family's seed-averaged points and curves (docs/methods/scaling.md);
    with ``holdout`` ("size" | "budget") also approach 3 without the largest size or budget,
    predicting the points left out (:func:`holdout_prediction`)."""
    ps = sorted(points, key=lambda p: (n_params(p, n_kind), p.tokens))
    N = np.array([n_params(p, n_kind) for p in ps])
    D = np.array([p.tokens for p in ps])
    C = np.array([p.flops for p in ps])
    L = np.array([p.loss for p in ps])
    ks = np.array([p.flops_per_token / n for p, n in zip(ps, N) if n > 0])
    k = float(np.median(ks)) if len(ks) else None
    C_ref = float(ref_flops) if ref_flops else (float(C.max()) if len(C) else None)
    tags = [p.budget for p in ps]
    kb = [p.budget / (n * p.tokens) for p, n in zip(ps, N) if p.budget and n > 0 and p.tokens > 0]
    clusters = cluster_labels(ps)
    nd = fit_loss_nd(N, D, L, huber_delta=huber_delta, n_boot=n_boot, seed=seed, C=C, budget_tolerance=budget_tolerance,
                     budget_tags=tags, clusters=clusters, n_polish=n_polish)
    fpt = flops_per_token(N, [p.flops_per_token for p in ps], [p.shape for p in ps]) if k else None
    # a over the compute range the family measured
    c_range = (float(C.min()), float(C.max())) if len(C) and C.max() > C.min() else None
    opt = measured_optimum(nd, C_ref, fpt, C_range=c_range) if fpt else \
        ComputeOptimal(status=nd.status, message="no parameter count")
    sem = [noise.std / math.sqrt(p.n_seeds) for p in ps] if noise.status == OK else None
    iso = isoflop_profiles(N, C, L, tolerance=budget_tolerance, tags=tags,
                           L_err=[p.loss_std for p in ps], point_sem=sem, n_boot=n_boot, seed=seed, clusters=clusters)
    sizes = {p.run: n for p, n in zip(ps, N)}
    env = envelope_exponent([c for c in curves if c[0] in sizes], sizes, n_boot=n_boot, seed=seed)
    return FamilyStudy(family=ps[0].family if ps else "", n_kind=n_kind, runs=[p.run for p in ps], N=N.tolist(),
                       D=D.tolist(), C=C.tolist(), L=L.tolist(), L_err=[p.loss_std for p in ps],
                       n_seeds=[p.n_seeds for p in ps], k=k,
                       k_range=[float(ks.min()), float(ks.max())] if len(ks) else None, C_ref=C_ref, nd=nd,
                       optimum=opt, optimum_6nd=compute_optimal(nd, C_ref, 6.0) if C_ref else opt, iso=iso,
                       env=env, noise=noise, clusters=clusters, k_budget=float(np.median(kb)) if kb else None,
                       fpt=fpt, budget_compute=_one({p.budget_compute for p in ps if p.budget}),
                       holdout=None if holdout is None else holdout_prediction(
                           N, D, L, by=holdout, C=C, budget_tags=tags, budget_tolerance=budget_tolerance,
                           clusters=clusters, huber_delta=huber_delta, n_boot=n_boot, seed=seed, n_polish=n_polish))


def _one(values: set) -> str:
    """The one value of a set, or "" when it holds none or several."""
    return next(iter(values)) if len(values) == 1 else ""


def fit_families(points: list[Point], n_boot: int, huber_delta: float, seed: int) -> dict[str, PowerLawFit]:
    fits = {}
    for fam in sorted({p.family for p in points}):
        ps = [p for p in points if p.family == fam]
        fits[fam] = fit_power_law([p.flops for p in ps], [p.loss for p in ps], n_boot=n_boot,
                                  huber_delta=huber_delta, seed=seed)
    return fits


def n_sensitivity_studies(points: list[Point], studies: dict[str, FamilyStudy], noise: dict, n_kind: str,
                          **fit_kw) -> dict[str, dict[str, FamilyStudy]]:
    """family -> N kind -> its study (approaches 2 and 3; no envelope) under every kind of ``N_KINDS``;
    a kind that gives a family the same N as one already fitted reuses that study (e.g. a dense
    family's active count is its non-embedding count)."""
    sens: dict[str, dict[str, FamilyStudy]] = {}
    for fam, st in studies.items():
        ps = [p for p in points if p.family == fam]
        done = {tuple(st.N): st}
        sens[fam] = {n_kind: st}
        for kind in N_KINDS:
            if kind == n_kind:
                continue
            key = tuple(sorted(n_params(p, kind) for p in ps))
            same = next((s for n, s in done.items() if tuple(sorted(n)) == key), None)
            sens[fam][kind] = replace(same, n_kind=kind) if same is not None else \
                study_family(ps, [], noise[fam], n_kind=kind, **fit_kw)
            done.setdefault(tuple(sens[fam][kind].N), sens[fam][kind])
    return sens


def n_sensitivity(sens: dict[str, dict[str, FamilyStudy]]) -> dict:
    """family -> N kind -> alpha, beta, a (approach 3: the form's, and the allocation's at measured FLOPs) and
    a (approach 2), each with its interval."""
    out = {}
    for fam, by_kind in sens.items():
        out[fam] = {}
        for kind, st in by_kind.items():
            f, pl = st.nd, st.iso.power_law
            out[fam][kind] = json_safe({
                "meaning": N_KINDS[kind], "N_range": [min(st.N), max(st.N)] if st.N else None,
                "status": reported_status(f), "flags": list(f.flags),
                "approach_2_flags": list(st.iso.flags) if pl and pl.status == OK else [],
                "alpha": f.alpha, "alpha_ci": f.ci.get("alpha"), "beta": f.beta,
                "beta_ci": f.ci.get("beta"), "a_approach_3": f.a_opt, "a_approach_3_ci": f.ci.get("a_opt"),
                "a_measured": st.optimum.a if st.optimum.status == OK else None,
                "a_measured_ci": st.optimum.ci.get("a") if st.optimum.status == OK else None,
                "a_approach_2": pl.slope if pl and pl.status == OK else None,
                "a_approach_2_ci": pl.ci.get("slope") if pl and pl.status == OK else None})
    return out


def family_design_noise(points: list[Point]) -> DesignNoise:
    """The designer's noise model (sigma of ln L, trunk share) from one family's seed-averaged points
    trained with two or more seeds (their first two seeds), branches grouped by :func:`cluster_labels`."""
    labels = cluster_labels(points)
    return design_noise([(c, p.seed_losses[0], p.seed_losses[1]) for p, c in zip(points, labels)
                         if p.n_seeds >= 2 and len(p.seed_losses or []) >= 2])
