'''Scaling laws from run folders: L(C) per family, the parametric L(N, D), IsoFLOP profiles,
the compute-optimal allocation and three estimates of its exponent, with seed noise.

    python -m analysis.scaling runs/sweep-demo --out docs/scaling [--n-kind non_embedding|total|active]
    python -m analysis.scaling design SPEC [--propose C_MIN C_MAX]   # before training: :mod:`analysis.scaling_design`

Each finished run is a point: N = its parameters (``--n-kind``, from the recipe via
``archlab.costs.param_counts``; one definition for every family and every approach, named in
every table and axis), D = tokens seen, C = training FLOPs (D x the run's training
FLOPs per token, archlab's cost model) and L = final validation loss (nats/token). Runs that are
the same point (recipe and overrides equal but for ``train.seed`` and bookkeeping such as the run
name, and the same tokens) are seeds of one point: the fits use their mean loss, the plots show
their spread as error bars, and the report states the noise floor (pooled std of the seed groups)
and the designer's noise model measured from the seed pairs (sigma of ln L, the trunk share).
A run that failed, did not finish or diverged, one whose final loss is within ``LEARN_MARGIN``
(0.1 nats) of its training split's unigram entropy (it learned only token frequencies), and a
WSD stable trunk (summary.json ``role`` "stable": its cooldown branches are the points), is
reported and left out. Per family:

- L(C) = E + A * C^(-alpha), Huber loss on log L from a grid of starts, 95% bootstrap intervals
  (over points; with fewer than six points over residuals, since resampled point sets then
  almost always repeat the original). Fewer than four points: "under-determined".
- Approach 3: L(N, D) = E + A / N^alpha + B / D^beta (Hoffmann et al. 2022: log-sum-exp form,
  Huber delta 1e-3 on log L, L-BFGS-B from the 4,500-point grid), bootstrap intervals; the
  compute-optimal N_opt(C) = G (C/k)^a, D_opt = G^-1 (C/k)^b, a = beta/(alpha+beta),
  b = alpha/(alpha+beta), G = (alpha A / (beta B))^(1/(alpha+beta)) and D/N at a reference
  compute, for C = k N D with k = the family's measured training FLOPs per token per parameter
  (median over its runs; archlab counts matmul FLOPs, so attention and the LM head make k
  differ from 6), and for k = 6 beside it.
- Approach 2: IsoFLOP profiles. Points group by compute budget (the sweep's FLOPs budget from
  its manifest, else training FLOPs within ``--budget-tolerance``, 10%); per budget with >= 3
  sizes a parabola of L in ln N and its minimum N*; N*(C) ∝ C^a through the bracketed minima.
- Approach 1: the lowest-loss-per-FLOP envelope of the validation curves; N of the run on it
  against C gives a. The three estimates of a are tabled side by side.

N, by default (``non_embedding``): Kaplan et al. (2020)'s non-embedding parameters, with the LM
head left out whether it is tied to the token table or not. Kaplan et al. exclude the embedding
tables; a tied head *is* the token table, so counting an untied head (archlab.costs'
``non_embedding``) would give a LLaMA-style model V*D more parameters than a tied model of the
same shape: a family-dependent shift of N that is large at small sizes (the head is a big share
of a tiny model) and so moves alpha and a between families for a bookkeeping reason. Leaving the
head out of both makes N the blocks only; the head's compute stays in C (measured FLOPs). Pearce
& Song (2024) show the fitted exponents move with this choice (counting embeddings or not
reconciles Kaplan's and Chinchilla's exponents), so the report also fits every family under each
other definition (``with_head``: + the head's D x V matmul, tied or untied; ``untied_head``;
``total``; ``active``) and tables alpha, beta and a side by side ("Sensitivity to the definition of N").

Cooldown branches of one WSD trunk share its noise (its data order and weights up to the branch
step), as do the seed groups built from them: the bootstraps of approaches 3 and 2 resample whole
clusters (:func:`cluster_labels`: points whose runs share a trunk, through summary.json
``branch_from``), not points; approach 2's jointly over its budgets, where one trunk has a branch
at each.

Degenerate inputs (one model size, one budget, too few points, NaN losses) give a status string
in every result and table, never a traceback. A result that was computed but should not be read as
sound is flagged by name in place of "ok", in its table and in fits.json (``status``, and the list
``flags``; the numbers stay as computed and are used as before):

- "interval at bound (alpha <= 5)" (or "estimate at bound", without an interval): a parameter of the
  L(C) or L(N, D) fit whose 95% interval reaches a bound of the optimiser (alpha, beta in [0, 5], E
  above 1e-6 for L(C), ...; within 0.1% of the bound's span, and E under 0.1% of the smallest loss,
  where it no longer changes the fit, counts as at its bound): the interval is cut by the bound, not
  by the data;
- "minimum not bracketed": an IsoFLOP budget whose lowest loss is at its smallest or largest trained
  size (loss monotone in N; the minimum placed by the parabola's shape alone; still in N*(C), which is
  flagged with it), or whose parabola's vertex lies outside the trained sizes (status
  "minimum-outside-sampled-range", left out of N*(C));
- "N_opt outside the trained sizes": approach 3's compute-optimal N_opt (or a budget's N*) beyond the
  smallest or largest N trained, an extrapolation.

Checks of the fits:

- Approaches 2 and 3 side by side: a3 - a2 with a 95% interval (their bootstrap draws paired at
  random, as if independent: conservative) and "agree" when it holds 0
  (:meth:`FamilyStudy.agreement`).
- A prediction that can fail (``--holdout size``, the default, or ``budget``): approach 3 refitted
  without the largest model size (or compute budget) predicts the losses left out, with a 95%
  prediction interval (:func:`holdout_prediction`); the table gives measured, predicted, error and
  whether each falls inside.
- Families as compute multipliers (``--pairs REF:FAM``, or every family against ``--reference``,
  default dense): m(C) = how many times the compute REF needs to reach, compute-optimally, the loss
  FAM reaches compute-optimally at C (:class:`MultiplierCurve`), from the two approach-3 fits with
  each family's measured k, a band over their bootstrap fits, only over the C both measured; a pair
  with an MoE family also under N = active and N = total.
- MoE at equal active and equal total parameters (:func:`equal_params_comparison`, for each pair of a
  dense reference and an MoE family): each MoE point against the reference's L(N, D) at its D, at its
  active N and at its total N, and N_eq / N active, N_eq / N total with N_eq the reference's N that
  matches it.
- The design against the result (``--prediction FAM=PATH[:DESIGN_FAMILY]``): the widths that
  ``python -m analysis.scaling design`` predicted for the grid (approach 3's alpha, beta and a,
  approach 2's a, the compute multiplier) beside the intervals the study obtained
  (:func:`prediction_rows`), and the noise it assumed beside the one measured.
- Budgets: what the sweep's FLOPs budgets count (``cooldown.compute`` in its manifest: measured
  training FLOPs or 6 N D) is stated beside the IsoFLOP table (:func:`budget_convention`).

Outputs (``--out DIR``): loss_vs_flops.png, loss_vs_tokens.png, dense_vs_moe.png, isoflop.png
(loss against N per budget with parabolas and minima; N* against C), loss_nd.png (loss against D
per N with the fitted L(N, D)), compute_multiplier.png (m(C) per pair with its band, one panel
per N), fits.json (every number) and fits.md (the tables, also printed). dense_vs_moe.png needs a
dense and an MoE family, compute_multiplier.png a pair of families with fits: otherwise they are not
written and a line says why.

Python API (numerics in :mod:`analysis.scaling_fits`, figures in :mod:`analysis.scaling_plots`,
all importable from here):

- ``fit_power_law(C, L, ...) -> PowerLawFit``: L(C) = E + A C^-alpha.
- ``fit_loss_nd(N, D, L, ...) -> NDFit``: approach 3; ``NDFit.predict(N, D)``.
- ``compute_optimal(nd_fit, C, k=6.0) -> ComputeOptimal``: N_opt, D_opt, D/N, L_opt, a, b, G.
- ``isoflop_profiles(N, C, L, ...) -> IsoFLOPResult``: approach 2 (``fit_isoflop_profile`` for
  one budget, ``group_budgets`` for the grouping, ``fit_log_log`` for N*(C)).
- ``envelope_exponent(curves, sizes, ...) -> EnvelopeExponent``: approach 1 (``envelope``,
  ``pareto_frontier``).
- ``pooled_std(groups) -> NoiseFloor``: the seed noise floor.
- ``cluster_labels(points)``: the bootstrap's independent units; ``holdout_prediction(N, D, L, ...)``;
  ``multiplier_curve(ref_study, study)``, ``family_pairs(...)``, ``equal_params_comparison(ref_study, points)``.
- ``collect(runs)``, ``average_seeds(points, curves)``, ``study_family(...) -> FamilyStudy``,
  ``analyse(inputs, out, ...)``: from run folders to every result above (``main`` is the CLI).
'''

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
from omegaconf import OmegaConf
from scipy.optimize import least_squares, nnls

from analysis.runs import LEARN_MARGIN, SWEEP_MANIFEST, RunError, expand_inputs, write_json_atomic, write_text_atomic
from analysis.scaling_design import compute_multiplier
from analysis.scaling_fits import (  # noqa: F401  (re-exported: the API of analysis.scaling)
    HOLDOUT_BY,
    NEGLIGIBLE,
    OK,
    ComputeOptimal,
    DesignNoise,
    EnvelopeExponent,
    HoldoutPrediction,
    IsoFLOPProfile,
    IsoFLOPResult,
    LogLogFit,
    NDFit,
    NoiseFloor,
    _interval,
    _log_ci,
    bound_flags,
    bound_thresholds,
    compute_optimal,
    design_noise,
    difference_interval,
    envelope,
    envelope_exponent,
    fit_isoflop_profile,
    fit_log_log,
    fit_loss_nd,
    group_budgets,
    holdout_prediction,
    isoflop_profiles,
    json_safe,
    pareto_frontier,
    pooled_std,
    reported_status,
    sample_fits,
)
from analysis.scaling_plots import (
    compute_multiplier_skip,
    dense_vs_moe_skip,
    plot_compute_multiplier,
    plot_dense_vs_moe,
    plot_isoflop,
    plot_loss_nd,
    plot_loss_vs_flops,
    plot_loss_vs_tokens,
)
from archlab.train.checkpoint import CKPT_DIR

MIN_POINTS = 4  # 3 parameters (E, A, alpha) + at least one degree of freedom
RANGE_SLACK = 1.05  # dense-vs-MoE comparisons reach 5% beyond a dense family's range
PAIRS_MIN_POINTS = 6  # below this, bootstrap the residuals instead of the points (see _bootstrap)


# --------------------------------------------------------------------------------------------
# the fit
# --------------------------------------------------------------------------------------------


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


def _residuals(theta: np.ndarray, x: np.ndarray, log_L: np.ndarray) -> np.ndarray:
    log_E, log_A, alpha = theta
    return np.log(np.exp(log_E) + np.exp(log_A) * x ** (-alpha)) - log_L


def _jacobian(theta: np.ndarray, x: np.ndarray, log_L: np.ndarray) -> np.ndarray:
    log_E, log_A, alpha = theta
    E, power = np.exp(log_E), np.exp(log_A) * x ** (-alpha)
    m = E + power
    return np.stack([E / m, power / m, -power * np.log(x) / m], axis=1)  # (n, 3)


def _huber(r: np.ndarray, delta: float) -> float:
    a = np.abs(r)
    return float(np.where(a <= delta, 0.5 * r * r, delta * (a - 0.5 * delta)).sum())


ALPHA_GRID = np.geomspace(1e-3, 5.0, 240)


def _profile_start(x: np.ndarray, L: np.ndarray, huber_delta: float) -> tuple[float, float, float]:
    """A global starting point: for each alpha of a grid, (E, A_ref) >= 0 by iteratively
    reweighted non-negative least squares on relative residuals (~ log residuals, Huber
    weights); keep the alpha with the lowest Huber loss on log L. For fixed alpha the model is
    linear in (E, A_ref), so this explores the flat E-A valley that trips local optimisers."""
    best, best_obj = None, math.inf
    log_L = np.log(L)
    for alpha in ALPHA_GRID:
        M = np.stack([np.ones_like(x), x ** (-alpha)], axis=1) / L[:, None]  # rows: (1, u) / L
        w = np.ones_like(L)
        for _ in range(3):
            (E, A), _ = nnls(M * np.sqrt(w)[:, None], np.sqrt(w))
            r = np.log(np.maximum(E + A * x ** (-alpha), 1e-12)) - log_L
            w = np.where(np.abs(r) <= huber_delta, 1.0, huber_delta / np.maximum(np.abs(r), 1e-300))
        obj = _huber(r, huber_delta)
        if obj < best_obj:
            best, best_obj = (math.log(max(E, 1e-6)), math.log(max(A, 1e-12)), float(alpha)), obj
    return best


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
    """Best (log E, log A_ref, alpha): the profile start and any extra starts, each polished by
    bounded least squares with a Huber loss on log L. None if every start fails."""
    log_L = np.log(L)
    lo, hi = _lc_bounds(L)
    start = np.asarray(_profile_start(x, L, huber_delta))
    best, best_cost = start, _huber(_residuals(start, x, log_L), huber_delta)
    for theta0 in [start, *extra_inits]:
        theta0 = np.clip(np.asarray(theta0, dtype=float), np.add(lo, 1e-9), np.subtract(hi, 1e-9))
        try:
            res = least_squares(_residuals, theta0, jac=_jacobian, args=(x, log_L), loss="huber",
                                f_scale=huber_delta, bounds=(lo, hi), method="trf", max_nfev=max_nfev)
        except (ValueError, FloatingPointError):
            continue
        cost = _huber(_residuals(res.x, x, log_L), huber_delta)
        # status 0 = evaluation budget spent: along the flat E-A valley that is still a usable fit
        if res.status >= 0 and np.isfinite(cost) and cost < best_cost:
            best, best_cost = res.x, cost
    return best if np.all(np.isfinite(best)) else None


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
    c_ref = float(np.exp(np.mean(np.log(C))))
    x = C / c_ref
    theta = _fit_once(x, L, huber_delta, _init_grid(L)[::3], max_nfev=500)
    if theta is None:
        return PowerLawFit(n_points=n, status="failed", message="least squares did not converge from any start")
    fit = _to_fit(theta, n, c_ref)
    fit.rms_log_residual = float(np.sqrt(np.mean(_residuals(theta, x, np.log(L)) ** 2)))
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


# --------------------------------------------------------------------------------------------
# points from runs
# --------------------------------------------------------------------------------------------

N_KINDS = {  # --n-kind -> what N counts, as named in every table and figure (see the module docstring)
    "non_embedding": "non-embedding parameters, LM head excluded",  # Kaplan's N, tied or untied alike (default)
    "with_head": "non-embedding parameters + LM head",  # the head's D x V matmul counted, tied or untied alike
    "untied_head": "non-embedding parameters, untied LM head only",  # archlab.costs' non_embedding: tied != untied
    "active": "active non-embedding parameters, LM head excluded",  # one token's: MoE's K routed + shared experts
    "total": "total parameters",  # embeddings and an untied head included
}
N_COUNTS = {"non_embedding": "non_embedding_no_head", "with_head": "non_embedding_with_head",
            "untied_head": "non_embedding", "active": "active_no_head", "total": "total"}  # archlab.costs.param_counts
# recipe keys ignored when recognising the seeds of one point: the seed itself, and keys that
# name, place or log a run without changing what it learns
SEED_KEYS = ("train.seed",)
BOOKKEEPING_KEYS = ("name", "description", "extra", "train.run_name", "train.out_dir", "train.resume",
                    "train.log_every", "train.ckpt_every", "train.keep_last", "train.tensorboard",
                    "train.trackers", "train.tracker_project", "train.router_trace_every",
                    "train.routing_every", "train.peak_flops", "train.compile", "data.cache_dir",
                    "train.branch_from", "train.ckpt_steps")  # a cooldown branch's trunk folder and its checkpoints


@dataclass
class Point:
    """One finished run (or the mean of a seed group) as a point of its family's scaling curves."""

    run: str  # the run (a seed group: its first run by seed)
    family: str
    is_moe: bool
    flops: float  # training FLOPs spent: tokens seen x training FLOPs per token
    loss: float  # final validation loss (nats/token) at the training context length; a seed group's mean
    tokens: float
    params_total: int
    params_active: int
    flops_per_token: float
    params: dict = field(default_factory=dict)  # every count of archlab.costs.param_counts
    seed: Optional[int] = None  # train.seed
    group: str = ""  # seed-group key: the recipe without SEED_KEYS and BOOKKEEPING_KEYS, and the tokens
    budget: Optional[float] = None  # the sweep's FLOPs budget of this point (its manifest), if any
    budget_compute: str = ""  # what that budget counts: "measured" training FLOPs | "6nd" | "" (no sweep budget)
    n_seeds: int = 1
    loss_std: float = 0.0  # std of the loss over the seeds (ddof 1; 0 for one seed)
    seed_runs: list = field(default_factory=list)
    seed_losses: list = field(default_factory=list)
    units: list = field(default_factory=list)  # independent units of its runs: a branch's trunk folder, else the run


def n_of_counts(counts: dict, kind: str) -> float:
    """N of kind ``kind`` (a key of ``N_KINDS``) from a run's ``archlab.costs.param_counts`` dict."""
    if kind not in N_KINDS:
        raise ValueError(f"n_kind {kind!r}: valid are {', '.join(N_KINDS)}")
    return float(counts[N_COUNTS[kind]])


def n_params(p: Point, kind: str) -> float:
    """The N of a point (a key of ``N_KINDS``)."""
    return n_of_counts(p.params, kind)


def trunk_of(run) -> Optional[str]:
    """The run folder a cooldown branch started from (summary.json ``branch_from``, else the recipe's
    ``train.branch_from``: a checkpoint ``<trunk>/checkpoints/step_...``), None for other runs."""
    src = (run.summary or {}).get("branch_from") or run.recipe.train.get("branch_from")
    if not src:
        return None
    path = Path(str(src))
    return str(path.parent.parent if path.parent.name == CKPT_DIR else path)


def cluster_labels(points: list[Point]) -> list[int]:
    """One label per point; points share a label when their runs share a trunk, directly or through
    other points (a seed group of branches joins the trunks of all its seeds). A run that is not a
    branch is its own unit. These are the independent units that the bootstrap resamples."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for p in points:
        units = p.units or [p.run]
        for u in units[1:]:
            parent[find(u)] = find(units[0])
    roots: dict[str, int] = {}
    return [roots.setdefault(find((p.units or [p.run])[0]), len(roots)) for p in points]


def seed_key(recipe, tokens: Optional[float]) -> str:
    """Runs with equal keys are seeds of one point: same resolved recipe but for ``SEED_KEYS`` and
    ``BOOKKEEPING_KEYS``, and the same tokens seen."""
    try:
        d = OmegaConf.to_container(recipe, resolve=True)
    except Exception:  # an interpolation that does not resolve outside its run: compare it unresolved
        d = OmegaConf.to_container(recipe, resolve=False)
    for key in SEED_KEYS + BOOKKEEPING_KEYS:
        *path, last = key.split(".")
        node = d
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    blob = json.dumps([d, None if tokens is None else round(tokens)], sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:12]


def _sweep_budgets(folder: Path, cache: dict) -> dict[str, tuple[float, str]]:
    """run name -> (FLOPs budget, what it counts: "measured" training FLOPs or "6nd") from the sweep
    manifest in ``folder`` (``tools.sweep``'s ``cooldown.compute``; empty if none or unreadable)."""
    if folder not in cache:
        cache[folder] = {}
        try:
            manifest = json.loads((folder / SWEEP_MANIFEST).read_text())
            for p in manifest.get("points", []):
                if p.get("budget_kind") == "flops" and p.get("budget"):
                    compute = (p.get("cooldown") or {}).get("compute", "measured")
                    cache[folder][str(p["name"])] = (float(p["budget"]), str(compute))
        except (OSError, ValueError, TypeError, AttributeError):
            pass
    return cache[folder]


BUDGET_CONVENTIONS = {"measured": "measured training FLOPs", "6nd": "C = 6 N D (N: non-embedding without the head)",
                      "": "training FLOPs within the budget tolerance (no sweep budget)"}


def budget_convention(points: list[Point]) -> str:
    """What the IsoFLOP budgets of these points count, in words (one line per convention found)."""
    kinds = sorted({p.budget_compute for p in points})
    return "; ".join(f"{BUDGET_CONVENTIONS.get(k, k)} ({sum(p.budget_compute == k for p in points)} points)"
                     for k in kinds)


def collect(runs, keep_unlearned: bool = False) \
        -> tuple[list[Point], list[dict], dict[str, list[tuple[str, np.ndarray, np.ndarray, np.ndarray]]]]:
    """(points of finished runs, excluded runs with reasons, validation curves per family).

    Curves: family -> [(run, tokens_T, flops_T, loss_T)] from each usable run's validation rows.
    ``keep_unlearned``: a run that did not get ``LEARN_MARGIN`` below its unigram entropy stays a point
    (for smoke tests of tiny runs), listed in the excluded list with status "near-unigram (kept)".
    """
    points, excluded, curves, manifests = [], [], {}, {}
    for r in runs:
        if r.status != "finished":
            excluded.append({"run": str(r.path), "status": r.status, "reason": r.reason})
            continue
        if (r.summary or {}).get("role") == "stable":
            excluded.append({"run": str(r.path), "status": "not-a-scaling-point",
                             "reason": "a WSD stable trunk (constant lr to the end): its cooldown branches are the "
                                       "scaling points"})
            continue
        unigram = (r.summary or {}).get("unigram_entropy_train")
        if unigram is not None and math.isfinite(unigram) and float(r.final_val_loss) > unigram - LEARN_MARGIN:
            excluded.append({"run": str(r.path), "status": "near-unigram (kept)" if keep_unlearned else "near-unigram",
                             "reason": f"final validation loss {float(r.final_val_loss):.3f} is not {LEARN_MARGIN} "
                                       f"nats below the training split's unigram entropy {unigram:.3f}: it learned no "
                                       "more than token frequencies, not a point on a scaling law"
                                       + ("; kept as a point (--keep-unlearned)" if keep_unlearned else "")})
            if not keep_unlearned:
                continue
        tokens = r.tokens_seen
        seed = r.recipe.train.get("seed")
        budget, compute = _sweep_budgets(r.path.parent, manifests).get(r.name, (None, ""))
        trunk = trunk_of(r)
        points.append(Point(run=r.name, family=r.family, is_moe=r.is_moe, flops=r.training_flops(tokens),
                            loss=float(r.final_val_loss), tokens=tokens, params_total=r.params["total"],
                            params_active=r.params["active"], flops_per_token=r.flops_per_token,
                            params=dict(r.params), seed=None if seed is None else int(seed),
                            group=seed_key(r.recipe, tokens),
                            budget=budget, budget_compute=compute,
                            seed_runs=[r.name], seed_losses=[float(r.final_val_loss)],
                            units=[trunk or str(r.path)]))
        rows = [v for v in r.val_rows if v.get("tokens") and math.isfinite(v["loss"])]
        if rows:
            t = np.array([v["tokens"] for v in rows], dtype=float)
            curves.setdefault(r.family, []).append((r.name, t, t * r.flops_per_token,
                                                    np.array([v["loss"] for v in rows], dtype=float)))
    return points, excluded, curves


def _mean_curve(cs: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]], name: str):
    """Seeds' validation curves averaged on the first one's tokens (interpolated in ln tokens where
    the evaluation steps differ; tokens beyond a seed's curve keep the others' mean)."""
    _, t, c, _ = cs[0]
    stack = []
    for _, ti, _, li in cs:
        if len(ti) == len(t) and np.allclose(ti, t):
            stack.append(li)
        else:
            y = np.interp(np.log(t), np.log(ti), li)
            stack.append(np.where((t >= ti.min()) & (t <= ti.max()), y, np.nan))
    with np.errstate(invalid="ignore"):
        loss = np.nanmean(np.asarray(stack), axis=0)
    return name, t, c, loss


def average_seeds(points: list[Point], curves: dict) -> tuple[list[Point], dict, dict[str, list[list[float]]]]:
    """(one point per seed group with the mean loss, the seed-averaged curves, family -> the seed
    groups' losses for :func:`pooled_std`). A group is named after its first run by seed."""
    groups: dict[tuple[str, str], list[Point]] = {}
    for p in points:
        groups.setdefault((p.family, p.group or p.run), []).append(p)
    by_run = {c[0]: c for cs in curves.values() for c in cs}
    out, out_curves, losses = [], {}, {}
    for (fam, _), ps in groups.items():
        ps = sorted(ps, key=lambda p: (p.seed is None, p.seed if p.seed is not None else 0, p.run))
        L = np.array([p.loss for p in ps])
        first = ps[0]
        out.append(replace(first, loss=float(L.mean()), loss_std=float(L.std(ddof=1)) if len(L) > 1 else 0.0,
                           n_seeds=len(ps), seed_runs=[p.run for p in ps], seed_losses=L.tolist(),
                           units=sorted({u for p in ps for u in (p.units or [p.run])}),
                           tokens=float(np.mean([p.tokens for p in ps])), flops=float(np.mean([p.flops for p in ps]))))
        losses.setdefault(fam, []).append(L.tolist())
        cs = [by_run[p.run] for p in ps if p.run in by_run]
        if cs:
            out_curves.setdefault(fam, []).append(_mean_curve(cs, first.run))
    return out, out_curves, losses


def fit_families(points: list[Point], n_boot: int, huber_delta: float, seed: int) -> dict[str, PowerLawFit]:
    fits = {}
    for fam in sorted({p.family for p in points}):
        ps = [p for p in points if p.family == fam]
        fits[fam] = fit_power_law([p.flops for p in ps], [p.loss for p in ps], n_boot=n_boot,
                                  huber_delta=huber_delta, seed=seed)
    return fits


def compare_dense_moe(points: list[Point], fits: dict[str, PowerLawFit]) -> list[dict]:
    """For every MoE point: each dense family's loss at the same training FLOPs (from its fit,
    within the fitted range) and at the same active parameters (N of kind "active": non-embedding,
    LM head excluded, as every N of this module; interpolated in log N between
    that family's runs with the same token count, within their range). "Within" allows
    ``RANGE_SLACK`` (5%) beyond the ends: an MoE built to match a dense size sits just past it."""
    out = []
    dense_fams = sorted({p.family for p in points if not p.is_moe})
    for m in (p for p in points if p.is_moe):
        n_m = n_params(m, "active")
        row = {"run": m.run, "family": m.family, "flops": m.flops, "params_active": m.params_active, "N_active": n_m,
               "loss": m.loss, "dense_families": dense_fams, "equal_flops": {}, "equal_active_params": {}}
        for fam in dense_fams:
            ds = [p for p in points if p.family == fam]
            f = fits.get(fam)
            lo, hi = min(p.flops for p in ds), max(p.flops for p in ds)
            if f is not None and f.status == "ok" and lo / RANGE_SLACK <= m.flops <= hi * RANGE_SLACK:
                L = float(f.predict(m.flops))
                row["equal_flops"][fam] = {"loss": L, "moe_minus_dense": m.loss - L}
            same_t = sorted((p for p in ds if abs(p.tokens - m.tokens) <= 0.05 * m.tokens),
                            key=lambda p: n_params(p, "active"))
            n_t = [n_params(p, "active") for p in same_t]
            if len(same_t) >= 2 and n_t[0] / RANGE_SLACK <= n_m <= n_t[-1] * RANGE_SLACK:  # np.interp holds the ends
                L = float(np.interp(np.log(n_m), np.log(n_t), [p.loss for p in same_t]))
                row["equal_active_params"][fam] = {"loss": L, "moe_minus_dense": m.loss - L}
        out.append(row)
    return out


def _equivalent_n(fit, loss: float, D: float) -> float:
    """N at which L(N, D) = loss under ``fit``: inf when the loss is at or below what the law reaches at D
    with unlimited N (E + B / D^beta)."""
    excess = loss - fit.E - fit.B * D ** (-fit.beta)
    return math.inf if excess <= 0 else (fit.A / excess) ** (1.0 / fit.alpha)


def equal_params_comparison(ref: "FamilyStudy", moe_points: list[Point], loss_sd: Optional[float] = None,
                            seed: int = 0) -> dict:
    """Each (seed-averaged) point of an MoE family against the dense reference's approach-3 law L(N, D) at the
    same D: the reference's loss at the MoE's active N and at its total N (non-embedding, LM head excluded:
    the N of every table) and the MoE minus it; and N_eq, the reference's N that reaches the MoE's loss at D,
    over the MoE's active N (> 1: each active parameter is worth more than a dense one) and over its total N
    (< 1: the experts are worth less than as many dense parameters). 95% intervals over the reference's
    bootstrap fits, each draw with the MoE point's loss moved by normal noise of std ``loss_sd`` (its seed
    noise: the MoE family's noise floor, else all families'; None: not included, and the result says so). A
    value at an N outside the N range the reference was fitted on is an extrapolation, flagged."""
    from analysis.scaling_fits import _interval, sample_fits

    nd = ref.nd
    out = {"reference": ref.family, "status": nd.status, "N_range": [min(ref.N), max(ref.N)] if ref.N else None,
           "loss_sd": loss_sd, "rows": []}
    if nd.status != OK or not moe_points:
        return out
    draws = sample_fits(nd)
    rng = np.random.default_rng(seed)
    lo, hi = out["N_range"]
    for p in sorted(moe_points, key=lambda p: (n_params(p, "active"), p.tokens)):
        n_act, n_tot, D = n_params(p, "active"), n_params(p, "non_embedding"), p.tokens  # total: every expert
        row = {"run": p.run, "family": p.family, "N_active": n_act, "N_total": n_tot, "D": D, "loss": p.loss}
        moe_L = p.loss + rng.normal(0.0, loss_sd or 0.0, len(draws))  # (n_boot,) the point's loss per draw
        for key, n in (("equal_active", n_act), ("equal_total", n_tot)):
            L = float(nd.E + nd.A * n ** (-nd.alpha) + nd.B * D ** (-nd.beta))
            diffs = [m - float(f.E + f.A * n ** (-f.alpha) + f.B * D ** (-f.beta)) for m, f in zip(moe_L, draws)]
            row[key] = {"N": n, "reference_loss": L, "moe_minus_reference": p.loss - L,
                        "ci": _interval(np.array(diffs)), "extrapolated": not (lo <= n <= hi)}
        n_eq = _equivalent_n(nd, p.loss, D)
        eqs = np.array([_equivalent_n(f, m, D) for m, f in zip(moe_L, draws)])
        row["N_eq"] = n_eq
        row["N_eq_extrapolated"] = not (lo <= n_eq <= hi)
        for key, n in (("N_eq_over_active", n_act), ("N_eq_over_total", n_tot)):
            row[key] = n_eq / n
            row[key + "_ci"] = _interval(eqs / n)  # an N_eq beyond the law's reach (inf): an unbounded side
        out["rows"].append(row)
    return out


def equal_params_table(comparisons: list[dict]) -> str:
    if not comparisons:
        return "(no pair of a dense reference and an MoE family)"
    lines = ["| MoE point | reference | N active / total | D (tokens) | loss | MoE - reference at equal active N [95%] "
             "| MoE - reference at equal total N [95%] | N_eq / N active [95%] | N_eq / N total |",
             "|---|---|---|---|---|---|---|---|---|"]

    def diff(d: dict) -> str:
        return _v(d["moe_minus_reference"], d["ci"], "+.3f") + (" (extrapolated)" if d["extrapolated"] else "")

    for comp in comparisons:
        if comp["status"] != OK:
            lines.append(f"| - | {comp['reference']} | - | - | - | - | - | - | {comp['status']} |")
        for r in comp["rows"]:
            ext = " (extrapolated)" if r["N_eq_extrapolated"] else ""
            lines.append(f"| {r['run']} | {comp['reference']} | {r['N_active']:.3g} / {r['N_total']:.3g} "
                         f"| {r['D']:.3g} "
                         f"| {r['loss']:.4f} | {diff(r['equal_active'])} | {diff(r['equal_total'])} | "
                         f"{_v(r['N_eq_over_active'], r['N_eq_over_active_ci'], '.2f')}{ext} | "
                         f"{_v(r['N_eq_over_total'], r['N_eq_over_total_ci'], '.2f')} |")
    lines += ["", "The reference's approach-3 law L(N, D) evaluated at the MoE point's D and at its active or total N "
              f"({N_KINDS['non_embedding']}); N_eq: the reference's N that reaches the MoE's loss at that D. "
              "Intervals over the reference's bootstrap fits, "
              + "; ".join(f"{c['reference']} pair: the MoE loss moved by {c['loss_sd']:.4f} nats of seed noise"
                          if c.get("loss_sd") else f"{c['reference']} pair: no seed noise known, not included"
                          for c in comparisons) + "."]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# L(N, D), IsoFLOP, envelope: the compute-optimal study of one family
# --------------------------------------------------------------------------------------------


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
    optimum: ComputeOptimal  # C = k N D, k measured
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

    def to_json(self) -> dict:
        out = {k: getattr(self, k) for k in ("family", "n_kind", "runs", "N", "D", "C", "L", "L_err", "n_seeds", "k",
                                             "k_range", "C_ref", "clusters", "k_budget")}
        out.update(loss_nd=self.nd.to_json(), compute_optimal=self.optimum.to_json(),
                   compute_optimal_6nd=self.optimum_6nd.to_json(), isoflop=self.iso.to_json(),
                   envelope=self.env.to_json(), noise=self.noise.to_json(), agreement=self.agreement(),
                   holdout=self.holdout.to_json() if self.holdout else None)
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


def study_family(points: list[Point], curves: list, noise: NoiseFloor, *, n_kind: str = "non_embedding",
                 n_boot: int = 200, huber_delta: float = 1e-3, seed: int = 0, budget_tolerance: float = 0.1,
                 ref_flops: Optional[float] = None, holdout: Optional[str] = None,
                 n_polish: Optional[int] = 20) -> FamilyStudy:
    """Approaches 1-3 on one family's seed-averaged points and curves (see the module docstring);
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
    opt = compute_optimal(nd, C_ref, k) if k else ComputeOptimal(status=nd.status, message="no parameter count")
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
                       holdout=None if holdout is None else holdout_prediction(
                           N, D, L, by=holdout, C=C, budget_tags=tags, budget_tolerance=budget_tolerance,
                           clusters=clusters, huber_delta=huber_delta, n_boot=n_boot, seed=seed, n_polish=n_polish))


# --------------------------------------------------------------------------------------------
# families as compute multipliers
# --------------------------------------------------------------------------------------------

MOE_KINDS = ("active", "total")  # an MoE family is also compared at equal active and at equal total parameters


def family_pairs(families: Sequence[str], pairs: Optional[Sequence[str]] = None,
                 reference: Optional[str] = None) -> list[tuple[str, str]]:
    """(reference, family) pairs: ``pairs`` as "REF:FAM" strings, else every family against
    ``reference`` (default: "dense" when present, else the first family by name)."""
    fams = sorted(families)
    if pairs:
        out = []
        for text in pairs:
            ref, sep, fam = str(text).partition(":")
            if not sep or ref not in fams or fam not in fams or ref == fam:
                raise ValueError(f"--pairs {text!r}: must be REF:FAM, two different families of {', '.join(fams)}")
            out.append((ref, fam))
        return out
    ref = reference or ("dense" if "dense" in fams else (fams[0] if fams else None))
    if reference is not None and reference not in fams:
        raise ValueError(f"--reference {reference!r}: valid are {', '.join(fams)}")
    return [(ref, f) for f in fams if f != ref]


@dataclass
class MultiplierCurve:
    """m(C) = C' / C, C' the compute at which ``reference`` reaches, compute-optimally, the loss that
    ``family`` reaches compute-optimally at C (:func:`analysis.scaling_design.compute_multiplier` on
    the two approach-3 fits, C = k N D with each family's measured k, so C is training FLOPs). m > 1:
    ``family`` is m times more compute-efficient than the reference at C. Only over the C range
    both families measured. Band: 95% over the two families' bootstrap fits, draw i with draw i."""

    reference: str
    family: str
    n_kind: str
    status: str
    message: str = ""
    k_reference: Optional[float] = None
    k_family: Optional[float] = None
    C: list = field(default_factory=list)
    multiplier: list = field(default_factory=list)
    lo: list = field(default_factory=list)
    hi: list = field(default_factory=list)
    n_boot: int = 0

    def to_json(self) -> dict:
        return json_safe({**asdict(self), "N": N_KINDS[self.n_kind]})


def multiplier_curve(ref: FamilyStudy, other: FamilyStudy, n_grid: int = 25) -> MultiplierCurve:
    """The compute multiplier of ``other`` against ``ref`` (two studies with one N kind) on a grid of C
    over their common measured range."""
    out = MultiplierCurve(reference=ref.family, family=other.family, n_kind=ref.n_kind, status=OK,
                          k_reference=ref.k, k_family=other.k)
    for st in (ref, other):
        if st.nd.status != OK or not st.k:
            out.status, out.message = st.nd.status if st.nd.status != OK else "no-k", \
                f"{st.family}: no L(N, D) fit ({st.nd.message or 'no parameter count'})"
            return out
    lo, hi = max(min(ref.C), min(other.C)), min(max(ref.C), max(other.C))
    if not lo < hi:
        out.status, out.message = "no-common-compute", (f"{ref.family} spans C {min(ref.C):.3g}-{max(ref.C):.3g}, "
                                                        f"{other.family} {min(other.C):.3g}-{max(other.C):.3g} FLOPs")
        return out
    grid = np.geomspace(lo, hi, n_grid)
    out.C = grid.tolist()
    out.multiplier = [compute_multiplier(ref.nd, other.nd, c, ref.k, other.k) for c in grid]
    draws = [[compute_multiplier(r, o, c, ref.k, other.k) for c in grid]
             for r, o in zip(sample_fits(ref.nd), sample_fits(other.nd))]
    out.n_boot = len(draws)
    if draws:
        ivs = [_interval(np.asarray(col)) for col in np.asarray(draws, dtype=float).T]
        if all(iv is not None for iv in ivs):
            out.lo, out.hi = [iv[0] for iv in ivs], [iv[1] for iv in ivs]
    if not out.lo:
        out.message = f"{out.n_boot} paired bootstrap fits: no band (need >= 10)"
    return out


def compute_multipliers(sens: dict[str, dict[str, FamilyStudy]], pairs: list[tuple[str, str]], n_kind: str,
                        is_moe: dict[str, bool]) -> list[MultiplierCurve]:
    """Each pair at the report's N; a pair with an MoE family also at N = active and N = total."""
    out = []
    for ref, fam in pairs:
        kinds = [n_kind] + ([k for k in MOE_KINDS if k != n_kind] if is_moe.get(ref) or is_moe.get(fam) else [])
        out += [multiplier_curve(sens[ref][kind], sens[fam][kind]) for kind in kinds]
    return out


# --------------------------------------------------------------------------------------------
# tables
# --------------------------------------------------------------------------------------------


def _ci(fit: PowerLawFit, name: str, fmt: str) -> str:
    lo_hi = fit.ci.get(name)
    return f" [{format(lo_hi[0], fmt)}, {format(lo_hi[1], fmt)}]" if lo_hi else ""


def fits_table(fits: dict[str, PowerLawFit]) -> str:
    """Markdown table of the fitted parameters with 95% bootstrap intervals."""
    lines = ["| family | points | E (nats) [95% CI] | alpha [95% CI] | A_ref at c_ref [95% CI] | c_ref (FLOPs) "
             "| A (C in FLOPs) | rms log residual | status |",
             "|---|---|---|---|---|---|---|---|---|"]
    for fam, f in fits.items():
        if f.status != "ok":
            lines.append(f"| {fam} | {f.n_points} | - | - | - | - | - | - | {f.status}: {f.message} |")
            continue
        lines.append(f"| {fam} | {f.n_points} | {f.E:.3f}{_ci(f, 'E', '.3f')} | "
                     f"{f.alpha:.3f}{_ci(f, 'alpha', '.3f')} | "
                     f"{f.A_ref:.3f}{_ci(f, 'A_ref', '.3f')} | {f.c_ref:.3g} | {f.A:.4g} | {f.rms_log_residual:.4f} | "
                     f"{reported_status(f)} ({f.n_boot} bootstrap fits over {f.ci_method or '-'}) |")
    return "\n".join(lines)


def points_table(points: list[Point], n_kind: str = "non_embedding") -> str:
    lines = [f"| run | family | N: {N_KINDS[n_kind]} | params (total / active) | tokens | training FLOPs "
             "| final val loss | seeds |", "|---|---|---|---|---|---|---|---|"]
    for p in sorted(points, key=lambda p: (p.family, p.flops)):
        seeds = f"{p.n_seeds} (std {p.loss_std:.4f}: {', '.join(p.seed_runs)})" if p.n_seeds > 1 else "1"
        lines.append(f"| {p.run} | {p.family} | {n_params(p, n_kind):,.0f} | {p.params_total:,} / {p.params_active:,} "
                     f"| {p.tokens:.3g} | "
                     f"{p.flops:.3g} | {p.loss:.4f} | {seeds} |")
    return "\n".join(lines)


def _v(value, ci=None, fmt: str = ".3f") -> str:
    """'1.700 [1.650, 1.750]'; '-' for no value; an unbounded side of an interval reads inf."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"

    def f(x):
        return "inf" if x is None or not math.isfinite(x) else format(x, fmt)

    return format(value, fmt) + (f" [{f(ci[0])}, {f(ci[1])}]" if ci else "")


def _relative(path: str) -> str:
    """``path`` relative to the working folder when it lies inside it, else as given."""
    p, here = Path(path), Path.cwd().resolve()
    return str(p.relative_to(here)) if p.is_absolute() and p.is_relative_to(here) else path


def _status(obj) -> str:
    """A table's status cell: a computed result's flags in place of "ok" (:func:`reported_status`) and
    its message; a failed one's status and flags."""
    flags = getattr(obj, "flags", None) or []
    if obj.status != OK:
        return f"{obj.status}: {'; '.join(flags)}" if flags else obj.status
    return reported_status(obj) + (f" ({obj.message})" if obj.message else "")


def nd_table(studies: dict[str, FamilyStudy]) -> str:
    """Approach 3 parameters with 95% bootstrap intervals."""
    lines = ["| family | points (sizes x token counts) | E (nats) | A | alpha | B | beta | rms log residual "
             "| status |", "|---|---|---|---|---|---|---|---|---|"]
    for fam, st in studies.items():
        f = st.nd
        pts = f"{f.n_points} ({f.n_sizes} x {f.n_token_counts})"
        if f.status != OK:
            lines.append(f"| {fam} | {pts} | - | - | - | - | - | - | {f.status}: {f.message} |")
            continue
        ci = f.ci
        lines.append(f"| {fam} | {pts} | {_v(f.E, ci.get('E'))} | {_v(f.A, ci.get('A'), '.4g')} | "
                     f"{_v(f.alpha, ci.get('alpha'))} | {_v(f.B, ci.get('B'), '.4g')} | {_v(f.beta, ci.get('beta'))} | "
                     f"{f.rms_log_residual:.4f} | {reported_status(f)} ({f.n_boot} bootstrap fits over "
                     f"{f.ci_method or '-'}"
                     f"{'; ' + f.message if f.message else ''}) |")
    return "\n".join(lines)


def optimum_table(studies: dict[str, FamilyStudy]) -> str:
    """Compute-optimal N, D and D/N at the reference compute, for the measured k and for k = 6."""
    lines = ["| family | C = k N D with k | C_ref (FLOPs) | N_opt | D_opt (tokens) | D_opt / N_opt | L_opt (nats) "
             "| G | status |", "|---|---|---|---|---|---|---|---|---|"]
    for fam, st in studies.items():
        for opt, how in ((st.optimum, "measured"), (st.optimum_6nd, "Chinchilla")):
            if opt.k is None:
                lines.append(f"| {fam} | - | - | - | - | - | - | - | {_status(opt)} |")
                continue
            kdesc = (f"{opt.k:.3g} ({how}: median over runs, range {st.k_range[0]:.3g}-{st.k_range[1]:.3g})"
                     if how == "measured" and st.k_range else f"{opt.k:.3g} ({how})")
            if opt.status != OK:
                lines.append(f"| {fam} | {kdesc} | {opt.C:.3g} | - | - | - | - | - | {opt.status} |")
                continue
            ci = opt.ci
            lines.append(f"| {fam} | {kdesc} | {opt.C:.3g} | {_v(opt.N_opt, ci.get('N_opt'), '.3g')} | "
                         f"{_v(opt.D_opt, ci.get('D_opt'), '.3g')} | "
                         f"{_v(opt.tokens_per_param, ci.get('tokens_per_param'), '.3g')} | "
                         f"{_v(opt.L_opt, ci.get('L_opt'))} | {_v(opt.G, ci.get('G'), '.3g')} | {_status(opt)} |")
    return "\n".join(lines)


def isoflop_table(studies: dict[str, FamilyStudy]) -> str:
    lines = ["| family | budget C (FLOPs) | points | sizes | N* [95% CI] | L* (nats) | interval from | status |",
             "|---|---|---|---|---|---|---|---|"]
    for fam, st in studies.items():
        if not st.iso.profiles:
            lines.append(f"| {fam} | - | 0 | 0 | - | - | - | {_status(st.iso)} |")
        for p in st.iso.profiles:
            lines.append(f"| {fam} | {p.budget:.3g} | {p.n_points} | {p.n_sizes} | "
                         f"{_v(p.N_opt, p.ci.get('N_opt'), '.3g')} | {_v(p.L_opt, None, '.4f')} | "
                         f"{p.ci_method or '-'} | {_status(p)} |")
    return "\n".join(lines)


def exponent_table(studies: dict[str, FamilyStudy]) -> str:
    """The three estimates of a in N_opt ∝ C^a side by side (b = 1 - a for D_opt when C ∝ N D)."""
    lines = ["| family | N | approach 1: envelope | approach 2: IsoFLOP minima | approach 3: L(N, D) fit "
             "| approaches 2 and 3 |", "|---|---|---|---|---|---|"]

    def cell(e: dict) -> str:
        if e["flags"] and e["a"] is not None:  # computed, but not to be read as ok
            return f"{_v(e['a'], e['ci'])} (b = {1 - e['a']:.3f}); {e['status']}"
        if e["status"] != OK or e["a"] is None:
            return f"{e['status']}: {e['message']}" if e["message"] else e["status"]
        return f"{_v(e['a'], e['ci'])} (b = {1 - e['a']:.3f})"

    for fam, st in studies.items():
        ex = st.exponents()
        lines.append(f"| {fam} | {N_KINDS[st.n_kind]} | {cell(ex['approach_1_envelope'])} | "
                     f"{cell(ex['approach_2_isoflop'])} | {cell(ex['approach_3_loss_nd'])} | "
                     f"{st.agreement()['verdict']} |")
    lines += ["", "Approach 1: N of the run on the lowest-loss-per-FLOP envelope of the validation curves against C "
              "(envelope points won by the smallest or largest size left out; interval: bootstrap over runs). "
              "Approach 2: N*(C) through the IsoFLOP minima whose parabola's vertex lies within the trained sizes "
              "(one whose lowest loss is at its smallest or largest size stays in, flagged 'minimum not bracketed'; "
              "interval: the minima's bootstrap draws; with "
              "WSD trunks, whole trunks resampled jointly over the budgets). "
              "Approach 3: beta / (alpha + beta) of the L(N, D) fit. b = 1 - a is the exponent of D_opt when "
              "C = k N D with k constant. Approaches 2 and 3 agree when the 95% interval of a3 - a2 (their bootstrap "
              "draws paired at random, as if independent: wider than a joint interval) holds 0."]
    return "\n".join(lines)


def n_sensitivity(sens: dict[str, dict[str, FamilyStudy]]) -> dict:
    """family -> N kind -> alpha, beta, a (approach 3) and a (approach 2), each with its interval."""
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
                "a_approach_2": pl.slope if pl and pl.status == OK else None,
                "a_approach_2_ci": pl.ci.get("slope") if pl and pl.status == OK else None})
    return out


def n_sensitivity_table(sens: dict[str, dict[str, FamilyStudy]], n_kind: str) -> str:
    """The fitted exponents under each definition of N, side by side (the default first, marked)."""
    lines = ["| family | N | N range | alpha | beta | a (approach 3) | a (approach 2) | status |",
             "|---|---|---|---|---|---|---|---|"]
    for fam, by_kind in n_sensitivity(sens).items():
        for kind, r in sorted(by_kind.items(), key=lambda kv: kv[0] != n_kind):
            name = N_KINDS[kind] + (" (used)" if kind == n_kind else "")
            rng = f"{r['N_range'][0]:.3g}-{r['N_range'][1]:.3g}" if r["N_range"] else "-"
            lines.append(f"| {fam} | {name} | {rng} | {_v(r['alpha'], r['alpha_ci'])} | "
                         f"{_v(r['beta'], r['beta_ci'])} | {_v(r['a_approach_3'], r['a_approach_3_ci'])} | "
                         f"{_v(r['a_approach_2'], r['a_approach_2_ci'])} | {r['status']}"
                         + "".join(f"; approach 2: {g}" for g in r["approach_2_flags"]) + " |")
    return "\n".join(lines)


def multiplier_table(curves: list[MultiplierCurve]) -> str:
    if not curves:
        return "(one family: no compute multiplier)"
    lines = ["| reference | family | compared at equal N = | C range (FLOPs) | m at the smallest C [95%] "
             "| m at the middle C | m at the largest C | status |", "|---|---|---|---|---|---|---|---|"]

    def at(c: MultiplierCurve, j: int) -> str:
        return _v(c.multiplier[j], [c.lo[j], c.hi[j]] if c.lo else None, ".3g")

    for c in curves:
        if c.status != OK:
            lines.append(f"| {c.reference} | {c.family} | {N_KINDS[c.n_kind]} | - | - | - | - | {_status(c)} |")
            continue
        mid = len(c.C) // 2
        lines.append(f"| {c.reference} | {c.family} | {N_KINDS[c.n_kind]} | {c.C[0]:.3g}-{c.C[-1]:.3g} | "
                     f"{at(c, 0)} | {at(c, mid)} (C = {c.C[mid]:.3g}) | {at(c, -1)} | {_status(c)} |")
    lines += ["", "m(C): the reference family needs m times the compute to reach, compute-optimally, the loss the "
              "family reaches compute-optimally at C (from the two approach-3 fits, C = k N D with each family's "
              "measured k; m > 1: the family is more compute-efficient). Band: 95% over paired bootstrap fits. The N "
              "of a row "
              "changes the fits (and k), not what C is: an MoE family is fitted with N = its active and with N = its "
              "total parameters."]
    return "\n".join(lines)


def holdout_table(studies: dict[str, FamilyStudy]) -> str:
    lines = ["| family | held out | fitted on | N | D (tokens) | measured (nats) | predicted [95% prediction interval] "
             "| error (predicted / measured - 1) | inside |", "|---|---|---|---|---|---|---|---|---|"]
    for fam, st in studies.items():
        h = st.holdout
        if h is None:
            continue
        what = (f"largest size N = {h.held_N:.3g}" if h.by == "size" and h.held_N else
                f"largest budget C = {h.held_budget:.3g} FLOPs" if h.held_budget else h.by)
        if h.status != OK:
            lines.append(f"| {fam} | {what} | {h.n_fit} points | - | - | - | - | - | {_status(h)} |")
            continue
        for r in h.rows:
            lines.append(f"| {fam} | {what} | {h.n_fit} points | {r['N']:.3g} | {r['D']:.3g} | {r['measured']:.4f} | "
                         f"{_v(r['predicted'], [r['lo'], r['hi']], '.4f')} | {r['rel_error']:+.2%} | "
                         f"{'yes' if r['inside'] else 'NO'} |")
    lines += ["", "Approach 3 refitted without the held-out points, then asked for their losses: "
              + "; ".join(f"{fam}: {st.holdout.n_inside} of {len(st.holdout.rows)} inside" for fam, st in
                          studies.items() if st.holdout is not None and st.holdout.status == OK) + "."]
    return "\n".join(lines)


def family_design_noise(points: list[Point]) -> DesignNoise:
    """The designer's noise model (sigma of ln L, trunk share) from one family's seed-averaged points
    trained with two or more seeds (their first two seeds), branches grouped by :func:`cluster_labels`."""
    labels = cluster_labels(points)
    return design_noise([(c, p.seed_losses[0], p.seed_losses[1]) for p, c in zip(points, labels)
                         if p.n_seeds >= 2 and len(p.seed_losses or []) >= 2])


def design_noise_table(dn: dict[str, DesignNoise]) -> str:
    lines = ["For `analysis.scaling design` (`noise: {sigma, trunk_share}`): sigma = std of ln L of one run, from "
             "the seed pairs' differences; trunk share = the share of it that the branches of one WSD trunk have in "
             "common, 1 - within-trunk variance / variance of the differences.", "",
             "| family | seed pairs | sigma (of ln L per run) | trunks with >= 2 branch pairs | trunk share | status |",
             "|---|---|---|---|---|---|"]
    for fam, d in dn.items():
        sig = "-" if d.sigma is None else f"{d.sigma:.4f}"
        share = "-" if d.trunk_share is None else f"{d.trunk_share:.2f}"
        lines.append(f"| {fam} | {d.n_pairs} | {sig} | {d.n_trunks} | {share} | {_status(d)} |")
    return "\n".join(lines)


def noise_table(noise: dict[str, NoiseFloor], overall: NoiseFloor) -> str:
    lines = ["| family | seed groups (>= 2 seeds) | runs | noise floor: pooled std (nats) | dof |",
             "|---|---|---|---|---|"]
    for fam, nf in [*noise.items(), ("all families", overall)]:
        std = f"{nf.std:.4f}" if nf.std is not None else f"- ({nf.status})"
        lines.append(f"| {fam} | {nf.n_groups} | {nf.n_runs} | {std} | {nf.dof} |")
    return "\n".join(lines)


def comparison_table(rows: list[dict]) -> str:
    if not rows:
        return "(no MoE runs: no dense-vs-MoE comparison)"
    lines = ["| MoE run | loss | dense family | dense loss at equal FLOPs (MoE - dense) "
             f"| dense loss at equal N = {N_KINDS['active']} (MoE - dense) |",
             "|---|---|---|---|---|"]

    def cell(d):
        return f"{d['loss']:.4f} ({d['moe_minus_dense']:+.4f})" if d else "out of range"

    for r in rows:
        fams = r["dense_families"] or ["-"]
        for fam in fams:
            ef, ea = r["equal_flops"].get(fam), r["equal_active_params"].get(fam)
            lines.append(f"| {r['run']} | {r['loss']:.4f} | {fam} | {cell(ef)} | {cell(ea)} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


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


def read_prediction(spec: str, families: Sequence[str]) -> dict:
    """``FAM=PATH[:DESIGN_FAMILY]`` (``--prediction``): the designer's prediction (the JSON of
    ``python -m analysis.scaling design --out``) for the study family FAM; DESIGN_FAMILY names the
    design's family when it holds several (default: FAM if the design has it, else its only one)."""
    fam, sep, rest = spec.partition("=")
    if not sep or not fam or not rest:
        raise ValueError(f"--prediction {spec!r}: write FAM=PATH[:DESIGN_FAMILY], e.g. "
                         "llama=docs/scaling/design/prediction.json")
    path, _, design_family = rest.partition(":")
    if fam not in families:
        raise ValueError(f"--prediction {spec!r}: no family {fam!r} among the runs ({', '.join(families)})")
    try:
        design = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"--prediction {spec!r}: cannot read {path} ({e}); write it with "
                         "`python -m analysis.scaling design SPEC --out PATH`") from None
    spreads = design.get("spreads") or {}
    if not spreads:
        raise ValueError(f"--prediction {spec!r}: {path} holds no predicted spreads (not a design's JSON)")
    if not design_family:
        design_family = fam if fam in spreads else (next(iter(spreads)) if len(spreads) == 1 else "")
    if design_family not in spreads:
        raise ValueError(f"--prediction {spec!r}: name the design's family after the path, one of "
                         f"{', '.join(spreads)} (e.g. {fam}={path}:{next(iter(spreads))})")
    return {"family": fam, "path": path, "design_family": design_family, "design": design}


def _at_compute(curve: "MultiplierCurve", C: float) -> Optional[tuple[float, float, float]]:
    """(m, lo, hi) of a multiplier curve at compute C, interpolated in log C; None outside its range."""
    if curve.status != OK or not curve.lo or not curve.C[0] <= C <= curve.C[-1]:
        return None
    x = np.log(curve.C)
    return tuple(float(np.exp(np.interp(np.log(C), x, np.log(v)))) for v in (curve.multiplier, curve.lo, curve.hi))


def prediction_rows(pred: dict, studies: dict[str, FamilyStudy], multipliers: list) -> list[dict]:
    """The designer's predicted 95% widths beside the intervals the study obtained: approach 3's alpha,
    beta and a, approach 2's a (widths as differences) and the compute multiplier (as a ratio hi / lo)."""
    st = studies[pred["family"]]
    spreads = pred["design"]["spreads"][pred["design_family"]]
    pl = st.iso.power_law
    obtained = {"approach 3 alpha": (st.nd.alpha, st.nd.ci.get("alpha")),
                "approach 3 beta": (st.nd.beta, st.nd.ci.get("beta")),
                "approach 3 a": (st.nd.a_opt, st.nd.ci.get("a_opt")),
                "approach 2 a": (pl.slope if pl is not None and pl.status == OK else None,
                                 pl.ci.get("slope") if pl is not None and pl.status == OK else None)}
    rows = []
    for q, (value, ci) in obtained.items():
        sp = spreads.get(q)
        if sp is None:
            continue
        width = None if not ci else ci[1] - ci[0]
        rows.append({"quantity": q, "predicted_width": sp.get("width"), "predicted_width_range": sp.get("width_ci"),
                     "predicted_own_width": sp.get("own_width"), "predicted_own_range": sp.get("own_width_range"),
                     "planning_value": sp.get("true"), "value": value, "ci": ci, "width": width, "ratio": False})
    mult = (pred["design"].get("multipliers") or {}).get(pred["design_family"])
    C_ref = pred["design"].get("ref_flops")
    if mult and C_ref:  # every pair the family is in, as family or as reference (hi / lo is the same either way)
        mine = [c for c in multipliers if pred["family"] in (c.family, c.reference) and c.n_kind == st.n_kind]
        for c in mine:
            at = _at_compute(c, C_ref)
            rows.append({"quantity": f"compute multiplier of {c.family} vs {c.reference} at C = {C_ref:.3g}",
                         "predicted_width": mult.get("width"), "predicted_width_range": mult.get("width_ci"),
                         "predicted_own_width": None, "predicted_own_range": None,
                         "planning_value": mult.get("true"), "value": at[0] if at else None,
                         "ci": [at[1], at[2]] if at else None, "width": at[2] / at[1] if at else None,
                         "ratio": True})
    for r in rows:  # the obtained width is one study's bootstrap interval: set it against the simulated studies' own
        lo_hi = r["predicted_own_range"] or r["predicted_width_range"]  # intervals when the design computed them
        r["verdict"] = ("not determined" if r["width"] is None or not math.isfinite(r["width"]) else
                        "no predicted range" if not lo_hi else
                        "narrower than predicted" if r["width"] < lo_hi[0] else
                        "wider than predicted" if r["width"] > lo_hi[1] else "as predicted")
    return rows


def prediction_table(preds: list[dict], studies: dict[str, FamilyStudy], multipliers: list) -> str:
    """One table per --prediction: the design's expected 95% interval widths against the obtained ones."""
    if not preds:
        return "(no design given: --prediction FAM=PATH)"
    lines = ["| family | estimate | designer's spread of the estimate [range] | designer's one-study interval "
             "[range] | obtained [95% interval] | obtained width | verdict |", "|---|---|---|---|---|---|---|"]
    notes = []
    for pred in preds:
        for r in prediction_rows(pred, studies, multipliers):
            unit = "x" if r["ratio"] else ""
            rng = r["predicted_width_range"]
            predicted = f"{r['predicted_width']:.3g}{unit}" + (f" [{rng[0]:.3g}, {rng[1]:.3g}]" if rng else "")
            own, orng = r["predicted_own_width"], r["predicted_own_range"]
            own = "-" if own is None else f"{own:.3g}{unit}" + (f" [{orng[0]:.3g}, {orng[1]:.3g}]" if orng else "")
            got = "-" if r["value"] is None else _v(r["value"], r["ci"])
            width = "-" if r["width"] is None else f"{r['width']:.3g}{unit}"
            lines.append(f"| {pred['family']} ({Path(pred['path']).name}) | {r['quantity']} | {predicted} | {own} | "
                         f"{got} | {width} | {r['verdict']} |")
        noise = pred["design"].get("noise") or {}
        st = studies[pred["family"]]
        measured = (f"measured: seed std {st.noise.std:.4f} nats, {st.noise.std / float(np.mean(st.L)):.2%} of the "
                    "mean loss" if st.noise.status == OK else f"not measured ({st.noise.message})")
        notes.append(f"{pred['family']}: design {pred['path']} (family {pred['design_family']!r}, "
                     f"{pred['design'].get('sims')} simulated studies); noise assumed sigma = "
                     f"{noise.get('sigma', float('nan')):.3g} of ln L per run, {measured}.")
    lines += ["", "Designer's spread: the 97.5th - 2.5th percentile of the estimate over simulated studies of the "
              "planned grid under its planning law and noise, with the 95% range of that width over the "
              "simulations; one-study interval (designs with `fit.bootstrap`): the median width of each simulated "
              "study's own bootstrap interval, resampled as the study's, with its 2.5-97.5 percentile range, which "
              "the verdict then uses; obtained: the study's 95% bootstrap interval (multiplier widths as hi / lo). "
              + " ".join(notes)]
    return "\n".join(lines)


def analyse(inputs: Sequence[str], out: Optional[Path], n_boot: int = 200, huber_delta: float = 1e-3,
            seed: int = 0, *, n_kind: str = "non_embedding", budget_tolerance: float = 0.1,
            ref_flops: Optional[float] = None, holdout: Optional[str] = "size", pairs: Optional[Sequence[str]] = None,
            reference: Optional[str] = None, n_polish: Optional[int] = 20,
            predictions: Optional[Sequence[str]] = None, keep_unlearned: bool = False, log=print) -> dict:
    """Read the runs, fit each family (L(C) and approaches 1-3), write the plots and tables to
    ``out`` (a figure with nothing to show is not written: ``log`` says why; ``figures`` lists those written);
    return the results (what fits.json holds, plus ``studies``: FamilyStudy per family, and
    ``sensitivity_studies``: family -> N kind -> FamilyStudy). ``holdout``: "size" | "budget" | None,
    what approach 3 predicts without having seen it; ``pairs`` ("REF:FAM") or ``reference``: the
    families compared as compute multipliers; ``n_polish``: grid starts polished per L(N, D) fit;
    ``predictions`` ("FAM=PATH[:DESIGN_FAMILY]"): designs whose predicted widths are set beside the obtained ones;
    ``keep_unlearned``: keep runs near the unigram entropy as points (see :func:`collect`)."""
    if n_kind not in N_KINDS:
        raise ValueError(f"--n-kind {n_kind!r}: valid are {', '.join(N_KINDS)}")
    if holdout is not None and holdout not in HOLDOUT_BY:
        raise ValueError(f"--holdout {holdout!r}: valid are {', '.join(HOLDOUT_BY)}, none")
    runs, problems = expand_inputs(inputs)
    run_points, excluded, run_curves = collect(runs, keep_unlearned)
    excluded = [{"run": p, "status": "unreadable", "reason": why} for p, why in problems] + excluded
    for e in excluded:  # paths as the user gave them (relative to the working folder), not this machine's
        e["run"] = _relative(e["run"])
    if not run_points:
        raise RunError("no finished run among the inputs: " +
                       "; ".join(f"{e['run']}: {e['reason']}" for e in excluded))
    points, curves, seed_losses = average_seeds(run_points, run_curves)
    preds = [read_prediction(spec, sorted({p.family for p in points})) for spec in predictions or []]
    noise = {fam: pooled_std(g) for fam, g in sorted(seed_losses.items())}
    overall = pooled_std([g for gs in seed_losses.values() for g in gs])
    dnoise = {fam: family_design_noise([p for p in points if p.family == fam]) for fam in noise}
    fits = fit_families(points, n_boot, huber_delta, seed)
    pair_list = family_pairs(list(fits), pairs, reference)
    comparisons = compare_dense_moe(points, fits)
    fit_kw = dict(n_boot=n_boot, huber_delta=huber_delta, seed=seed, budget_tolerance=budget_tolerance,
                  ref_flops=ref_flops, n_polish=n_polish)
    studies = {fam: study_family([p for p in points if p.family == fam], curves.get(fam, []), noise[fam],
                                 n_kind=n_kind, holdout=holdout, **fit_kw)
               for fam in sorted(fits)}
    sens = n_sensitivity_studies(points, studies, noise, n_kind, **fit_kw)
    is_moe = {fam: any(p.is_moe for p in points if p.family == fam) for fam in studies}
    multipliers = compute_multipliers(sens, pair_list, n_kind, is_moe)
    equal_params = [equal_params_comparison(sens[ref]["non_embedding"], [p for p in points if p.family == fam],
                                            loss_sd=next((nf.std for nf in (noise[fam], overall) if nf.status == OK),
                                                         None), seed=seed)
                    for ref, fam in pair_list if is_moe.get(fam) and not is_moe.get(ref)]
    result = {
        "model": "L(C) = E + A * C^(-alpha); C = training FLOPs, L = final validation loss (nats/token)",
        "fit": {"loss": "huber on log L", "huber_delta": huber_delta, "bootstrap_resamples": n_boot,
                "interval": "95% percentile bootstrap: over points (>= 6 points) else over log-L residuals",
                "seed": seed},
        "families": {fam: {**f.to_json(), "points": [asdict(p) for p in points if p.family == fam]}
                     for fam, f in fits.items()},
        "n_kind": {"name": n_kind, "meaning": N_KINDS[n_kind]},
        "loss_nd_model": "L(N, D) = E + A / N^alpha + B / D^beta; N parameters (n_kind), D tokens seen; "
                         "Huber (delta huber_delta) on log L, L-BFGS-B from the Hoffmann et al. grid; compute-optimal "
                         "for C = k N D with k the measured training FLOPs per token per parameter (and k = 6)",
        "scaling_nd": {fam: st.to_json() for fam, st in studies.items()},
        "exponents": {fam: json_safe(st.exponents()) for fam, st in studies.items()},
        "n_sensitivity": n_sensitivity(sens),
        "approaches_2_and_3": {fam: json_safe(st.agreement()) for fam, st in studies.items()},
        "holdout": {fam: st.holdout.to_json() for fam, st in studies.items() if st.holdout is not None},
        "compute_multipliers": [c.to_json() for c in multipliers],
        "design_vs_obtained": [{"family": pr["family"], "design": pr["path"], "design_family": pr["design_family"],
                                "rows": json_safe(prediction_rows(pr, studies, multipliers))} for pr in preds],
        "moe_at_equal_params": equal_params,
        "noise": {"overall": overall.to_json(), "families": {fam: nf.to_json() for fam, nf in noise.items()},
                  "design": {fam: d.to_json() for fam, d in dnoise.items()}},
        "excluded": excluded,
        "budget_convention": budget_convention(points),
        "dense_vs_moe": comparisons,
    }
    floor = (f"Noise floor (pooled std over {overall.n_groups} seed groups, {overall.dof} dof): "
             f"**{overall.std:.4f} nats**." if overall.status == OK else f"Noise floor: unknown ({overall.message}).")
    text = "\n\n".join([
        "## Fitted L(C) = E + A * C^(-alpha) per family", fits_table(fits),
        f"## Fitted L(N, D) = E + A / N^alpha + B / D^beta (approach 3; N = {N_KINDS[n_kind]})", nd_table(studies),
        "## Compute-optimal allocation from L(N, D)", optimum_table(studies),
        "## IsoFLOP profiles (approach 2)", isoflop_table(studies),
        f"Budgets C count: {budget_convention(points) or '(no points)'}.",
        "## Exponent a of N_opt ∝ C^a: three estimates (95% intervals)", exponent_table(studies),
        "## Sensitivity to the definition of N (approaches 3 and 2 refitted under each)",
        n_sensitivity_table(sens, n_kind),
        f"## Held-out prediction (approach 3 without the largest {holdout})" if holdout else
        "## Held-out prediction", holdout_table(studies) if holdout else "(not asked for: --holdout none)",
        "## Families as compute multipliers", multiplier_table(multipliers),
        "## The designer's prediction against the study", prediction_table(preds, studies, multipliers),
        "## MoE at equal active and equal total parameters", equal_params_table(equal_params),
        "## Seed noise", floor, noise_table(noise, overall), design_noise_table(dnoise),
        "## Points (finished runs; seed groups at their mean)", points_table(points, n_kind),
        "## Dense vs MoE", comparison_table(comparisons),
        "## Excluded runs", "\n".join(f"- {e['run']}: {e['status']} ({e['reason']})" for e in excluded) or "(none)",
    ])
    result["table_markdown"] = text
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out / "fits.json", json_safe(result))
        write_text_atomic(out / "fits.md", text + "\n")
        by_family: dict[str, list] = {}
        for r in runs:
            if r.status == "finished":
                by_family.setdefault(r.family, []).append(r)
        plot_loss_vs_flops(points, fits, curves, out / "loss_vs_flops.png")
        plot_loss_vs_tokens(by_family, out / "loss_vs_tokens.png", lambda r: n_of_counts(r.params, n_kind),
                            N_KINDS[n_kind])
        plot_isoflop(studies, N_KINDS[n_kind], out / "isoflop.png")
        plot_loss_nd(studies, N_KINDS[n_kind], out / "loss_nd.png")
        written = ["loss_vs_flops.png", "loss_vs_tokens.png", "isoflop.png", "loss_nd.png"]
        for name, why, draw in (
                ("dense_vs_moe.png", dense_vs_moe_skip(points), lambda path: plot_dense_vs_moe(
                    points, fits, path, lambda p: n_params(p, "active"), N_KINDS["active"])),
                ("compute_multiplier.png", compute_multiplier_skip(multipliers),
                 lambda path: plot_compute_multiplier(multipliers, N_KINDS, path))):
            if why:
                log(f"scaling: {name} not written: {why}")
            else:
                draw(out / name)
                written.append(name)
        result["figures"] = written
    result["studies"] = studies
    result["sensitivity_studies"] = sens
    return result


# every output; dense_vs_moe.png and compute_multiplier.png only where they have something to show
OUTPUTS = ("loss_vs_flops.png", "loss_vs_tokens.png", "dense_vs_moe.png", "isoflop.png", "loss_nd.png",
           "compute_multiplier.png", "fits.json", "fits.md")


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["design"]:  # the study designer: how precisely will a planned grid fit?
        from analysis.scaling_design import main as design_main

        return design_main(argv[1:])
    doc = __doc__.split("\nPython API")[0]
    ap = argparse.ArgumentParser(prog="python -m analysis.scaling", description=doc.split("\n\n")[0],
                                 epilog=doc.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="+", help="run folders, globs (quote them), sweep folders or folders of runs")
    ap.add_argument("--out", type=Path, help="folder for the plots, fits.json and fits.md (default: print only)")
    ap.add_argument("--n-kind", choices=list(N_KINDS), default="non_embedding",
                    help="what N counts: " + "; ".join(f"{k} = {v}" for k, v in N_KINDS.items())
                    + " (default non_embedding)")
    ap.add_argument("--bootstrap", type=int, default=200, help="bootstrap resamples for the intervals (default 200)")
    ap.add_argument("--huber-delta", type=float, default=1e-3,
                    help="Huber loss threshold on log L residuals (default 1e-3, as Chinchilla)")
    ap.add_argument("--budget-tolerance", type=float, default=0.1,
                    help="IsoFLOP: runs without a sweep FLOPs budget share a budget when their training FLOPs "
                         "agree within this fraction (default 0.1)")
    ap.add_argument("--ref-flops", type=float, default=None,
                    help="compute (FLOPs) at which to state N_opt, D_opt and D/N (default: each family's largest run)")
    ap.add_argument("--holdout", choices=[*HOLDOUT_BY, "none"], default="size",
                    help="approach 3 refitted without the largest model size or the largest compute budget, "
                         "predicting the losses left out with 95%% prediction intervals (default size)")
    ap.add_argument("--pairs", nargs="+", metavar="REF:FAM",
                    help="families compared as compute multipliers (how much compute REF needs for FAM's "
                         "compute-optimal loss), e.g. dense:llama llama:mixtral (default: all against --reference)")
    ap.add_argument("--reference", default=None,
                    help="the family every other is compared with when --pairs is not given "
                         "(default: dense if present, else the first family by name)")
    ap.add_argument("--prediction", nargs="+", metavar="FAM=PATH[:DESIGN_FAMILY]",
                    help="the designer's prediction for a family (the JSON of `python -m analysis.scaling design "
                         "--out`), its expected interval widths set beside the obtained ones, e.g. "
                         "llama=docs/scaling/design/prediction.json mixtral=docs/scaling/design/families.json:other")
    ap.add_argument("--keep-unlearned", action="store_true",
                    help=f"keep runs whose final loss is not {LEARN_MARGIN} nats below their unigram entropy as points "
                         "(smoke tests of tiny runs; a scaling study leaves them out, the default)")
    ap.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    args = ap.parse_args(argv)
    try:
        if args.bootstrap < 0:
            raise ValueError(f"--bootstrap {args.bootstrap}: must be >= 0")
        if not args.huber_delta > 0:
            raise ValueError(f"--huber-delta {args.huber_delta}: must be positive")
        if not args.budget_tolerance >= 0:
            raise ValueError(f"--budget-tolerance {args.budget_tolerance}: must be >= 0")
        if args.ref_flops is not None and not args.ref_flops > 0:
            raise ValueError(f"--ref-flops {args.ref_flops}: must be positive")
        notes: list[str] = []  # figures not written, and why: printed after the tables
        result = analyse(args.inputs, args.out, args.bootstrap, args.huber_delta, args.seed, n_kind=args.n_kind,
                         budget_tolerance=args.budget_tolerance, ref_flops=args.ref_flops,
                         holdout=None if args.holdout == "none" else args.holdout, pairs=args.pairs,
                         reference=args.reference, predictions=args.prediction,
                         keep_unlearned=args.keep_unlearned, log=notes.append)
    except (RunError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(result["table_markdown"])
    if args.out is not None:
        print(f"\nwrote {args.out}/" + ", ".join(result["figures"] + ["fits.json", "fits.md"]))
        for note in notes:
            print(note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
