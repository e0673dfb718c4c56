"""Scaling-law fits on arrays: the parametric L(N, D), IsoFLOP profiles, envelope exponents, seed noise.

Pure numerics (numpy, scipy): no run folders and no plotting; :mod:`analysis.scaling` reads the
runs, calls these and draws the results (its docstring lists the whole API). The three estimates of
the compute-optimal exponent a in N_opt(C) ∝ C^a are Chinchilla's (Hoffmann et al. 2022):

1. :func:`envelope_exponent`: for each C on the lowest-loss-per-FLOP envelope of the training
   curves, the N of the run that reaches it; log N against log C.
2. :func:`isoflop_profiles`: per compute budget a parabola of loss in ln N, its minimum N*, then
   :func:`fit_log_log` of N* against C.
3. :func:`fit_loss_nd`: L(N, D) = E + A / N^alpha + B / D^beta, then a = beta / (alpha + beta)
   (:func:`compute_optimal`).

Every result carries a ``status`` ("ok" or a named degeneracy, e.g. "one-model-size") and a
``message``; degenerate inputs never raise. A result that was computed (``status`` "ok", so its
numbers exist and are used downstream) but should not be read as sound also carries named
``flags``: an interval (or estimate) at an optimiser bound ("interval at bound (alpha <= 5)",
:func:`bound_flags`), an IsoFLOP minimum not bracketed by the trained sizes ("minimum not
bracketed"), an N_opt outside the trained sizes ("N_opt outside the trained sizes"). Tables and
fits.json show :func:`reported_status`: the flags in place of "ok", so a flagged result is never
reported as "ok"; the numbers are the same with or without flags. Intervals are 95% percentile bootstrap intervals,
resampling points when there are enough of them and residuals otherwise (``ci_method`` says
which), as :func:`analysis.scaling.fit_power_law` does.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Optional, Sequence

import numpy as np
from scipy.optimize import minimize, nnls

Q = (2.5, 97.5)  # 95% percentile interval

# statuses (strings, so that fits.json and fits.md read without a legend)
OK = "ok"
NO_FINITE = "no-finite-points"
TOO_FEW_POINTS = "too-few-points"
ONE_SIZE = "one-model-size"
TOO_FEW_SIZES = "too-few-model-sizes"
ONE_TOKENS = "one-token-count"
TOO_FEW_TOKENS = "too-few-token-counts"
COLLINEAR = "n-d-collinear"
FAILED = "failed"
NOT_CONVEX = "not-convex"
UNBRACKETED = "minimum-outside-sampled-range"
NO_BUDGET = "no-usable-budget"
ONE_BUDGET = "one-budget"
DEGENERATE = "degenerate-exponents"
NO_SEEDS = "no-seed-groups"


# a value within BOUND_TOL of its bound's span from an optimiser bound is at that bound; an irreducible loss E
# under NEGLIGIBLE times the smallest loss is at its lower bound (~0) in effect
BOUND_TOL = 1e-3
NEGLIGIBLE = 1e-3
AT_BOUND = "interval at bound"  # an end of the 95% interval at an optimiser bound
ESTIMATE_AT_BOUND = "estimate at bound"  # no interval, the point estimate at the bound
NOT_BRACKETED = "minimum not bracketed"
N_OPT_OUTSIDE = "N_opt outside the trained sizes"


def reported_status(obj) -> str:
    """The status that tables and fits.json show: a computed result's flags (see the module
    docstring) in place of "ok", else its ``status``."""
    flags = getattr(obj, "flags", None)
    return "; ".join(flags) if obj.status == OK and flags else obj.status


def bound_flags(checks) -> list[str]:
    """Named flags of the fitted parameters at an optimiser bound. ``checks``: one tuple per bounded
    coordinate of the optimiser, (value, interval or None, lower, upper, lower label, upper label):
    the value and the interval in the optimiser's coordinate (e.g. ln E when it fits ln E), lower and
    upper the thresholds at or beyond which a value counts as at its bound (:func:`bound_thresholds`),
    the labels the bound as a reader sees it ("alpha >= 0", "E >= 1e-06"). "interval at bound
    (alpha <= 5)" when an end of the 95% interval is at a bound, "estimate at bound (...)" when there
    is no interval and the estimate is."""
    out = []
    for value, ci, lo_at, hi_at, lo_label, hi_label in checks:
        if value is None or not math.isfinite(value):
            continue
        ends = [x for x in ci if x is not None and not math.isnan(x)] if ci else []
        what, vals = (AT_BOUND, ends) if ci else (ESTIMATE_AT_BOUND, [value])
        if any(x <= lo_at for x in vals):
            out.append(f"{what} ({lo_label})")
        if any(x >= hi_at for x in vals):
            out.append(f"{what} ({hi_label})")
    return out


def bound_thresholds(lo: float, hi: float, floor: Optional[float] = None) -> tuple[float, float]:
    """(lower, upper) thresholds of :func:`bound_flags` for an optimiser bound [lo, hi]: within
    ``BOUND_TOL`` of the span from either end. ``floor`` (for ln E, whose lower bound stands for E = 0):
    the ln E below which E no longer changes the fit (it is then at its bound in effect: the objective is
    flat down to it, and where the optimiser stops is not the data's)."""
    tol = BOUND_TOL * (hi - lo)
    return (max(lo + tol, floor) if floor is not None else lo + tol), hi - tol


def _log_ci(ci: Optional[list]) -> Optional[list]:
    """An interval of a positive quantity in logs (a non-positive end -> -inf)."""
    if not ci:
        return None
    return [math.log(x) if x is not None and x > 0 else -math.inf for x in ci]


def _g(x: float) -> str:
    return format(x, ".3g")


def _interval(samples: np.ndarray) -> Optional[list]:
    """95% percentile interval by rank (order statistics), so that +-inf samples (a minimum that
    runs off to infinity) give an unbounded side instead of NaN. None with < 10 samples."""
    s = np.sort(np.asarray(samples, dtype=float)[~np.isnan(samples)])
    if len(s) < 10:
        return None
    lo, hi = s[int(math.floor(Q[0] / 100 * (len(s) - 1)))], s[int(math.ceil(Q[1] / 100 * (len(s) - 1)))]
    return [float(lo), float(hi)]


def json_safe(obj):
    """Non-finite floats -> None (strict JSON), recursively through dicts, lists and tuples."""
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.ndarray):
        return json_safe(obj.tolist())
    return obj


def huber(r: np.ndarray, delta: float) -> np.ndarray:
    """Huber loss of each residual: r^2 / 2 within delta, linear beyond."""
    a = np.abs(r)
    return np.where(a <= delta, 0.5 * r * r, delta * (a - 0.5 * delta))


def _finite_positive(*arrays: np.ndarray) -> np.ndarray:
    ok = np.ones(len(arrays[0]), dtype=bool)
    for x in arrays:
        ok &= np.isfinite(x) & (x > 0)
    return ok


# --------------------------------------------------------------------------------------------
# approach 3: L(N, D) = E + A / N^alpha + B / D^beta
# --------------------------------------------------------------------------------------------

ND_PARAMS = ("E", "A", "alpha", "B", "beta")
ND_MIN_POINTS = 6  # 5 parameters + at least one degree of freedom
ND_MIN_DISTINCT = 3  # A/N^alpha + a shared constant needs 3 distinct N (likewise D)
ND_PAIRS_MIN_POINTS = 10  # below this, bootstrap residuals (twice the parameters, as fit_power_law's 6 for 3)
ND_CLUSTER_MIN = 5  # fewer clusters (trunks) than this: flip each cluster's residuals instead of resampling clusters
EXP_MAX = 5.0  # upper bound of alpha and beta
# Hoffmann et al. 2022 (appendix D.2) / Besiroglu et al. 2024: 5 x 5 x 5 x 6 x 6 = 4,500 starts
GRID_ALPHA = GRID_BETA = np.arange(0.0, 2.01, 0.5)
GRID_E = np.arange(-1.0, 1.01, 0.5)
GRID_A = GRID_B = np.arange(0.0, 25.1, 5.0)
PROFILE_GRID = np.linspace(0.05, 2.0, 16)  # (alpha, beta) grid of the profile start


@dataclass
class NDFit:
    """L(N, D) = E + A / N^alpha + B / D^beta with N parameters and D training tokens, L in nats/token.

    Fitted as Hoffmann et al. 2022: log L_pred = LSE(a - alpha ln N, b - beta ln D, e) with
    a = ln A, b = ln B, e = ln E, Huber loss (``huber_delta``) on ln L_pred - ln L, minimised by
    L-BFGS-B from a grid of starts. ``ci`` holds 95% bootstrap intervals for E, A, alpha, B,
    beta, their logs, and the derived exponents a_opt = beta/(alpha+beta), b_opt = alpha/(alpha+beta)
    and G (see :func:`compute_optimal`).
    """

    n_points: int
    status: str
    message: str = ""
    n_dropped: int = 0  # non-finite or non-positive points left out
    n_sizes: int = 0
    n_token_counts: int = 0
    E: Optional[float] = None
    A: Optional[float] = None
    alpha: Optional[float] = None
    B: Optional[float] = None
    beta: Optional[float] = None
    log_E: Optional[float] = None
    log_A: Optional[float] = None
    log_B: Optional[float] = None
    a_opt: Optional[float] = None  # beta / (alpha + beta): N_opt ∝ C^a_opt
    b_opt: Optional[float] = None  # alpha / (alpha + beta): D_opt ∝ C^b_opt
    objective: Optional[float] = None  # sum of Huber losses / delta at the optimum
    rms_log_residual: Optional[float] = None
    huber_delta: float = 1e-3
    n_starts: int = 0  # L-BFGS-B starts polished for the point estimate
    optimizer_message: str = ""
    N_range: Optional[list] = None
    D_range: Optional[list] = None
    ci: dict = field(default_factory=dict)
    n_boot: int = 0
    ci_method: str = ""  # "points" | "residuals" | "clusters (G)" | "residuals, one sign per cluster (G)"
    flags: list = field(default_factory=list)  # parameters at an optimiser bound (see nd_bound_flags)
    samples: Optional[np.ndarray] = field(default=None, repr=False)  # (n_boot, 5): E, A, alpha, B, beta

    def to_json(self) -> dict:
        d = asdict(self)
        d.pop("samples")
        d["status"] = reported_status(self)
        return json_safe(d)

    def predict(self, N, D) -> np.ndarray:
        """Fitted loss at N parameters and D tokens (arrays broadcast)."""
        if self.status != OK:
            raise ValueError(f"no fitted L(N, D): {self.status} ({self.message})")
        N, D = np.asarray(N, dtype=float), np.asarray(D, dtype=float)
        return self.E + self.A * N ** (-self.alpha) + self.B * D ** (-self.beta)


def _nd_parts(theta: np.ndarray, u: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lse, softmax weights (3, n)) of the three log-terms. theta = (a_c, b_c, e, alpha, beta)
    with a_c = a - alpha ln N0, u = ln N - ln N0 (likewise b, D): centred, better conditioned."""
    a_c, b_c, e, alpha, beta = theta
    t = np.stack([a_c - alpha * u, b_c - beta * v, np.full_like(u, e)])  # (3, n)
    m = t.max(axis=0)
    ex = np.exp(t - m)
    s = ex.sum(axis=0)
    return m + np.log(s), ex / s, t


def _nd_objective(theta, u, v, log_L, delta):
    """Sum of Huber losses of the log residuals (divided by delta: O(1) numbers for L-BFGS) and its gradient."""
    lse, w, _ = _nd_parts(theta, u, v)
    r = lse - log_L
    g = np.clip(r, -delta, delta) / delta
    grad = np.array([(g * w[0]).sum(), (g * w[1]).sum(), (g * w[2]).sum(),
                     -(g * w[0] * u).sum(), -(g * w[1] * v).sum()])
    return float(huber(r, delta).sum() / delta), grad


def _nd_grid_objectives(thetas: np.ndarray, u, v, log_L, delta) -> np.ndarray:
    """The objective at many starts at once: thetas (S, 5) -> (S,)."""
    a_c, b_c, e, alpha, beta = (thetas[:, i:i + 1] for i in range(5))
    t = np.stack([a_c - alpha * u, b_c - beta * v, np.broadcast_to(e, (len(thetas), len(u)))])  # (3, S, n)
    m = t.max(axis=0)
    lse = m + np.log(np.exp(t - m).sum(axis=0))
    return huber(lse - log_L, delta).sum(axis=1) / delta


def _hoffmann_grid(u0: float, v0: float) -> np.ndarray:
    """The 4,500 starts of Hoffmann et al. (natural a, b), in the centred parametrisation."""
    al, be, e, a, b = np.meshgrid(GRID_ALPHA, GRID_BETA, GRID_E, GRID_A, GRID_B, indexing="ij")
    al, be, e, a, b = (x.ravel() for x in (al, be, e, a, b))
    return np.stack([a - al * u0, b - be * v0, e, al, be], axis=1)


def _nd_profile_start(u, v, L, delta) -> Optional[np.ndarray]:
    """For each (alpha, beta) of a grid the model is linear in (E, A_c, B_c) >= 0: solve that by
    Huber-reweighted non-negative least squares on relative residuals and keep the best pair. A
    global start that the coarse Hoffmann grid may lack (the flat E-A-B valley trips local optimisers)."""
    log_L = np.log(L)
    best, best_obj = None, math.inf
    for alpha in PROFILE_GRID:
        pu = np.exp(-alpha * u)
        for beta in PROFILE_GRID:
            pv = np.exp(-beta * v)
            M = np.stack([np.ones_like(u), pu, pv], axis=1) / L[:, None]
            w = np.ones_like(L)
            for _ in range(2):
                coef, _ = nnls(M * np.sqrt(w)[:, None], np.sqrt(w))
                r = np.log(np.maximum(coef[0] + coef[1] * pu + coef[2] * pv, 1e-300)) - log_L
                w = np.where(np.abs(r) <= delta, 1.0, delta / np.maximum(np.abs(r), 1e-300))
            obj = float(huber(r, delta).sum())
            if obj < best_obj:
                E, A_c, B_c = (max(c, 1e-12) for c in coef)
                best, best_obj = np.array([math.log(A_c), math.log(B_c), math.log(E), alpha, beta]), obj
    return best


def _nd_bounds(L: np.ndarray) -> list[tuple[float, float]]:
    top = math.log(float(L.max()))
    return [(-30.0, top + 5.0), (-30.0, top + 5.0), (-30.0, top), (0.0, EXP_MAX), (0.0, EXP_MAX)]


def _lbfgs(theta0, u, v, log_L, delta, bounds, maxiter=2000):
    lo, hi = np.array([b[0] for b in bounds]), np.array([b[1] for b in bounds])
    x0 = np.clip(np.asarray(theta0, dtype=float), lo, hi)
    try:
        res = minimize(_nd_objective, x0, args=(u, v, log_L, delta), jac=True, method="L-BFGS-B", bounds=bounds,
                       options={"maxiter": maxiter, "ftol": 1e-15, "gtol": 1e-12, "maxcor": 20})
    except (ValueError, FloatingPointError):
        return None
    return res if np.all(np.isfinite(res.x)) and np.isfinite(res.fun) else None


def _nd_minimise(u, v, L, delta, starts: np.ndarray, maxiter=2000):
    """Polish every start with L-BFGS-B, restart once from the best; (theta, objective, message) or None."""
    log_L = np.log(L)
    bounds = _nd_bounds(L)
    best = None
    for theta0 in starts:
        res = _lbfgs(theta0, u, v, log_L, delta, bounds, maxiter)
        if res is not None and (best is None or res.fun < best.fun):
            best = res
    if best is None:
        return None
    again = _lbfgs(best.x, u, v, log_L, delta, bounds, maxiter)  # L-BFGS on a kinked objective stops early
    if again is not None and again.fun <= best.fun:
        best = again
    return best.x, float(best.fun), str(best.message)


def _nd_check(N, D, L) -> tuple[Optional[str], str, np.ndarray]:
    """(status or None if fittable, message, mask of usable points)."""
    ok = _finite_positive(N, D, L)
    n = int(ok.sum())
    dropped = len(N) - n
    note = f"; {dropped} non-finite or non-positive point(s) left out" if dropped else ""
    if n == 0:
        return NO_FINITE, f"no point with finite, positive N, D and loss (of {len(N)})", ok
    n_N, n_D = len(np.unique(N[ok])), len(np.unique(D[ok]))
    if n_N == 1:
        return ONE_SIZE, f"all {n} point(s) have one model size (N = {N[ok][0]:.4g}): A and alpha are undetermined" \
            + note, ok
    if n_D == 1:
        return ONE_TOKENS, f"all {n} point(s) have one token count (D = {D[ok][0]:.4g}): B and beta are " \
            "undetermined" + note, ok
    if n < ND_MIN_POINTS:
        return TOO_FEW_POINTS, f"{n} points; 5 parameters need >= {ND_MIN_POINTS}" + note, ok
    if n_N < ND_MIN_DISTINCT:
        return TOO_FEW_SIZES, f"{n_N} distinct model sizes; A, alpha and E need >= {ND_MIN_DISTINCT}" + note, ok
    if n_D < ND_MIN_DISTINCT:
        return TOO_FEW_TOKENS, f"{n_D} distinct token counts; B, beta and E need >= {ND_MIN_DISTINCT}" + note, ok
    lu, lv = np.log(N[ok]), np.log(D[ok])
    resid = lv - np.polyval(np.polyfit(lu, lv, 1), lu)
    if np.std(resid) < 1e-3 * max(np.std(lv), 1e-12) or np.std(resid) < 1e-6:
        return COLLINEAR, ("ln N and ln D lie on one line (one compute budget or one tokens-per-parameter ratio): "
                           "the N and D terms cannot be told apart" + note), ok
    return None, note.lstrip("; "), ok


def fit_loss_nd(N: Sequence[float], D: Sequence[float], L: Sequence[float], *, huber_delta: float = 1e-3,
                n_boot: int = 200, seed: int = 0, n_polish: Optional[int] = 20, C: Optional[Sequence[float]] = None,
                budget_tolerance: float = 0.1, budget_tags: Optional[Sequence[Optional[float]]] = None,
                clusters: Optional[Sequence] = None) -> NDFit:
    """Fit L(N, D) = E + A / N^alpha + B / D^beta (Chinchilla approach 3) with bootstrap intervals.

    N: parameters, D: training tokens, L: loss (nats/token), one entry per point (seed groups
    already averaged). Non-finite or non-positive points are left out and counted. Starts: the
    4,500-point grid of Hoffmann et al. is evaluated at once and the best ``n_polish`` of it (all
    with ``n_polish=None``, slow) plus a profile start are polished by L-BFGS-B; the best result is
    kept. The bootstrap resamples points (>= ``ND_PAIRS_MIN_POINTS``; resamples with fewer than 3
    distinct N or D are skipped) or else log residuals, inflated by sqrt(n / (n - 5)), and starts
    each refit from the full fit and the resample's best grid start.

    ``clusters`` (one label per point): points that share a label are not independent, e.g. the
    cooldown branches of one WSD trunk, which share its noise. The bootstrap then resamples whole
    clusters (with >= ``ND_CLUSTER_MIN`` of them and >= ``ND_PAIRS_MIN_POINTS`` points), else flips
    the sign of each cluster's residuals together (a wild cluster bootstrap, Rademacher signs).
    Resampling points as if independent would understate the intervals.

    With ``C`` (each point's training FLOPs; ``budget_tags`` as :func:`group_budgets`) points that
    all share one compute budget are refused as "one-budget": along one budget D is a function
    of N, and the N and D terms would be told apart only by their assumed shapes.
    """
    N, D, L = (np.asarray(x, dtype=float).ravel() for x in (N, D, L))
    if not len(N) == len(D) == len(L):
        raise ValueError(f"fit_loss_nd: {len(N)} sizes, {len(D)} token counts, {len(L)} losses")
    status, message, ok = _nd_check(N, D, L)
    if status is None and C is not None:
        C = np.asarray(C, dtype=float).ravel()
        tags = None if budget_tags is None else [t for t, k in zip(budget_tags, ok) if k]
        if len(group_budgets(C[ok], tolerance=budget_tolerance, tags=tags)) == 1:
            status = ONE_BUDGET
            message = (f"all {int(ok.sum())} points share one compute budget (C = {np.exp(np.mean(np.log(C[ok]))):.3g} "
                       f"FLOPs within {budget_tolerance:.0%}): the N and D terms cannot be told apart; "
                       "train at >= 2 budgets") + ("; " + message if message else "")
    n = int(ok.sum())
    fit = NDFit(n_points=n, status=status or OK, message=message, n_dropped=len(N) - n, huber_delta=huber_delta,
                n_sizes=len(np.unique(N[ok])), n_token_counts=len(np.unique(D[ok])))
    if status is not None:
        return fit
    N, D, L = N[ok], D[ok], L[ok]
    fit.N_range, fit.D_range = [float(N.min()), float(N.max())], [float(D.min()), float(D.max())]
    u0, v0 = float(np.mean(np.log(N))), float(np.mean(np.log(D)))
    u, v, log_L = np.log(N) - u0, np.log(D) - v0, np.log(L)
    grid = _hoffmann_grid(u0, v0)
    order = np.argsort(_nd_grid_objectives(grid, u, v, log_L, huber_delta))
    starts = [grid[i] for i in (order if n_polish is None else order[:n_polish])]
    profile = _nd_profile_start(u, v, L, huber_delta)
    if profile is not None:
        starts.append(profile)
    best = _nd_minimise(u, v, L, huber_delta, np.asarray(starts))
    fit.n_starts = len(starts)
    if best is None:
        fit.status, fit.message = FAILED, "L-BFGS-B failed from every start"
        return fit
    theta, fit.objective, fit.optimizer_message = best
    _fill_nd(fit, theta, u0, v0)
    r = _nd_parts(theta, u, v)[0] - log_L
    fit.rms_log_residual = float(np.sqrt(np.mean(r ** 2)))
    labels = None if clusters is None else np.asarray([str(c) for c in clusters])[ok]
    _nd_bootstrap(fit, theta, N, D, L, u0, v0, n_boot, huber_delta, seed, labels)
    fit.flags = nd_bound_flags(fit, theta, u0, v0, L)
    return fit


def nd_bound_flags(fit: NDFit, theta, u0: float, v0: float, L: np.ndarray) -> list[str]:
    """:func:`bound_flags` of an L(N, D) fit: the optimiser's coordinates (A and B as their terms at
    the geometric-mean N and D, E, alpha, beta; :func:`_nd_bounds`) from the point estimate ``theta``
    (centred) and the bootstrap draws; E under ``NEGLIGIBLE`` times the smallest loss is at its lower
    bound (a term's size is not tested so: it changes with N or D)."""
    bounds = _nd_bounds(L)
    ci = [None] * 5
    if fit.samples is not None:
        E, A, alpha, B, beta = fit.samples.T
        with np.errstate(divide="ignore", invalid="ignore"):
            ci = [_interval(np.log(A) - alpha * u0), _interval(np.log(B) - beta * v0), _interval(np.log(E)),
                  _interval(alpha), _interval(beta)]
    names = ("A / N^alpha at the mean ln N", "B / D^beta at the mean ln D", "E")
    floor = math.log(NEGLIGIBLE * float(np.min(L)))
    checks = [(float(theta[i]), ci[i], *bound_thresholds(lo, hi, floor if i == 2 else None),
               f"{names[i]} >= {_g(math.exp(lo))}",
               f"{names[i]} <= {_g(math.exp(hi))}" + (" (the largest loss)" if i == 2 else ""))
              for i, (lo, hi) in enumerate(bounds[:3])]
    checks += [(float(theta[i]), ci[i], *bound_thresholds(lo, hi), f"{name} >= {lo:g}", f"{name} <= {hi:g}")
               for i, name, (lo, hi) in ((3, "alpha", bounds[3]), (4, "beta", bounds[4]))]
    return bound_flags(checks)


def _natural(theta: np.ndarray, u0: float, v0: float) -> tuple[float, float, float, float, float]:
    """(log A, log B, log E, alpha, beta) in natural units from the centred theta."""
    a_c, b_c, e, alpha, beta = (float(x) for x in theta)
    return a_c + alpha * u0, b_c + beta * v0, e, alpha, beta


def _fill_nd(fit: NDFit, theta, u0, v0) -> None:
    log_A, log_B, log_E, alpha, beta = _natural(theta, u0, v0)
    fit.log_A, fit.log_B, fit.log_E, fit.alpha, fit.beta = log_A, log_B, log_E, alpha, beta
    fit.A, fit.B, fit.E = _exp(log_A), _exp(log_B), math.exp(log_E)
    if alpha + beta > 0:
        fit.a_opt, fit.b_opt = beta / (alpha + beta), alpha / (alpha + beta)


def _exp(x: float) -> float:
    return math.exp(x) if x < 709 else math.inf


def _cluster_members(labels: Optional[np.ndarray], n: int) -> tuple[Optional[list], Optional[np.ndarray]]:
    """(indices of each cluster, cluster index of each point), or (None, None) when every point is its own."""
    if labels is None:
        return None, None
    _, inv = np.unique(labels, return_inverse=True)
    n_clusters = int(inv.max()) + 1 if n else 0
    if n_clusters >= n:
        return None, None
    return [np.flatnonzero(inv == g) for g in range(n_clusters)], inv


def _nd_bootstrap(fit: NDFit, theta, N, D, L, u0, v0, n_boot, delta, seed, labels=None) -> None:
    rng = np.random.default_rng(seed)
    n = len(N)
    u_all, v_all = np.log(N) - u0, np.log(D) - v0
    log_fit = _nd_parts(theta, u_all, v_all)[0]
    resid = np.log(L) - log_fit
    resid = (resid - resid.mean()) * math.sqrt(n / max(n - 5, 1))
    members, inv = _cluster_members(labels, n)
    n_units = len(members) if members else n
    pairs = n >= ND_PAIRS_MIN_POINTS and (members is None or n_units >= ND_CLUSTER_MIN)
    if members:
        fit.ci_method = f"clusters ({n_units})" if pairs else f"residuals, one sign per cluster ({n_units})"
    else:
        fit.ci_method = "points" if pairs else "residuals"
    grid = _hoffmann_grid(u0, v0)
    samples = []
    for _ in range(n_boot):
        if pairs:
            idx = (rng.integers(0, n, n) if members is None else
                   np.concatenate([members[g] for g in rng.integers(0, n_units, n_units)]))
            if _nd_check(N[idx], D[idx], L[idx])[0] is not None:
                continue
            u, v, Lb = u_all[idx], v_all[idx], L[idx]
        elif members:  # wild cluster bootstrap: a cluster's residuals keep their pattern and flip together
            u, v, Lb = u_all, v_all, np.exp(log_fit + resid * rng.choice([-1.0, 1.0], n_units)[inv])
        else:
            u, v, Lb = u_all, v_all, np.exp(log_fit + resid[rng.integers(0, n, n)])
        g = grid[int(np.argmin(_nd_grid_objectives(grid, u, v, np.log(Lb), delta)))]
        best = _nd_minimise(u, v, Lb, delta, np.asarray([theta, g]), maxiter=500)
        if best is not None:
            log_A, log_B, log_E, alpha, beta = _natural(best[0], u0, v0)
            samples.append((math.exp(log_E), _exp(log_A), alpha, _exp(log_B), beta))
    fit.n_boot = len(samples)
    if len(samples) < 10:
        return
    s = np.asarray(samples)
    fit.samples = s
    E, A, alpha, B, beta = s.T
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        derived = {"E": E, "A": A, "alpha": alpha, "B": B, "beta": beta, "log_E": np.log(E), "log_A": np.log(A),
                   "log_B": np.log(B), "a_opt": beta / (alpha + beta), "b_opt": alpha / (alpha + beta),
                   "G": (alpha * A / (beta * B)) ** (1 / (alpha + beta))}
    fit.ci = {k: _interval(x) for k, x in derived.items()}


# --------------------------------------------------------------------------------------------
# compute-optimal allocation from L(N, D)
# --------------------------------------------------------------------------------------------


@dataclass
class ComputeOptimal:
    """The N and D that minimise the fitted L(N, D) at compute C = k N D.

    N_opt = G (C/k)^a, D_opt = G^-1 (C/k)^b, a = beta/(alpha+beta), b = alpha/(alpha+beta),
    G = (alpha A / (beta B))^(1/(alpha+beta)); ``k`` is the training FLOPs per token per parameter
    (6 in Kaplan's and Chinchilla's C = 6ND). Intervals from the fit's bootstrap samples.
    """

    status: str
    message: str = ""
    C: Optional[float] = None
    k: Optional[float] = None
    a: Optional[float] = None
    b: Optional[float] = None
    G: Optional[float] = None
    N_opt: Optional[float] = None
    D_opt: Optional[float] = None
    tokens_per_param: Optional[float] = None
    L_opt: Optional[float] = None
    ci: dict = field(default_factory=dict)
    flags: list = field(default_factory=list)  # N_opt outside the fit's N range; the fit's own flags

    def to_json(self) -> dict:
        return json_safe({**asdict(self), "status": reported_status(self)})


def n_opt_flags(N_opt: Optional[float], N_range: Optional[Sequence[float]]) -> list[str]:
    """["N_opt outside the trained sizes (...)"] when N_opt lies outside ``N_range`` (the smallest and
    largest N trained), else []."""
    if N_opt is None or not N_range or not math.isfinite(N_opt):
        return [] if N_opt is None or not N_range else [f"{N_OPT_OUTSIDE} (N_opt = {_g(N_opt)})"]
    lo, hi = N_range
    if N_opt < lo:
        return [f"{N_OPT_OUTSIDE} (N_opt = {_g(N_opt)} < smallest trained N = {_g(lo)})"]
    if N_opt > hi:
        return [f"{N_OPT_OUTSIDE} (N_opt = {_g(N_opt)} > largest trained N = {_g(hi)})"]
    return []


def _optimum(E, A, alpha, B, beta, C, k):
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        s = alpha + beta
        G = (alpha * A / (beta * B)) ** (1 / s)
        a, b = beta / s, alpha / s
        N = G * (C / k) ** a
        D = (C / k) ** b / G
        L = E + A * N ** (-alpha) + B * D ** (-beta)
    return {"a": a, "b": b, "G": G, "N_opt": N, "D_opt": D, "tokens_per_param": D / N, "L_opt": L}


def compute_optimal(fit: NDFit, C: float, k: float = 6.0) -> ComputeOptimal:
    """Compute-optimal N, D, tokens per parameter and loss at compute C (FLOPs) for C = k N D."""
    if fit.status != OK:
        return ComputeOptimal(status=fit.status, message=f"no L(N, D) fit: {fit.message}", C=C, k=k)
    if not (fit.alpha > 0 and fit.beta > 0):
        return ComputeOptimal(status=DEGENERATE, C=C, k=k,
                              message=f"alpha = {fit.alpha:.3g}, beta = {fit.beta:.3g}: no interior optimum")
    point = _optimum(fit.E, fit.A, fit.alpha, fit.B, fit.beta, float(C), float(k))
    out = ComputeOptimal(status=OK, C=float(C), k=float(k), **{key: float(v) for key, v in point.items()})
    out.flags = n_opt_flags(out.N_opt, fit.N_range) + [f"L(N, D): {f}" for f in fit.flags]
    if fit.samples is not None:
        E, A, alpha, B, beta = fit.samples.T
        good = (alpha > 0) & (beta > 0)
        per = _optimum(E[good], A[good], alpha[good], B[good], beta[good], float(C), float(k))
        out.ci = {key: _interval(v) for key, v in per.items()}
        if (~good).any():
            out.message = f"{int((~good).sum())} bootstrap fits with a zero exponent left out"
    return out


# --------------------------------------------------------------------------------------------
# power laws through points: log y = log c + a log x
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# approach 2: IsoFLOP profiles
# --------------------------------------------------------------------------------------------

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


def group_budgets(C: Sequence[float], *, tolerance: float = 0.1,
                  tags: Optional[Sequence[Optional[float]]] = None) -> list[np.ndarray]:
    """Indices of the points of each compute budget, in increasing C. Points with a budget tag
    (the sweep's FLOPs budget) group by it; the others chain in increasing C while each is within
    ``tolerance`` (relative) of its group's first point."""
    C = np.asarray(C, dtype=float)
    tags = [None] * len(C) if tags is None else list(tags)
    groups: list[list[int]] = []
    by_tag: dict[float, list[int]] = {}
    for i, t in enumerate(tags):
        if t is not None and math.isfinite(C[i]):
            by_tag.setdefault(float(t), []).append(i)
    groups.extend(by_tag.values())
    rest = sorted((i for i, t in enumerate(tags) if t is None and math.isfinite(C[i])), key=lambda i: C[i])
    for i in rest:
        if groups and groups[-1][0] in rest and C[i] <= C[groups[-1][0]] * (1 + tolerance):
            groups[-1].append(i)
        else:
            groups.append([i])
    return sorted((np.asarray(g) for g in groups), key=lambda g: float(np.min(C[g])))


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


# --------------------------------------------------------------------------------------------
# approach 1: the envelope
# --------------------------------------------------------------------------------------------


def pareto_frontier(C: Sequence[float], L: Sequence[float]) -> np.ndarray:
    """Indices of the compute-optimal points: no other point reaches a lower loss with at most
    the same compute. Returned in increasing C."""
    C = np.asarray(C, dtype=float)
    L = np.asarray(L, dtype=float)
    order = np.lexsort((L, C))
    keep, best = [], math.inf
    for i in order:
        if L[i] < best:
            keep.append(i)
            best = L[i]
    return np.asarray(keep, dtype=int)


def envelope(curves: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]],
             n: int = 60) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Compute-optimal frontier of a family: at each compute C, the lowest validation loss any
    run reached with at most C FLOPs (Kaplan's envelope). ``curves``: (run, tokens, C, loss)
    per run. Returns (C grid, loss, run at each C)."""
    all_c = np.concatenate([c for _, _, c, _ in curves])
    grid = np.logspace(np.log10(all_c.min()), np.log10(all_c.max()), n)
    best = np.full(n, np.inf)
    who = [""] * n
    for name, _, c, loss in curves:
        for j, g in enumerate(grid):
            reached = loss[c <= g * (1 + 1e-9)]
            if len(reached) and reached.min() < best[j]:
                best[j], who[j] = reached.min(), name
    ok = np.isfinite(best)
    return grid[ok], best[ok], [w for w, k in zip(who, ok) if k]


@dataclass
class EnvelopeExponent:
    """Approach 1: N of the envelope's run against C, N_opt ∝ C^a (log-log least squares).

    Grid points won by the smallest or the largest size are left out (``trim_extremes``): there
    the optimum may lie beyond the sizes trained. Interval: bootstrap over runs (the envelope and
    the fit redone on resampled run sets)."""

    status: str
    message: str = ""
    n_runs: int = 0
    n_sizes: int = 0  # distinct N among the kept envelope points
    n_grid: int = 0  # envelope points kept
    slope: Optional[float] = None
    log_prefactor: Optional[float] = None
    ci: dict = field(default_factory=dict)
    n_boot: int = 0
    ci_method: str = "runs"
    C: list = field(default_factory=list)
    N: list = field(default_factory=list)

    def to_json(self) -> dict:
        return json_safe(asdict(self))


def _envelope_points(curves, sizes, n_grid, trim):
    C, _, who = envelope(curves, n_grid)
    N = np.array([sizes[w] for w in who], dtype=float)
    keep = np.ones(len(N), dtype=bool)
    if trim:
        all_N = [sizes[name] for name, *_ in curves]
        keep &= (N > min(all_N)) & (N < max(all_N))
    return C[keep], N[keep]


def envelope_exponent(curves: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]], sizes: dict[str, float], *,
                      n_grid: int = 60, trim_extremes: bool = True, n_boot: int = 200,
                      seed: int = 0) -> EnvelopeExponent:
    """Exponent a of N_opt ∝ C^a from the envelope of training curves (Chinchilla approach 1).

    ``curves``: (run, tokens, C, loss) per run, as :func:`envelope`; ``sizes``: run -> N. The
    curves should be finite (drop NaN rows first)."""
    curves = [c for c in curves if len(c[2]) and np.all(np.isfinite(c[2])) and np.all(np.isfinite(c[3]))]
    res = EnvelopeExponent(status=OK, n_runs=len(curves))
    distinct = sorted({sizes[name] for name, *_ in curves})
    if len(curves) == 0:
        res.status, res.message = NO_FINITE, "no run with a finite validation curve"
        return res
    if len(distinct) == 1:
        res.status, res.message = ONE_SIZE, f"one model size (N = {distinct[0]:.4g}): no optimal-size trend"
        return res
    C, N = _envelope_points(curves, sizes, n_grid, trim_extremes)
    res.C, res.N, res.n_grid, res.n_sizes = C.tolist(), N.tolist(), len(C), len(np.unique(N))
    if res.n_sizes < 2:
        res.status = TOO_FEW_SIZES
        res.message = (f"{res.n_sizes} model size(s) win the envelope away from the smallest and largest "
                       f"({len(distinct)} sizes trained): a slope needs >= 2" if trim_extremes else
                       f"{res.n_sizes} model size(s) on the envelope: a slope needs >= 2")
        return res
    res.slope, res.log_prefactor = (float(v) for v in np.polyfit(np.log(C), np.log(N), 1))
    rng = np.random.default_rng(seed)
    slopes = []
    for _ in range(n_boot):
        pick = [curves[i] for i in sorted(set(rng.integers(0, len(curves), len(curves)).tolist()))]
        if len({sizes[name] for name, *_ in pick}) < 2:
            continue
        Cb, Nb = _envelope_points(pick, sizes, n_grid, trim_extremes)
        if len(np.unique(Nb)) >= 2:
            slopes.append(np.polyfit(np.log(Cb), np.log(Nb), 1)[0])
    res.n_boot = len(slopes)
    iv = _interval(np.asarray(slopes)) if slopes else None
    if iv:
        res.ci = {"slope": iv}
    return res


# --------------------------------------------------------------------------------------------
# seed noise
# --------------------------------------------------------------------------------------------


@dataclass
class NoiseFloor:
    """Pooled standard deviation of the loss over seed groups (runs that differ only in train.seed):
    sqrt(sum (n_i - 1) s_i^2 / sum (n_i - 1)), in nats/token."""

    status: str
    message: str = ""
    std: Optional[float] = None
    dof: int = 0
    n_groups: int = 0  # groups with >= 2 finite seeds
    n_runs: int = 0

    def to_json(self) -> dict:
        return json_safe(asdict(self))


def pooled_std(groups: Sequence[Sequence[float]]) -> NoiseFloor:
    """Noise floor from seed groups (each a sequence of losses of one point); non-finite losses are left out."""
    ss, dof, n_groups, n_runs = 0.0, 0, 0, 0
    for g in groups:
        x = np.asarray(g, dtype=float)
        x = x[np.isfinite(x)]
        n_runs += len(x)
        if len(x) >= 2:
            ss += float(((x - x.mean()) ** 2).sum())
            dof += len(x) - 1
            n_groups += 1
    if dof == 0:
        return NoiseFloor(status=NO_SEEDS, n_runs=n_runs,
                          message="no point was trained with more than one seed: noise floor unknown")
    return NoiseFloor(status=OK, std=math.sqrt(ss / dof), dof=dof, n_groups=n_groups, n_runs=n_runs)


@dataclass
class DesignNoise:
    """The designer's noise model measured from seed pairs (``analysis.scaling design``'s ``noise:``):
    sigma = std of ln L of one run, from the pairs' differences d = ln L_2 - ln L_1 (E d = 0, Var d =
    2 sigma^2); trunk_share = the share of sigma^2 that the branches of one WSD trunk have in common,
    1 - (within-trunk variance of d) / (variance of d), from the trunks with >= 2 branches' pairs."""

    status: str
    message: str = ""
    sigma: Optional[float] = None
    n_pairs: int = 0
    trunk_share: Optional[float] = None
    n_trunks: int = 0  # trunks with >= 2 branches' pairs

    def to_json(self) -> dict:
        return json_safe(asdict(self))


def design_noise(pairs: Sequence[tuple[object, float, float]]) -> DesignNoise:
    """:class:`DesignNoise` from (trunk label, loss of seed 1, loss of seed 2) triples, one per point
    trained with two seeds (losses in nats; the label groups the branches of one pair of trunks)."""
    rows = [(c, math.log(b) - math.log(a)) for c, a, b in pairs
            if a > 0 and b > 0 and math.isfinite(a) and math.isfinite(b)]
    if not rows:
        return DesignNoise(status=NO_SEEDS, message="no point was trained with two seeds: noise not measured")
    d = np.array([x for _, x in rows])
    out = DesignNoise(status=OK, sigma=float(math.sqrt(np.mean(d ** 2) / 2.0)), n_pairs=len(d))
    by: dict = {}
    for c, x in rows:
        by.setdefault(c, []).append(x)
    groups = [np.asarray(g) for g in by.values() if len(g) >= 2]
    dof = sum(len(g) - 1 for g in groups)
    if dof and np.mean(d ** 2) > 0:
        within = sum(float(((g - g.mean()) ** 2).sum()) for g in groups) / dof
        out.trunk_share = float(min(1.0, max(0.0, 1.0 - within / np.mean(d ** 2))))
        out.n_trunks = len(groups)
    else:
        out.message = "no trunk has two branches trained with both seeds: trunk share not measured"
    return out


# --------------------------------------------------------------------------------------------
# checks of the fits: agreement of two estimates, a held-out prediction
# --------------------------------------------------------------------------------------------


def sample_fits(fit: NDFit) -> list[NDFit]:
    """One exact :class:`NDFit` per bootstrap draw of ``fit`` (empty without draws), for functions
    that take a fit (e.g. :func:`compute_optimal`)."""
    if fit.samples is None:
        return []
    return [NDFit(n_points=fit.n_points, status=OK, E=float(E), A=float(A), alpha=float(al), B=float(B),
                  beta=float(be), a_opt=float(be / (al + be)) if al + be > 0 else None)
            for E, A, al, B, be in fit.samples]


def difference_interval(x_samples, y_samples, *, n: int = 2000, seed: int = 0) -> Optional[list]:
    """95% interval of y - x from bootstrap draws of two estimates, paired at random (as if their
    errors were independent; two estimates from the same data err together, so this is wider than
    the interval of a joint bootstrap: a conservative test of disagreement). None with < 10 draws
    of either."""
    x = np.asarray(x_samples, dtype=float)
    y = np.asarray(y_samples, dtype=float)
    x, y = x[np.isfinite(x)], y[np.isfinite(y)]
    if len(x) < 10 or len(y) < 10:
        return None
    rng = np.random.default_rng(seed)
    return _interval(y[rng.integers(0, len(y), n)] - x[rng.integers(0, len(x), n)])


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
