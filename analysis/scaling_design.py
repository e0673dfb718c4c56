"""Scaling-study designer: before any run trains, how precisely will a planned grid determine the exponents?

    python -m analysis.scaling design SPEC [--sims 200] [--seed 0] [--out design.json]
    python -m analysis.scaling design [SPEC] --propose C_MIN C_MAX [--budgets 5] [--sizes 7] [--spread 4]
                                      [--ladder N ...] [--write-spec proposed.yaml]

The designer simulates the whole analysis of :mod:`analysis.scaling` many times: it draws losses from
an assumed law L(N, D) on the planned grid with a seed-noise model, fits every draw as the real study
will (approach 3, :func:`analysis.scaling_fits.fit_loss_nd`; approach 2,
:func:`analysis.scaling_fits.isoflop_profiles`) and reports the spread of the point estimates of
alpha, beta and the compute-optimal exponent a (N_opt ∝ C^a) across the simulated studies. That
spread is what the real study's 95% interval should come out as; a grid whose spread is wide cannot
answer the question, however many seeds it trains.

Conventions:

- N: non-embedding parameters; D: training tokens; C = 6 N D training FLOPs (Kaplan's and
  Chinchilla's convention; archlab's measured FLOPs per token per parameter differ from 6 by the
  attention and LM-head terms, which the designer ignores).
- Assumed law (:class:`Law`): L(N, D) = E + A / N^alpha + B / D^beta in nats/token. Default: the
  Chinchilla replication of Besiroglu et al. 2024, "Chinchilla Scaling: A replication attempt"
  (arXiv:2404.10102), E = 1.82, A = 482.01, alpha = 0.3478, B = 2085.43, beta = 0.3658, so
  a = beta / (alpha + beta) = 0.513.
- Noise (:class:`Noise`): one run's final loss is L(N, D) exp(eps), eps ~ normal(0, sigma^2): sigma
  is the relative seed-to-seed noise of one run (std of ln L, default 0.012, i.e. 1.2%; measure it
  from seed pairs: sigma = std of ln L1 - ln L2 over pairs / sqrt(2)). A point trained with S seeds
  enters the fit as the mean loss of its S runs, as :func:`analysis.scaling.average_seeds` does.
- WSD cooldown branches (``cooldown:``): one warmup-stable trunk per (size, seed), a branch at each
  of that size's budgets (as ``tools.sweep``'s ``cooldown:``). Branches of one trunk share its noise:
  eps = u_trunk + e_branch, u_trunk ~ normal(0, rho sigma^2), e_branch ~ normal(0, (1 - rho) sigma^2),
  rho = ``noise.trunk_share`` (default 0.5, an assumption), so one run still has variance sigma^2.
  ``analysis.scaling`` measures both from a study's seed pairs (its "Seed noise" section:
  :func:`analysis.scaling_fits.design_noise`).
- Training cost: independent runs cost 6 N D each. A trunk with branches at D_1 < ... < D_m and
  decay fraction f (the last f of each branch's steps decay, default 0.2, as ``tools.sweep``) trains
  (1 - f) D_m tokens stable and f D_i tokens of cooldown per branch: 6 N ((1 - f) D_m + f sum_i D_i),
  i.e. the longest branch plus each shorter branch's cooldown. Times the seeds. CPU time = training
  FLOPs / ``throughput.flops_per_s`` (or 6 N_ref tokens_per_s at a stated size N_ref).
- Spread: the 2.5-97.5 percentile range of the point estimates over the simulations whose fit
  succeeded (status "ok"), its width, and the bias = median - true. "width 95%" is a bootstrap
  interval of that width over the simulations: how well the number of simulations pins the width
  down. With ``fit.bootstrap`` > 0 each simulated fit also computes its own bootstrap interval (whole
  trunks resampled, as the study's) and the report gives its median width (what one study should
  report, to set beside the spread) and how often it covers the truth.
- Families (``families:``): each its own law (a partial ``law:`` over the spec's) or the spec's law
  with a constant compute multiplier k (``compute_multiplier: k``: A -> A k^-alpha, so that
  L_opt(C) = L_ref,opt(k C) at every C). The first family is the reference; for every other one
  the designer reports the spread of the fitted multiplier at ``ref_flops``:
  k = C_ref(L_opt(C)) / C with C_ref(L) the reference's compute-optimal compute for loss L, both
  from the approach-3 fits (:func:`compute_multiplier`). A family with its own grid keys or ``seeds``
  is simulated on that grid (its runs and FLOPs are added to the total); the others share the spec's.

Spec file (YAML, OmegaConf; every key but the grid is optional)::

    description: CPU demo, 5 sizes x 4 budgets
    sizes: [1.0e5, 2.0e5, 4.0e5]   # N: non-embedding parameters, crossed with every budget
    flops: [4.0e11, 8.0e11]        # C per point (each size trains D = C / (6 N)), or tokens: [D...]
    # budgets:                     # instead of sizes x flops/tokens: each budget its own sizes
    #   - {flops: 4.0e11, sizes: [2.0e4, 4.0e4, 8.0e4]}
    seeds: 1                       # runs per point (the fits use their mean)
    cooldown: {decay_fraction: 0.2}  # WSD trunk per (size, seed) with a branch per budget (default: none)
    law: {E: 1.82, A: 482.01, alpha: 0.3478, B: 2085.43, beta: 0.3658}
    noise: {sigma: 0.012, trunk_share: 0.5}
    sims: 200                      # simulated studies
    seed: 0
    fit: {n_polish: 20, huber_delta: 1.0e-3, budget_tolerance: 0.1, bootstrap: 0}
    throughput: {flops_per_s: 1.0e10}  # or {tokens_per_s: 5.0e4, size: 1.0e5}
    data: {tokens: 9.0e6, max_epochs: 4}  # unique training tokens of the corpus; points past max_epochs flagged
    families: {dense: {}, moe: {compute_multiplier: 1.5}}
    # a family can train its own grid and seeds (sizes/flops/tokens/budgets, seeds), e.g. a reference
    # at 2 seeds and a cheaper comparison family: {moe: {compute_multiplier: 1.5, seeds: 1, budgets: [...]}}
    ref_flops: 1.0e13              # C of the compute multiplier (default: the grid's largest C)

:func:`propose_grid` plans an IsoFLOP grid: budgets log-spaced over a compute range and, per
budget, ``n_sizes`` sizes of one shared log ladder centred on the law's N_opt(C) and spread over
a factor ``spread`` either side (in ln N), so that each budget brackets its optimum and the trunks
of a WSD sweep serve several budgets. With ``ladder`` (``--ladder``: the N of the sizes one can
build, e.g. each width of a model family) it picks from those sizes instead: per budget the
``n_sizes`` nearest N_opt(C) in ln N among those within the factor ``spread``.

Shapes: P points (size, budget), S seeds, T trunks (distinct sizes), M simulations.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np
from omegaconf import OmegaConf

from analysis.scaling_fits import OK, IsoFLOPResult, NDFit, compute_optimal, fit_loss_nd, isoflop_profiles, json_safe

Q = (2.5, 97.5)  # the spread reported: 95% of the simulated point estimates
SPEC_KEYS = ("description", "sizes", "tokens", "flops", "budgets", "seeds", "cooldown", "law", "noise", "sims",
             "seed", "fit", "throughput", "families", "ref_flops", "data")
LAW_KEYS = ("E", "A", "alpha", "B", "beta")
NOISE_KEYS = ("sigma", "trunk_share")
FIT_KEYS = ("n_polish", "huber_delta", "budget_tolerance", "bootstrap")
COOLDOWN_KEYS = ("decay_fraction",)
THROUGHPUT_KEYS = ("flops_per_s", "tokens_per_s", "size")
DATA_KEYS = ("tokens", "max_epochs")
FAMILY_KEYS = ("law", "compute_multiplier", "seeds", "sizes", "tokens", "flops", "budgets")
GRID_KEYS = ("sizes", "tokens", "flops", "budgets")
BUDGET_KEYS = ("flops", "tokens", "sizes")


# --------------------------------------------------------------------------------------------
# the assumed law, the noise, the grid
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Law:
    """L(N, D) = E + A / N^alpha + B / D^beta (nats/token); default Besiroglu et al. 2024's Chinchilla fit."""

    E: float = 1.82
    A: float = 482.01
    alpha: float = 0.3478
    B: float = 2085.43
    beta: float = 0.3658

    @property
    def a(self) -> float:
        """Compute-optimal exponent: N_opt ∝ C^a, a = beta / (alpha + beta)."""
        return self.beta / (self.alpha + self.beta)

    def loss(self, N, D) -> np.ndarray:
        N, D = np.asarray(N, dtype=float), np.asarray(D, dtype=float)
        return self.E + self.A * N ** (-self.alpha) + self.B * D ** (-self.beta)

    def as_fit(self) -> NDFit:
        """The law as an exact :class:`NDFit` (for :func:`compute_optimal`)."""
        return NDFit(n_points=0, status=OK, E=self.E, A=self.A, alpha=self.alpha, B=self.B, beta=self.beta,
                     a_opt=self.a, b_opt=1.0 - self.a)

    def n_opt(self, C) -> np.ndarray:
        """Compute-optimal N at C = 6 N D FLOPs."""
        return np.array([compute_optimal(self.as_fit(), float(c), 6.0).N_opt for c in np.atleast_1d(C)])

    def with_compute_multiplier(self, k: float) -> "Law":
        """The law of a family k times more compute-efficient: A -> A k^-alpha, i.e. L'(N, D) = L(k N, D),
        whose compute-optimal loss at C is this law's at k C."""
        return replace(self, A=self.A * k ** (-self.alpha))


@dataclass(frozen=True)
class Noise:
    """Seed noise of one run's final loss: sigma = std of ln L; trunk_share = the share of sigma^2 that
    the cooldown branches of one WSD trunk have in common (used with ``cooldown`` only)."""

    sigma: float = 0.012
    trunk_share: float = 0.5


@dataclass
class Plan:
    """The planned grid: one entry per point (size, budget), P points."""

    N: np.ndarray  # (P,) non-embedding parameters
    D: np.ndarray  # (P,) training tokens
    budget: list  # (P,) the FLOPs budget of the point (IsoFLOP tag) or None for a token budget
    seeds: int = 1
    decay_fraction: Optional[float] = None  # None: independent runs; else WSD trunks with branches
    trunk: np.ndarray = field(init=False)  # (P,) index of the point's trunk (its size) in 0..T-1

    def __post_init__(self):
        self.N, self.D = np.asarray(self.N, dtype=float), np.asarray(self.D, dtype=float)
        self.trunk = np.unique(self.N, return_inverse=True)[1].ravel()

    @property
    def C(self) -> np.ndarray:
        return 6.0 * self.N * self.D

    @property
    def n_runs(self) -> int:
        """Runs to train: points x seeds, or (trunks + branches) x seeds."""
        per_seed = len(self.N) + (int(self.trunk.max()) + 1 if self.decay_fraction is not None else 0)
        return per_seed * self.seeds

    def train_flops(self) -> float:
        """Training FLOPs of the whole sweep (see the module docstring for the trunk convention)."""
        if self.decay_fraction is None:
            return float(self.seeds * np.sum(6.0 * self.N * self.D))
        f, total = self.decay_fraction, 0.0
        for t in range(int(self.trunk.max()) + 1):
            D, N = self.D[self.trunk == t], self.N[self.trunk == t][0]
            total += 6.0 * N * ((1.0 - f) * D.max() + f * D.sum())
        return float(self.seeds * total)


@dataclass
class DesignSpec:
    """A checked spec (:func:`load_spec`)."""

    plan: Plan
    families: dict  # name -> Law; the first is the reference
    noise: Noise = field(default_factory=Noise)
    sims: int = 200
    seed: int = 0
    n_polish: int = 20
    huber_delta: float = 1e-3
    budget_tolerance: float = 0.1
    bootstrap: int = 0
    flops_per_s: Optional[float] = None
    data_tokens: Optional[float] = None  # unique training tokens of the corpus (None: not checked)
    max_epochs: float = 4.0
    ref_flops: Optional[float] = None
    description: str = ""
    multipliers: dict = field(default_factory=dict)  # name -> the compute multiplier the spec named
    plans: dict = field(default_factory=dict)  # name -> the family's own grid or seeds (others: ``plan``)

    def plan_of(self, family: str) -> Plan:
        return self.plans.get(family, self.plan)


# --------------------------------------------------------------------------------------------
# the spec
# --------------------------------------------------------------------------------------------


def _err(key: str, value, rule: str) -> ValueError:
    shown = f"{value:g}" if isinstance(value, float) else repr(value)
    return ValueError(f"design spec: {key}={shown}: {rule}")


def _keys(d, key: str, valid: Sequence[str]) -> dict:
    if not isinstance(d, dict):
        raise _err(key, d, f"expected a mapping with keys {', '.join(valid)}")
    unknown = sorted(set(d) - set(valid))
    if unknown:
        where = f"{key}: " if key else ""
        raise ValueError(f"design spec: {where}unknown key(s) {unknown}; valid: {', '.join(valid)}")
    return d


def _number(d: dict, key: str, default, *, lo: float = 0.0, lo_open: bool = True, hi: Optional[float] = None,
            hi_open: bool = False, integer: bool = False, where: str = ""):
    name = f"{where}{key}"
    value = d.get(key, default)
    if value is None:
        return None
    try:
        x = int(value) if integer and float(value) == int(value) else float(value)
    except (TypeError, ValueError):
        raise _err(name, value, "expected a number") from None
    if integer and not isinstance(x, int):
        raise _err(name, value, "expected a whole number")
    below = x <= lo if lo_open else x < lo
    above = hi is not None and (x >= hi if hi_open else x > hi)
    if not math.isfinite(x) or below or above:
        rng = f"{'(' if lo_open else '['}{lo:g}, {'inf)' if hi is None else f'{hi:g}' + (')' if hi_open else ']')}"
        raise _err(name, value, f"must lie in {rng}")
    return x


def _positive(value, key: str, what: str) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise _err(key, value, f"expected a number ({what})") from None
    if not (math.isfinite(x) and x > 0):
        raise _err(key, value, f"must be positive and finite ({what})")
    return x


def _positive_list(value, key: str, what: str) -> list:
    if not isinstance(value, (list, tuple)) or not value:
        raise _err(key, value, f"expected a non-empty list of {what}")
    out = [_positive(v, f"{key}[{i}]", what) for i, v in enumerate(value)]
    if len(set(out)) != len(out):
        raise _err(key, value, "holds a value twice")
    return sorted(out)


def _budget_points(kind: str, budget: float, sizes: Sequence[float]) -> list[tuple[float, float, Optional[float]]]:
    """(N, D, FLOPs tag) of one budget's points: a FLOPs budget C gives D = C / (6 N)."""
    if kind == "flops":
        return [(N, budget / (6.0 * N), budget) for N in sizes]
    return [(N, budget, None) for N in sizes]


def _plan(spec: dict) -> list[tuple[float, float, Optional[float]]]:
    grid_hint = ("give sizes: [N...] (non-embedding parameters) with tokens: [D...] or flops: [C...], or "
                 "budgets: [{flops: C, sizes: [N...]}, ...]")
    if "budgets" in spec:
        clash = [k for k in ("sizes", "tokens", "flops") if k in spec]
        if clash:
            raise ValueError(f"design spec: budgets: and {clash} both given; {grid_hint}")
        budgets = spec["budgets"]
        if not isinstance(budgets, (list, tuple)) or not budgets:
            raise _err("budgets", budgets, f"expected a non-empty list; {grid_hint}")
        points = []
        for j, b in enumerate(budgets):
            where = f"budgets[{j}]"
            _keys(b, where, BUDGET_KEYS)
            if ("flops" in b) == ("tokens" in b):
                raise _err(where, b, "give exactly one of flops: C or tokens: D, and sizes: [N...]")
            if "sizes" not in b:
                raise _err(where, b, "sizes is missing: add sizes: [N...] (non-embedding parameters)")
            kind = "flops" if "flops" in b else "tokens"
            value = _positive(b[kind], f"{where}.{kind}", "training FLOPs" if kind == "flops" else "tokens")
            points += _budget_points(kind, value, _positive_list(b["sizes"], f"{where}.sizes", "parameters"))
        if len(set((N, D) for N, D, _ in points)) != len(points):
            raise _err("budgets", budgets, "two budgets give the same (N, D) point")
        return points
    if "sizes" not in spec:
        raise ValueError(f"design spec: sizes is missing: {grid_hint}")
    sizes = _positive_list(spec["sizes"], "sizes", "non-embedding parameters")
    if ("flops" in spec) == ("tokens" in spec):
        raise ValueError(f"design spec: give exactly one of tokens: [D...] or flops: [C...] (C = 6 N D) with sizes:; "
                         f"{grid_hint}")
    kind = "flops" if "flops" in spec else "tokens"
    budgets = _positive_list(spec[kind], kind, "training FLOPs" if kind == "flops" else "tokens")
    return [p for b in budgets for p in _budget_points(kind, b, sizes)]


def _law(d, base: Law, key: str) -> Law:
    d = _keys(d if d is not None else {}, key, LAW_KEYS)
    values = {k: _number(d, k, getattr(base, k), where=f"{key}.") for k in LAW_KEYS}
    return Law(**values)


def load_spec(source: Union[str, Path, dict]) -> DesignSpec:
    """Read and check a design spec (a YAML file or a mapping); every mistake is a ValueError that
    names the key, its value and the rule."""
    if isinstance(source, dict):
        spec = source
    else:
        path = Path(source)
        if not path.is_file():
            raise ValueError(f"design spec: no such file {str(path)!r}")
        spec = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    if not isinstance(spec, dict):
        raise ValueError(f"design spec: expected a mapping of keys ({', '.join(SPEC_KEYS)}), got {type(spec).__name__}")
    _keys(spec, "", SPEC_KEYS)
    points = _plan(spec)
    seeds = _number(spec, "seeds", 1, lo=1, lo_open=False, integer=True)
    cooldown = spec.get("cooldown")
    decay = None
    if cooldown is True:
        cooldown = {}
    if cooldown not in (None, False):
        decay = _number(_keys(cooldown, "cooldown", COOLDOWN_KEYS), "decay_fraction", 0.2, hi=1.0, hi_open=True,
                        where="cooldown.")
    plan = Plan(N=[p[0] for p in points], D=[p[1] for p in points], budget=[p[2] for p in points], seeds=seeds,
                decay_fraction=decay)
    law = _law(spec.get("law"), Law(), "law")
    noise_d = _keys(spec.get("noise") or {}, "noise", NOISE_KEYS)
    noise = Noise(sigma=_number(noise_d, "sigma", 0.012, lo=0.0, lo_open=False, where="noise."),
                  trunk_share=_number(noise_d, "trunk_share", 0.5, lo=0.0, lo_open=False, hi=1.0, where="noise."))
    fit_d = _keys(spec.get("fit") or {}, "fit", FIT_KEYS)
    thr = _keys(spec.get("throughput") or {}, "throughput", THROUGHPUT_KEYS)
    data_d = _keys(spec.get("data") or {}, "data", DATA_KEYS)
    flops_per_s = _number(thr, "flops_per_s", None, where="throughput.")
    if "tokens_per_s" in thr:
        if flops_per_s is not None or "size" not in thr:
            raise _err("throughput", thr, "give flops_per_s: F, or tokens_per_s: T with size: N (the model "
                                          "size it was measured at; F = 6 N T)")
        flops_per_s = 6.0 * _number(thr, "tokens_per_s", None, where="throughput.") \
            * _number(thr, "size", None, where="throughput.")
    families, multipliers, plans = {}, {}, {}
    fam = spec.get("families")
    if fam is None:
        families["assumed"] = law
    else:
        if not isinstance(fam, dict) or not fam:
            raise _err("families", fam, "expected a mapping name -> {law: {...}} or {compute_multiplier: k}; "
                                        "the first is the reference")
        for name, d in fam.items():
            d = _keys(d if d is not None else {}, f"families.{name}", FAMILY_KEYS)
            f_law = _law(d.get("law"), law, f"families.{name}.law")
            k = _number(d, "compute_multiplier", None, where=f"families.{name}.")
            if k is not None:
                f_law, multipliers[str(name)] = f_law.with_compute_multiplier(k), k
            families[str(name)] = f_law
            if any(key in d for key in (*GRID_KEYS, "seeds")):  # the family's own grid (and/or seeds)
                own = {key: d[key] for key in GRID_KEYS if key in d}
                try:
                    f_points = _plan(own) if own else points
                except ValueError as e:
                    raise ValueError(f"families.{name}: {e}") from None
                plans[str(name)] = Plan(N=[p[0] for p in f_points], D=[p[1] for p in f_points],
                                        budget=[p[2] for p in f_points], decay_fraction=decay,
                                        seeds=_number(d, "seeds", seeds, lo=1, lo_open=False, integer=True,
                                                      where=f"families.{name}."))
    return DesignSpec(
        plan=plan, families=families, noise=noise,
        sims=_number(spec, "sims", 200, lo=1, lo_open=False, integer=True),
        seed=_number(spec, "seed", 0, lo=0, lo_open=False, integer=True),
        n_polish=_number(fit_d, "n_polish", 20, lo=1, lo_open=False, integer=True, where="fit."),
        huber_delta=_number(fit_d, "huber_delta", 1e-3, where="fit."),
        budget_tolerance=_number(fit_d, "budget_tolerance", 0.1, lo=0.0, lo_open=False, where="fit."),
        bootstrap=_number(fit_d, "bootstrap", 0, lo=0, lo_open=False, integer=True, where="fit."),
        flops_per_s=flops_per_s, ref_flops=_number(spec, "ref_flops", None),
        data_tokens=_number(data_d, "tokens", None, where="data."),
        max_epochs=_number(data_d, "max_epochs", 4.0, where="data."),
        description=str(spec.get("description") or ""), multipliers=multipliers, plans=plans)


# --------------------------------------------------------------------------------------------
# one simulated study
# --------------------------------------------------------------------------------------------


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


def compute_multiplier(ref: NDFit, other: NDFit, C: float, k_ref: float = 6.0, k_other: float = 6.0) -> float:
    """k = C_ref(L_other,opt(C)) / C: how much more compute the reference family needs for the loss the
    other reaches compute-optimally at C (C = k N D with each family's ``k_ref`` / ``k_other``, 6 by
    default; the measured training FLOPs per token per parameter make C each family's real FLOPs).
    On the law form L_opt(C) = E + K C^-g exactly, g = alpha beta / (alpha + beta), whatever k.
    NaN without both fits; inf when the other beats the reference's E."""
    if ref.status != OK or other.status != OK or not (ref.alpha > 0 and ref.beta > 0):
        return math.nan
    L_ref, L_other = compute_optimal(ref, C, k_ref).L_opt, compute_optimal(other, C, k_other).L_opt
    if L_other is None or not math.isfinite(L_other):
        return math.nan
    if L_other <= ref.E:
        return math.inf
    g = ref.alpha * ref.beta / (ref.alpha + ref.beta)
    return float(((L_ref - ref.E) / (L_other - ref.E)) ** (1.0 / g))


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


# --------------------------------------------------------------------------------------------
# many simulated studies
# --------------------------------------------------------------------------------------------

QUANTITIES = ("approach 3 alpha", "approach 3 beta", "approach 3 a", "approach 2 a")


@dataclass
class Spread:
    """The spread of one estimate over the simulated studies whose fit succeeded."""

    quantity: str
    true: float
    n_ok: int
    n_sims: int
    median: Optional[float] = None
    bias: Optional[float] = None  # median - true
    interval: Optional[list] = None  # 2.5 and 97.5 percentiles of the estimates
    width: Optional[float] = None
    width_ci: Optional[list] = None  # bootstrap (over simulations) 95% interval of the width
    coverage: Optional[float] = None  # share of the fits' own bootstrap intervals holding the truth
    own_width: Optional[float] = None  # median width of the fits' own bootstrap intervals (what one study reports)
    own_width_range: Optional[list] = None  # their 2.5 and 97.5 percentiles
    estimates: list = field(default_factory=list)

    def to_json(self) -> dict:
        return json_safe(asdict(self))


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


@dataclass
class Design:
    """The designer's answer for one spec: the grid's facts and, per family, the spread of each estimate."""

    spec: DesignSpec
    grid: dict
    spreads: dict  # family -> quantity -> Spread
    statuses: dict  # family -> approach -> {status: count}
    multipliers: dict  # family (not the reference) -> Spread of the compute multiplier at ref_flops
    ref_flops: float
    seconds: float
    family_grids: dict = field(default_factory=dict)  # family with its own grid or seeds -> its grid facts

    def to_json(self) -> dict:
        s = self.spec
        return json_safe({
            "description": s.description, "grid": self.grid, "seconds": self.seconds, "sims": s.sims, "seed": s.seed,
            "noise": asdict(s.noise), "fit": {"n_polish": s.n_polish, "huber_delta": s.huber_delta,
                                              "budget_tolerance": s.budget_tolerance, "bootstrap": s.bootstrap},
            "families": {name: {"law": asdict(law), "a": law.a,
                                "compute_multiplier": s.multipliers.get(name)} for name, law in s.families.items()},
            "spreads": {f: {q: v.to_json() for q, v in qs.items()} for f, qs in self.spreads.items()},
            "statuses": self.statuses, "ref_flops": self.ref_flops, "family_grids": self.family_grids,
            "multipliers": {f: v.to_json() for f, v in self.multipliers.items()}})

    def table(self) -> str:
        return design_table(self)


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
        n_opt = float(law.n_opt(b)[0])
        N = plan.N[sel]
        budgets.append({"flops": b, "n_sizes": int(sel.sum()), "N_min": float(N.min()), "N_max": float(N.max()),
                        "N_opt": n_opt, "bracketed": bool(N.min() <= n_opt <= N.max())})
    flops = plan.train_flops()
    return {"n_points": len(plan.N), "n_sizes": len(np.unique(plan.N)), "N_range": [float(plan.N.min()),
            float(plan.N.max())], "N_decades": float(np.log10(plan.N.max() / plan.N.min())),
            "D_range": [float(plan.D.min()), float(plan.D.max())], "C_range": [float(C.min()), float(C.max())],
            "C_decades": float(np.log10(C.max() / C.min())), "flops_budgets": budgets,
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


# --------------------------------------------------------------------------------------------
# proposing a grid
# --------------------------------------------------------------------------------------------


def _round(x: float, digits: int = 3) -> float:
    return float(f"{x:.{digits}g}")


def propose_grid(flops_min: float, flops_max: float, *, n_budgets: int = 5, n_sizes: int = 7, spread: float = 4.0,
                 law: Law = Law(), ladder: Optional[Sequence[float]] = None) -> dict:
    """An IsoFLOP grid as a spec fragment ``{"budgets": [{"flops": C, "sizes": [N...]}, ...]}``.

    Budgets: ``n_budgets`` log-spaced FLOPs from ``flops_min`` to ``flops_max``. Sizes: one log ladder
    of step r = spread^(2 / (n_sizes - 1)) shared by all budgets (so a WSD trunk serves several); per
    budget the ``n_sizes`` consecutive rungs whose geometric mean is nearest the law's N_opt(C) (within
    a factor sqrt(r)), from about N_opt / spread to N_opt * spread. Sizes are rounded to 3 digits.

    ``ladder``: the sizes that can be built (N values). Each budget then takes the up to ``n_sizes``
    ladder sizes nearest N_opt(C) in ln N among those within [N_opt / spread, N_opt * spread], exactly
    as given; a budget with fewer than 3 there is refused (its IsoFLOP parabola needs 3).
    """
    if not (math.isfinite(flops_min) and flops_min > 0 and math.isfinite(flops_max) and flops_max > flops_min):
        raise ValueError(f"propose_grid: flops range [{flops_min:g}, {flops_max:g}]: need 0 < C_min < C_max")
    if int(n_budgets) != n_budgets or n_budgets < 2:
        raise ValueError(f"propose_grid: n_budgets={n_budgets}: need >= 2 budgets (a slope of N_opt against C)")
    if int(n_sizes) != n_sizes or n_sizes < 3:
        raise ValueError(f"propose_grid: n_sizes={n_sizes}: an IsoFLOP parabola needs >= 3 sizes per budget")
    if not (math.isfinite(spread) and spread > 1):
        raise ValueError(f"propose_grid: spread={spread}: the factor either side of N_opt must be > 1")
    budgets = np.geomspace(flops_min, flops_max, int(n_budgets))
    n_opt = law.n_opt(budgets)
    if ladder is not None:
        return {"budgets": _ladder_grid(budgets, n_opt, ladder, int(n_sizes), spread)}
    log_r = 2.0 * math.log(spread) / (n_sizes - 1)
    base = math.log(n_opt[0] / spread)
    out = []
    for C, n in zip(budgets, n_opt):
        start = round((math.log(n) - base) / log_r - (n_sizes - 1) / 2)
        sizes = [_round(math.exp(base + (start + i) * log_r)) for i in range(int(n_sizes))]
        out.append({"flops": _round(float(C)), "sizes": sizes})
    return {"budgets": out}


def _ladder_grid(budgets: np.ndarray, n_opt: np.ndarray, ladder: Sequence[float], n_sizes: int,
                 spread: float) -> list[dict]:
    """:func:`propose_grid` on a ladder of buildable sizes."""
    rungs = sorted({float(n) for n in ladder})
    bad = [n for n in rungs if not (math.isfinite(n) and n > 0)]
    if not rungs or bad:
        raise ValueError(f"propose_grid: ladder {list(ladder)}: needs positive, finite sizes N")
    out = []
    for C, n in zip(budgets, n_opt):
        near = [r for r in rungs if n / spread <= r <= n * spread]
        near = sorted(sorted(near, key=lambda r: abs(math.log(r / n)))[:n_sizes])
        if len(near) < 3:
            raise ValueError(f"propose_grid: budget {C:.3g} FLOPs (N_opt {n:.3g}): {len(near)} ladder size(s) within "
                             f"x{spread:g} of N_opt ({n / spread:.3g}-{n * spread:.3g}); an IsoFLOP parabola needs 3: "
                             "add sizes there, raise the spread or move the budgets")
        out.append({"flops": _round(float(C)), "sizes": near})
    return out


def _yaml_number(x: float, digits: int = 3) -> str:
    """``digits`` significant digits, always readable as a float by YAML (4.0e+11, not 4e+11)."""
    s = f"{x:.{digits}g}"
    mantissa, _, exp = s.partition("e")
    return (mantissa if "." in mantissa else mantissa + ".0") + (f"e{exp}" if exp else "")


def spec_yaml(spec: dict) -> str:
    """A spec mapping as YAML, with a ``budgets:`` grid one budget per line (sizes to 6 digits: a ladder's
    N as given)."""
    rest = {k: v for k, v in spec.items() if k != "budgets"}
    text = OmegaConf.to_yaml(OmegaConf.create(json_safe(rest))) if rest else ""
    if "budgets" in spec:
        text += "budgets:\n" + "".join(
            f"  - {{flops: {_yaml_number(b['flops'])}, sizes: [{', '.join(_yaml_number(n, 6) for n in b['sizes'])}]}}\n"
            for b in spec["budgets"])
    return text


# --------------------------------------------------------------------------------------------
# the report
# --------------------------------------------------------------------------------------------


def _g(x, fmt: str = ".3g") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return format(x, fmt)


def _duration(seconds: float) -> str:
    for unit, s in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= s:
            return f"{seconds / s:.3g} {unit}"
    return f"{seconds:.3g} s"


def _grid_sentence(g: dict) -> str:
    budgets = g["flops_budgets"]
    bud = (f"{len(budgets)} FLOPs budgets {_g(g['C_range'][0])}-{_g(g['C_range'][1])}" if budgets else
           f"{len(g['token_budgets'])} token budgets {_g(g['D_range'][0])}-{_g(g['D_range'][1])}")
    runs = (f"WSD trunks with cooldown branches (decay fraction {g['cooldown']:g})" if g["cooldown"] is not None
            else "independent runs")
    cpu = f", {_duration(g['cpu_seconds'])} at {_g(g['flops_per_s'])} FLOP/s" if g["cpu_seconds"] else ""
    return (f"{g['n_points']} points, {g['n_sizes']} sizes N = {_g(g['N_range'][0])}-{_g(g['N_range'][1])} "
            f"({g['N_decades']:.2f} decades), {bud} (C = 6ND over {g['C_decades']:.2f} decades), "
            f"{g['seeds']} seed(s), {runs}: {g['runs']} runs, {_g(g['train_flops'])} training FLOPs{cpu}.")


def design_table(d: Design) -> str:
    """Markdown: the grid, the assumptions, the spread of each estimate per family, the multipliers."""
    s, g = d.spec, d.grid
    lines = [f"## Scaling-study design{': ' + s.description if s.description else ''}", ""]
    budgets = g["flops_budgets"]
    shared = [f for f in s.families if f not in d.family_grids]
    if shared:
        whose = f" (families {', '.join(shared)})" if d.family_grids else ""
        lines.append(f"Grid{whose}: {_grid_sentence(g)}")
    for f, fg in d.family_grids.items():
        lines.append(f"Grid of {f}: {_grid_sentence(fg)}")
    if d.family_grids:
        runs = len(shared) * g["runs"] + sum(fg["runs"] for fg in d.family_grids.values())
        flops = len(shared) * g["train_flops"] + sum(fg["train_flops"] for fg in d.family_grids.values())
        cpu = f", {_duration(flops / s.flops_per_s)} at {_g(s.flops_per_s)} FLOP/s" if s.flops_per_s else ""
        lines.append(f"All {len(s.families)} families: {runs} runs, {_g(flops)} training FLOPs{cpu}.")
    lines += [f"Noise: sigma = {s.noise.sigma:.3g} of ln L per run"
              + (f", trunk share {s.noise.trunk_share:g}" if g["cooldown"] is not None else "")
              + f". {s.sims} simulated studies per family (seed {s.seed}), {d.seconds:.1f} s."]
    if g["data_tokens"]:
        past = g["points_past_max_epochs"]
        lines.append(f"Data: {_g(g['data_tokens'])} unique training tokens; the longest point reads them "
                     f"{g['epochs_max']:.2g} times; {past} point(s) past {g['max_epochs']:g} epochs"
                     + (" (the law assumes fresh data: shrink their D or grow the corpus)." if past else "."))
    lines.append("")
    for name, law in s.families.items():
        k = s.multipliers.get(name)
        lines.append(f"- law `{name}`: E = {law.E:.4g}, A = {law.A:.5g}, alpha = {law.alpha:.4g}, B = {law.B:.5g}, "
                     f"beta = {law.beta:.4g} (a = {law.a:.3f})" + (f", compute multiplier {k:g}" if k else ""))
    lines.append("")
    if budgets:
        lines += ["| budget C (FLOPs) | sizes | N range | law's N_opt | bracketed |", "|---|---|---|---|---|"]
        lines += [f"| {_g(b['flops'])} | {b['n_sizes']} | {_g(b['N_min'])}-{_g(b['N_max'])} | {_g(b['N_opt'])} | "
                  f"{'yes' if b['bracketed'] else 'NO'} |" for b in budgets]
        lines.append("")
    boot = s.bootstrap > 0
    lines += ["width: 97.5th - 2.5th percentile of the simulated point estimates, the 95% interval the study "
              "should expect; width 95%: its bootstrap interval over the simulations (more sims narrow it).", ""]
    head = "| family | estimate | true | median | bias | 95% of estimates | width | width 95% | fits ok |"
    lines += [head + (" own CI: median width | own CI covers |" if boot else ""), "|---" * (9 + 2 * boot) + "|"]
    for f, qs in d.spreads.items():
        for q, v in qs.items():
            iv = f"[{_g(v.interval[0])}, {_g(v.interval[1])}]" if v.interval else "-"
            wc = f"[{_g(v.width_ci[0], '.2g')}, {_g(v.width_ci[1], '.2g')}]" if v.width_ci else "-"
            row = (f"| {f} | {q} | {v.true:.3f} | {_g(v.median)} | {_g(v.bias, '+.3f')} | {iv} | "
                   f"**{_g(v.width)}** | {wc} | {v.n_ok}/{v.n_sims} |")
            lines.append(row + (f" {_g(v.own_width)} | {_g(v.coverage, '.0%')} |" if boot else ""))
    lines.append("")
    for f, st in d.statuses.items():
        for approach, counts in st.items():
            bad = {k: c for k, c in counts.items() if k != OK}
            if bad:
                lines.append(f"- {f}, {approach}: failed in " + ", ".join(f"{c} ({k})" for k, c in bad.items())
                             + " of the simulated studies; the spread is over the others")
    if d.multipliers:
        lines += [""] if lines[-1] else []
        lines += [f"Compute multiplier at C = {d.ref_flops:.3g} FLOPs (approach 3 fits of both families; "
                  "width = 97.5th / 2.5th percentile):", "",
                  "| family | true k | median | 95% of estimates | width (ratio) | fits ok |", "|---" * 6 + "|"]
        for f, v in d.multipliers.items():
            iv = f"[{_g(v.interval[0])}, {_g(v.interval[1])}]" if v.interval else "-"
            lines.append(f"| {f} | {v.true:.3g} | {_g(v.median)} | {iv} | **{_g(v.width)}x** | {v.n_ok}/{v.n_sims} |")
    return "\n".join(lines).rstrip() + "\n"


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def main(argv: Optional[Sequence[str]] = None) -> int:
    doc = __doc__.split("\nConventions:")[0]
    ap = argparse.ArgumentParser(prog="python -m analysis.scaling design", description=doc.split("\n\n")[0],
                                 epilog=doc.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("spec", nargs="?", help="design spec (YAML; see analysis/scaling_design.py)")
    ap.add_argument("--sims", type=int, default=None, help="simulated studies per family (default: the spec's, 200)")
    ap.add_argument("--seed", type=int, default=None, help="simulation seed (default: the spec's, 0)")
    ap.add_argument("--out", type=Path, help="write every number as JSON to this file")
    ap.add_argument("--propose", type=float, nargs=2, metavar=("C_MIN", "C_MAX"),
                    help="replace the spec's grid (or design from defaults) by an IsoFLOP grid over this FLOPs range")
    ap.add_argument("--budgets", type=int, default=5, help="--propose: FLOPs budgets (default 5)")
    ap.add_argument("--sizes", type=int, default=7, help="--propose: sizes per budget (default 7)")
    ap.add_argument("--spread", type=float, default=4.0,
                    help="--propose: sizes from N_opt / spread to N_opt * spread (default 4)")
    ap.add_argument("--ladder", type=float, nargs="+", metavar="N",
                    help="--propose: pick each budget's sizes from these N (the sizes you can build)")
    ap.add_argument("--write-spec", type=Path, help="--propose: write the proposed spec (YAML) to this file")
    args = ap.parse_args(argv)
    try:
        if args.ladder is not None and args.propose is None:
            raise ValueError("--ladder is the sizes --propose picks from: add --propose C_MIN C_MAX")
        if args.spec is None and args.propose is None:
            raise ValueError("give a design spec (YAML), or --propose C_MIN C_MAX")
        if args.write_spec is not None and args.propose is None:
            raise ValueError("--write-spec writes the --propose grid: add --propose C_MIN C_MAX")
        if args.sims is not None and args.sims < 1:
            raise ValueError(f"--sims {args.sims}: must be >= 1")
        raw = {}
        if args.spec is not None:
            path = Path(args.spec)
            if not path.is_file():
                raise ValueError(f"design spec: no such file {args.spec!r}")
            raw = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
            if not isinstance(raw, dict):
                raise ValueError(f"design spec {args.spec}: expected a mapping")
        if args.propose is not None:
            law = _law(raw.get("law"), Law(), "law")
            raw = {k: v for k, v in raw.items() if k not in ("sizes", "tokens", "flops", "budgets")}
            raw.update(propose_grid(args.propose[0], args.propose[1], n_budgets=args.budgets, n_sizes=args.sizes,
                                    spread=args.spread, law=law, ladder=args.ladder))
            raw["description"] = (f"proposed grid, {args.budgets} budgets {args.propose[0]:g}-{args.propose[1]:g} "
                                  f"FLOPs x {args.sizes} sizes (x{args.spread:g} around N_opt)"
                                  + (f" from a ladder of {len(set(args.ladder))} sizes" if args.ladder else ""))
        spec = load_spec(raw)
        design = simulate(spec, sims=args.sims, seed=args.seed)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(design.table(), end="")
    if args.propose is not None:
        print("\nProposed grid (spec YAML):\n")
        print(spec_yaml(raw), end="")
        if args.write_spec is not None:
            args.write_spec.parent.mkdir(parents=True, exist_ok=True)
            args.write_spec.write_text(spec_yaml(raw))
            print(f"\nwrote {args.write_spec}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(design.to_json(), indent=1) + "\n")
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
