"""Approach 3: L(N, D) = E + A / N^alpha + B / D^beta (Hoffmann et al. 2022), its bootstrap over points,
residuals or whole trunks, the compute-optimal allocation it implies, and the compute multiplier of two fits.

The fit, its starts and its intervals: docs/methods/scaling.md.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Optional, Sequence

import numpy as np
from scipy.optimize import minimize, nnls

from analysis.curve_fit import huber
from analysis.scaling.fits.common import (
    COLLINEAR,
    DEGENERATE,
    FAILED,
    ND_CLUSTER_MIN,
    NEGLIGIBLE,
    NO_FINITE,
    OK,
    ONE_BUDGET,
    ONE_SIZE,
    ONE_TOKENS,
    TOO_FEW_POINTS,
    TOO_FEW_SIZES,
    TOO_FEW_TOKENS,
    _cluster_members,
    _finite_positive,
    _g,
    _interval,
    bound_flags,
    bound_thresholds,
    group_budgets,
    json_safe,
    n_opt_flags,
    reported_status,
)

ND_PARAMS = ("E", "A", "alpha", "B", "beta")
ND_MIN_POINTS = 6  # 5 parameters + at least one degree of freedom
ND_MIN_DISTINCT = 3  # A/N^alpha + a shared constant needs 3 distinct N (likewise D)
ND_PAIRS_MIN_POINTS = 10  # below this, bootstrap residuals (twice the parameters, as fit_power_law's 6 for 3)
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


def sample_fits(fit: NDFit) -> list[NDFit]:
    """One exact :class:`NDFit` per bootstrap draw of ``fit`` (empty without draws), for functions
    that take a fit (e.g. :func:`compute_optimal`)."""
    if fit.samples is None:
        return []
    return [NDFit(n_points=fit.n_points, status=OK, E=float(E), A=float(A), alpha=float(al), B=float(B),
                  beta=float(be), a_opt=float(be / (al + be)) if al + be > 0 else None)
            for E, A, al, B, be in fit.samples]


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
