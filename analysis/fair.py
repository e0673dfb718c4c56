"""Statistics of fair architecture comparisons: the compute-equivalent gain of an arm, difference and
equivalence tests over paired seeds with Holm's correction, and the sampling error of the validation set.

Pure functions over plain numbers (numpy, scipy): no run folders, no plotting; ``tools.experiment_ceg``
reads the runs and calls these.

1. Compute-equivalent gain (CEG). The reference arm's loss as a function of training compute, L_ref(C),
is measured by the cooldown branches of one WSD trunk per seed: seed s gives points (C_sj, L_sj). An arm
trained with C_arm FLOPs whose seeds reach the mean loss L_arm is worth

    CEG = C_ref(L_arm) / C_arm,    C_ref = L_ref^-1,

the compute the reference needs for the arm's loss over the compute the arm used: CEG = 1.3 means the
arm matches the reference trained 1.3 times longer.

:func:`fit_compute_curve` fits all seeds' points pooled with

    L(C) = E + A' (C / C0)^-alpha,    A' = exp(a),    C0 = geometric mean of the measured C

(A = A' C0^alpha in L = E + A C^-alpha). Measuring C from C0 makes a the excess loss in the middle of
the measured range instead of at C = 1 FLOP, which keeps a and alpha from trading off over 12 decades;
exp(a) keeps A' > 0. Bounds: 0 <= E < min(L), 0 < alpha <= 5. ``scipy.optimize.least_squares`` minimises
the residuals in loss (nats), from several starts (E a share of min L; a and alpha from the straight
line of ln(L - E) on ln(C / C0)). Residuals in loss, not in log loss: the noise of a measured loss
(seed, evaluation batches) is additive and about as large in nats at 3.5 as at 5, so least squares in
nats is the maximum-likelihood fit under that noise, and the loss is what gets inverted; over so narrow
a range of losses log loss would weight the points almost alike anyway.

The local fit (kind "local") is a piecewise power law through the measured points: the seeds' losses
at each compute averaged, made non-increasing in C (pool adjacent violators, weighted by the number of
points), then ln L linear in ln C between neighbouring computes. It assumes nothing beyond the points
(and is exact on a pure power law). It is used instead of the power law when

- there are fewer than 4 distinct computes: 3 parameters through <= 3 points leave no check on the form;
- the optimiser fails, or the fit ends on a bound that makes it ill-conditioned: E at min(L) (the
  points flatten out and E cannot be told from the last point) or alpha at 0 or 5. E at 0 (a pure power
  law) is a legitimate fit and is kept;
- the power law misses the points: its rms residual exceeds both twice the local fit's (which, through
  the per-compute means, holds the seeds' scatter) and 2% of the measured loss range.

``kind`` and ``reason`` say which was used and why. :func:`compute_for_loss` inverts the fit:
C_ref(L) = C0 ((L - E) / A')^(-1/alpha) for the power law, and returns None when L lies outside
[L(c_max), L(c_min)] (no extrapolation) or L <= E.

Unpaired interval (:func:`ceg_replicates`, :func:`compute_equivalent_gain`): the baseline that
``analysis.ceg_coverage`` measures the paired inference of ``analysis.verdicts`` against (the reports use the
paired one: this bootstrap covered 87% at 3 seeds with independent seed luck, 99% at 5 with shared luck).
An (expanded) percentile bootstrap. Each
replicate resamples, independently, the reference's seeds (whole curves, with replacement; the fit redone
on their pooled points, cached per multiset of seeds) and the arm's seeds (the mean of their losses over
the mean of their compute). A replicate whose loss falls below its curve's measured range (the arm better
than the reference at c_max: CEG > c_max / C_arm, unmeasured) counts as ln CEG = +inf, one above the range
as -inf; none is dropped (``outside_share``). The interval takes order statistics over all replicates at
a tail share tau on each side. A plain percentile interval over a few seeds is too narrow (the resampled
mean spreads by sqrt((n-1)/n) s / sqrt(n), and the normal quantile stands in for t_{n-1}, 4.30 at n = 3),
so by default the tail is that of the expanded percentile interval (Hesterberg 2015, :func:`boot_tail`):

    tau = Phi(-sqrt(n / (n-1)) t_{(1+level)/2, n-1}),   n = the fewer seeds of the two resampled sources

(3 seeds: tau ~ 1e-7, the extreme replicates; 10 seeds: the interval ~1.2x the plain one). On synthetic
curves (5 computes, 0.003 nats of noise per point, CEG 1, 150-200 draws) the 95% interval covered CEG in
80% of the draws plain and 83-88% expanded with 3 seeds per source (10 distinct resamples each: the
extreme replicate cannot go further than the extreme seed), 90% and 98% with 5; ``expand=False`` gives
the plain tau = (1 - level) / 2. A side lands outside the measured range when more than tau of the
replicates are outside on that side; that side is then a bound: high None with ``high_bound`` =
c_max / C_arm (the largest measurable CEG), or low None with ``low_bound`` = c_min / C_arm. When the point
estimate itself is outside, ``ceg`` is None and ``status`` is "above the measured range" (arm's loss below
L_ref(c_max); ``bound`` = c_max / C_arm, ``direction`` ">") or "below the measured range" (``bound`` =
c_min / C_arm, ``direction`` "<"): never an extrapolated value. With one reference seed the reference
resampling is void and the interval holds only the arm's seed-to-seed error (``note`` says so).

:func:`loss_margin_from_ceg`: a margin CEG in [g_lo, g_hi] at compute C is, on the reference curve,
the loss differences (L_ref(g_hi C) - L_ref(C), L_ref(g_lo C) - L_ref(C)), a negative and a positive
number of nats, to test on the paired loss difference against the reference at the same compute.

2. Paired tests. The verdicts' t and TOST tests on per-seed paired values are ``analysis.verdicts``
(one inference per comparison); here are the pieces they share.

:func:`holm`: over a family of k p-values, Holm's step-down: sorted p_(1) <= ... <= p_(k), reject p_(i)
while p_(i) <= alpha / (k - i + 1), stop at the first that is not; adjusted p_adj_(i) =
max_{j <= i} min(1, (k - j + 1) p_(j)), so p_adj <= alpha exactly for the rejected ones. It controls the
family-wise error at alpha with no assumption on dependence.

:func:`seeds_needed`: the smallest n for which TOST concludes equivalence with the given power when the
true difference is ``mean``, with d taken as normal with the known sd / sqrt(n) and the critical value
t_{1-alpha, n-1} (the randomness of s is ignored, so it errs slightly low for n < 5):

    power(n) = Phi((m_hi - c se - mean) / se) - Phi((m_lo + c se - mean) / se),   c = t_{1-alpha, n-1}.

3. Sampling error of the validation set (:func:`bootstrap_mean_interval`, :func:`paired_bootstrap_difference`):
percentile bootstrap over the validation windows (items) of one run, or of the per-window difference of
two runs evaluated on the same windows; the half-width is set beside the seed interval to show how much
of it the finite validation set explains.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

LEVEL = 0.95
ALPHA = 0.05
ALPHA_MAX = 5.0  # upper bound of the compute exponent
MIN_POWER_LAW_COMPUTES = 4  # distinct computes below which the local fit is used
MISFIT_NOISE = 2.0  # power-law rms above this many times the local fit's (the seeds' scatter) ...
MISFIT_RANGE = 0.02  # ... and above this share of the loss range: the power law misses the points
E_STARTS = (0.0, 0.5, 0.8, 0.9, 0.95, 0.98)  # starts of E, as shares of min(L)

ABOVE = "above the measured range"
BELOW = "below the measured range"


# --------------------------------------------------------------------------------------------
# 1. compute-equivalent gain
# --------------------------------------------------------------------------------------------


def fit_compute_curve(points: Sequence[tuple[float, float]], start: Optional[dict] = None) -> dict:
    """Fit L(C) to (C FLOPs, loss) points pooled over seeds: the power law E + A' (C/C0)^-alpha, or the
    local piecewise power law when the power law is ill-conditioned (module docstring). Returns
    {kind, reason, E, A, A_c0 (= A'), alpha, c0, c_min, c_max, l_min (fitted loss at c_max), l_max (at c_min),
    rms (residual, nats), n_points, n_computes, knots (local: {log_c, loss}; power law: None)}.
    Points with a non-finite or non-positive compute or loss are left out; raises ValueError with fewer than
    2 distinct computes left. ``start``: a power-law fit of (nearly) the same points to start from (a refit;
    the usual starts are tried only if it gives no usable power law)."""
    C, L = _points(points)
    if start is not None and start.get("kind") == "power_law":
        return _fit(C, L, (start["E"], math.log(start["A_c0"]), start["alpha"]))
    return _fit(C, L)


def _points(points: Sequence[tuple[float, float]]) -> tuple[np.ndarray, np.ndarray]:
    arr = np.asarray([(float(c), float(v)) for c, v in points], dtype=float).reshape(-1, 2)
    ok = np.isfinite(arr).all(axis=1) & (arr > 0).all(axis=1)  # losses are cross-entropies: > 0
    return arr[ok, 0], arr[ok, 1]


def _fit(C: np.ndarray, L: np.ndarray, start: Optional[Sequence[float]] = None) -> dict:
    """The fit of the points; ``start`` (E, a, alpha) is tried first and alone, the usual starts after it
    only if it does not give a usable power law (bootstrap refits start from the point fit)."""
    if len(np.unique(C)) < 2:
        raise ValueError(f"fit_compute_curve: {len(np.unique(C))} distinct computes among {len(C)} points "
                         "with finite positive compute and loss; a curve needs >= 2")
    c0 = float(np.exp(np.mean(np.log(C))))
    x = np.log(C / c0)
    base = {"c0": c0, "c_min": float(C.min()), "c_max": float(C.max()), "n_points": int(len(C)),
            "n_computes": int(len(np.unique(C)))}
    if base["n_computes"] < MIN_POWER_LAW_COMPUTES:
        return _local(C, L, base, f"{base['n_computes']} distinct computes (< {MIN_POWER_LAW_COMPUTES})")
    theta, reason = _power_law(x, L, [start]) if start is not None else (None, "")
    if theta is None:
        theta, reason = _power_law(x, L, _starts(x, L))
    if theta is None:
        return _local(C, L, base, reason)
    E, a, alpha = (float(v) for v in theta)
    rms = _rms(L - (E + np.exp(a - alpha * x)))
    local = _local(C, L, base, "")
    if rms > max(MISFIT_NOISE * local["rms"], MISFIT_RANGE * float(np.ptp(L))):
        return {**local, "reason": f"the power law misses the points: rms residual {rms:.3g} nats against "
                f"{local['rms']:.3g} through the per-compute means, over a loss range of {np.ptp(L):.3g}"}
    return {**base, "kind": "power_law", "reason": "", "E": E, "A": math.exp(a + alpha * math.log(c0)),
            "A_c0": math.exp(a), "alpha": alpha, "l_min": float(E + math.exp(a - alpha * x.max())),
            "l_max": float(E + math.exp(a - alpha * x.min())), "rms": rms, "knots": None}


def _starts(x: np.ndarray, L: np.ndarray) -> list[np.ndarray]:
    """(E, a, alpha) starts: per E a share of min(L), the least-squares line of ln(L - E) on x."""
    out: list[np.ndarray] = []
    if L.min() <= 0:
        return out
    for share in E_STARTS:
        E = share * float(L.min())
        slope, icpt = np.polyfit(x, np.log(L - E), 1)
        out.append(np.array([E, icpt, float(np.clip(-slope, 0.01, ALPHA_MAX - 0.1))]))
    return out


def _power_law(x: np.ndarray, L: np.ndarray, starts: Sequence) -> tuple[Optional[np.ndarray], str]:
    """Best least-squares (E, a, alpha) over the starts, or None and why when it is not usable."""
    from scipy.optimize import least_squares

    l_lo = float(L.min())
    e_hi = l_lo - 1e-9 * max(1.0, abs(l_lo))
    if e_hi <= 0:
        return None, f"min loss {l_lo:g} leaves no room for E in [0, min L)"
    lb, ub = np.array([0.0, -np.inf, 0.0]), np.array([e_hi, np.inf, ALPHA_MAX])

    def resid(t):
        return t[0] + np.exp(t[1] - t[2] * x) - L

    def jac(t):
        p = np.exp(t[1] - t[2] * x)
        return np.stack([np.ones_like(x), p, -x * p], axis=1)

    best = None
    for t0 in starts:
        t0 = np.clip(np.asarray(t0, dtype=float), lb, ub)
        try:
            r = least_squares(resid, t0, jac=jac, bounds=(lb, ub), x_scale="jac", xtol=1e-14, ftol=1e-14,
                              gtol=1e-14, max_nfev=2000)
        except (ValueError, np.linalg.LinAlgError):
            continue
        if np.all(np.isfinite(r.x)) and (best is None or r.cost < best.cost):
            best = r
    if best is None:
        return None, "the optimiser failed"
    E, _, alpha = best.x
    span = max(float(np.ptp(L)), 1e-12)
    if E > e_hi - 1e-3 * span:
        return None, f"power law ill-conditioned: E at its bound min(L) = {l_lo:.4g}"
    if alpha < 1e-3 or alpha > ALPHA_MAX - 1e-3:
        return None, f"power law ill-conditioned: alpha = {alpha:.4g} at a bound of (0, {ALPHA_MAX:g}]"
    return best.x, ""


def _local(C: np.ndarray, L: np.ndarray, base: dict, reason: str) -> dict:
    """Piecewise power law through the per-compute means, made non-increasing in C."""
    cs, inv = np.unique(C, return_inverse=True)
    w = np.bincount(inv).astype(float)
    means = np.bincount(inv, weights=L) / w
    knots = _decreasing(means, w)
    lc = np.log(cs)
    pred = np.exp(np.interp(np.log(C), lc, np.log(knots)))
    return {**base, "kind": "local", "reason": reason, "E": None, "A": None, "A_c0": None, "alpha": None,
            "l_min": float(knots[-1]), "l_max": float(knots[0]), "rms": _rms(L - pred),
            "knots": {"log_c": lc.tolist(), "loss": knots.tolist()}}


def _decreasing(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted least-squares non-increasing fit of y (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [value, weight, count]
    for v, wt in zip(y.tolist(), w.tolist()):
        blocks.append([v, wt, 1])
        while len(blocks) > 1 and blocks[-2][0] < blocks[-1][0]:
            v2, w2, n2 = blocks.pop()
            v1, w1, n1 = blocks.pop()
            blocks.append([(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    return np.array([b[0] for b in blocks for _ in range(b[2])])


def _rms(r: np.ndarray) -> float:
    return float(np.sqrt(np.mean(r * r)))


def loss_at(fit: dict, compute: float) -> float:
    """L_ref(C) on the fit. Beyond [c_min, c_max] this extrapolates (the power law's formula, the local
    fit's end segments): fine for a margin 10% off the range, never used for a CEG."""
    if fit["kind"] == "power_law":
        return fit["E"] + fit["A_c0"] * (compute / fit["c0"]) ** -fit["alpha"]
    lc, ll = np.asarray(fit["knots"]["log_c"]), np.log(np.asarray(fit["knots"]["loss"]))
    x = math.log(compute)
    i = int(np.clip(np.searchsorted(lc, x) - 1, 0, len(lc) - 2))
    return float(math.exp(ll[i] + (ll[i + 1] - ll[i]) * (x - lc[i]) / (lc[i + 1] - lc[i])))


def compute_for_loss(fit: dict, loss: float) -> Optional[float]:
    """C_ref(loss): the compute at which the fitted reference reaches ``loss``; None outside the measured
    range [l_min, l_max] (no extrapolation) or at or below E."""
    tol = 1e-12 * max(1.0, abs(loss))
    if not math.isfinite(loss) or loss < fit["l_min"] - tol or loss > fit["l_max"] + tol:
        return None
    if fit["kind"] == "power_law":
        if loss <= fit["E"]:
            return None
        c = fit["c0"] * ((loss - fit["E"]) / fit["A_c0"]) ** (-1.0 / fit["alpha"])
        return float(min(max(c, fit["c_min"]), fit["c_max"]))
    lc, ll = fit["knots"]["log_c"], fit["knots"]["loss"]
    flat = [j for j, v in enumerate(ll) if abs(v - loss) <= tol]
    if len(flat) > 1:  # the loss of a flat stretch (pooled violators): its middle
        return float(math.exp((lc[flat[0]] + lc[flat[-1]]) / 2))
    i = next((j for j in range(len(lc) - 2) if ll[j] >= loss >= ll[j + 1] and ll[j] > ll[j + 1]), len(lc) - 2)
    if ll[i] == ll[i + 1]:
        return float(math.exp((lc[i] + lc[i + 1]) / 2))
    t = (math.log(loss) - math.log(ll[i])) / (math.log(ll[i + 1]) - math.log(ll[i]))
    return float(math.exp(lc[i] + min(max(t, 0.0), 1.0) * (lc[i + 1] - lc[i])))


def loss_margin_from_ceg(fit: dict, compute: float,
                         ceg_margin: tuple[float, float] = (0.9, 1.1)) -> tuple[float, float]:
    """(L_ref(g_hi C) - L_ref(C), L_ref(g_lo C) - L_ref(C)) for the margin (g_lo, g_hi) at compute C:
    the paired loss differences (negative, positive nats) at which the CEG reaches the margin's ends."""
    g_lo, g_hi = ceg_margin
    if not 0 < g_lo < g_hi:
        raise ValueError(f"ceg_margin {ceg_margin!r}: needs 0 < low < high")
    base = loss_at(fit, compute)
    return loss_at(fit, compute * g_hi) - base, loss_at(fit, compute * g_lo) - base


def _arm(arm_losses: dict[int, float], arm_compute: float | dict[int, float]) -> tuple[list, dict, dict]:
    seeds = sorted(s for s, v in arm_losses.items() if v is not None and math.isfinite(v))
    if not seeds:
        raise ValueError("compute_equivalent_gain: no finite arm loss")
    if isinstance(arm_compute, dict):
        missing = [s for s in seeds if s not in arm_compute]
        if missing:
            raise ValueError(f"compute_equivalent_gain: arm_compute has no entry for seeds {missing}")
        comp = {s: float(arm_compute[s]) for s in seeds}
    else:
        comp = {s: float(arm_compute) for s in seeds}
    if any(not (c > 0 and math.isfinite(c)) for c in comp.values()):
        raise ValueError(f"compute_equivalent_gain: arm compute must be finite and > 0, got {comp}")
    return seeds, {s: float(arm_losses[s]) for s in seeds}, comp


def _log_ceg(fit: dict, loss: float, c_arm: float) -> float:
    """ln CEG, or +inf / -inf when the loss is below / above the fit's measured range."""
    c = compute_for_loss(fit, loss)
    if c is not None:
        return math.log(c / c_arm)
    return math.inf if loss < fit["l_max"] else -math.inf


def ceg_replicates(ref_curves: dict[int, list[tuple[float, float]]], arm_losses: dict[int, float],
                   arm_compute: float | dict[int, float], n_boot: int = 2000, seed: int = 0,
                   point_fit: Optional[dict] = None) -> np.ndarray:
    """ln CEG of ``n_boot`` bootstrap replicates (reference seeds and arm seeds resampled independently;
    module docstring): +inf where the replicate's loss is below its curve's measured range, -inf above."""
    ref_seeds = sorted(ref_curves)
    pts = {s: _points(ref_curves[s]) for s in ref_seeds}
    if point_fit is None:
        point_fit = fit_compute_curve([p for s in ref_seeds for p in ref_curves[s]])
    start = None if point_fit["kind"] != "power_law" else \
        (point_fit["E"], math.log(point_fit["A_c0"]), point_fit["alpha"])
    seeds, losses, comp = _arm(arm_losses, arm_compute)
    x_loss, x_comp = np.array([losses[s] for s in seeds]), np.array([comp[s] for s in seeds])
    rng = np.random.default_rng(seed)
    cache: dict[tuple, dict] = {}
    out = np.empty(n_boot)
    for b in range(n_boot):
        key = tuple(sorted(rng.integers(0, len(ref_seeds), len(ref_seeds)).tolist()))
        if key not in cache:
            C = np.concatenate([pts[ref_seeds[i]][0] for i in key])
            L = np.concatenate([pts[ref_seeds[i]][1] for i in key])
            cache[key] = _fit(C, L, start)
        j = rng.integers(0, len(seeds), len(seeds))
        out[b] = _log_ceg(cache[key], float(x_loss[j].mean()), float(x_comp[j].mean()))
    return out


def boot_tail(level: float, n_seeds: Sequence[int]) -> float:
    """The tail share of the expanded percentile interval (module docstring): Phi(-sqrt(n/(n-1)) t_{q, n-1}),
    q = (1 + level) / 2, n the fewest seeds among the resampled sources with >= 2; (1 - level) / 2 without one."""
    from scipy import stats

    ns = [n for n in n_seeds if n >= 2]
    if not ns:
        return (1 - level) / 2
    n = min(ns)
    return float(stats.norm.sf(math.sqrt(n / (n - 1)) * stats.t.ppf((1 + level) / 2, n - 1)))


def compute_equivalent_gain(ref_curves: dict[int, list[tuple[float, float]]], arm_losses: dict[int, float],
                            arm_compute: float | dict[int, float], level: float = LEVEL, n_boot: int = 2000,
                            seed: int = 0, expand: bool = True) -> dict:
    """CEG = C_ref(mean arm loss) / C_arm with its percentile bootstrap interval (module docstring).

    ``ref_curves``: {seed: [(C FLOPs, loss), ...]} of the reference's cooldown branches; ``arm_losses``:
    {seed: final loss}; ``arm_compute``: the arm's training FLOPs, one number or per seed (then averaged
    over the seeds used). Returns {ceg, log10_ceg, low, high, low_bound, high_bound, low_direction,
    high_direction, status, bound, direction, outside_share, outside_above, outside_below, n_boot, level,
    arm_loss, arm_compute, c_ref, n_ref_seeds, n_arm_seeds, note, tail, fit}; ``tail``: the share of replicates
    cut off on each side (:func:`boot_tail`; (1 - level) / 2 with ``expand=False``). ``ceg`` None when status is
    not "ok";
    low / high None when that end of the interval is outside the measured range, with ``<side>_bound`` the CEG
    it passes and ``<side>_direction`` ">" (above c_max / C_arm) or "<" (below c_min / C_arm)."""
    fit = fit_compute_curve([p for pts in ref_curves.values() for p in pts])
    seeds, losses, comp = _arm(arm_losses, arm_compute)
    loss = sum(losses.values()) / len(seeds)
    c_arm = sum(comp.values()) / len(seeds)
    c_ref = compute_for_loss(fit, loss)
    hi_bound, lo_bound = fit["c_max"] / c_arm, fit["c_min"] / c_arm
    res = {"ceg": None, "log10_ceg": None, "low": None, "high": None, "low_bound": None, "high_bound": None,
           "low_direction": None, "high_direction": None, "status": "ok", "bound": None, "direction": None,
           "level": level, "arm_loss": loss, "arm_compute": c_arm, "c_ref": c_ref,
           "n_ref_seeds": len(ref_curves), "n_arm_seeds": len(seeds), "note": "", "fit": fit}
    if c_ref is not None:
        res.update(ceg=c_ref / c_arm, log10_ceg=math.log10(c_ref / c_arm))
    elif loss < fit["l_min"]:
        res.update(status=ABOVE, bound=hi_bound, direction=">")
    else:
        res.update(status=BELOW, bound=lo_bound, direction="<")
    res["note"] = "; ".join(f"one {who} seed: the interval leaves out the {what}'s seed-to-seed error"
                            for who, what, k in (("reference", "reference curve", len(ref_curves)),
                                                 ("arm", "arm", len(seeds))) if k < 2)
    reps = np.sort(ceg_replicates(ref_curves, arm_losses, arm_compute, n_boot, seed, point_fit=fit))
    n = len(reps)
    res["n_boot"] = n
    if n == 0:
        return {**res, "outside_share": None, "outside_above": None, "outside_below": None}
    above, below = int(np.sum(reps == math.inf)), int(np.sum(reps == -math.inf))
    res.update(outside_share=(above + below) / n, outside_above=above / n, outside_below=below / n)
    tail = boot_tail(level, [len(ref_curves), len(seeds)]) if expand else (1 - level) / 2
    res["tail"] = tail
    ends = reps[int(math.floor(tail * (n - 1)))], reps[int(math.ceil((1 - tail) * (n - 1)))]
    for side, v in zip(("low", "high"), ends):
        if math.isfinite(v):
            res[side] = math.exp(v)
        else:  # that end is outside the measured range: the bound it passes
            res[f"{side}_bound"], res[f"{side}_direction"] = (hi_bound, ">") if v > 0 else (lo_bound, "<")
    return res


# --------------------------------------------------------------------------------------------
# 2. paired difference and equivalence tests
# --------------------------------------------------------------------------------------------


def _ratio(num: float, se: float) -> float:
    """num / se with se = 0 read as a certainty: +-inf, or 0 when num is 0 too."""
    if se > 0:
        return num / se
    return 0.0 if num == 0 else math.copysign(math.inf, num)


def holm(pvalues: Sequence[Optional[float]], alpha: float = ALPHA) -> list[dict]:
    """Holm-Bonferroni step-down over the family, in the input order: [{p, p_adj, reject, rank, threshold}].
    None entries are not counted in k, are never rejected and get p_adj, rank and threshold None."""
    idx = sorted((i for i, p in enumerate(pvalues) if p is not None), key=lambda i: pvalues[i])
    k = len(idx)
    out = [{"p": p, "p_adj": None, "reject": False, "rank": None, "threshold": None} for p in pvalues]
    running, rejecting = 0.0, True
    for r, i in enumerate(idx, start=1):
        p = float(pvalues[i])
        threshold = alpha / (k - r + 1)
        rejecting = rejecting and p <= threshold
        running = max(running, min(1.0, (k - r + 1) * p))
        out[i].update(p_adj=running, reject=rejecting, rank=r, threshold=threshold)
    return out


def tost_power(n: int, sd: float, margin: tuple[float, float], mean: float = 0.0, alpha: float = ALPHA) -> float:
    """Approximate power of TOST with n seeds (module docstring: normal mean, t critical value)."""
    from scipy import stats

    if n < 2:
        return 0.0
    m_lo, m_hi = margin
    se = sd / math.sqrt(n)
    c = float(stats.t.ppf(1 - alpha, n - 1))
    lo, hi = m_lo + c * se, m_hi - c * se
    if hi <= lo:
        return 0.0
    if se == 0:
        return 1.0 if lo < mean < hi else 0.0
    return max(0.0, float(stats.norm.cdf((hi - mean) / se) - stats.norm.cdf((lo - mean) / se)))


def seeds_needed(sd: float, margin: tuple[float, float], mean: float = 0.0, alpha: float = ALPHA,
                 power: float = 0.8, n_max: int = 10**7) -> Optional[int]:
    """Smallest number of seeds n >= 2 for which TOST concludes equivalence within ``margin`` with the given
    power when the true mean difference is ``mean`` and the per-seed sd is ``sd``; None when ``mean`` is
    not strictly inside the margin (never concluded) or n would exceed ``n_max``."""
    m_lo, m_hi = margin
    if not (m_lo < mean < m_hi) or not (sd >= 0 and math.isfinite(sd)):
        return None
    if tost_power(2, sd, margin, mean, alpha) >= power:
        return 2
    lo, hi = 2, 4
    while tost_power(hi, sd, margin, mean, alpha) < power:
        lo, hi = hi, hi * 2
        if hi > n_max:
            return None
    while hi - lo > 1:  # power(lo) < target <= power(hi)
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if tost_power(mid, sd, margin, mean, alpha) >= power else (mid, hi)
    return hi


# --------------------------------------------------------------------------------------------
# 3. sampling error of the validation set
# --------------------------------------------------------------------------------------------


def _bootstrap_means(x: np.ndarray, n_boot: int, seed: int, chunk: int = 2_000_000) -> np.ndarray:
    """Means of ``n_boot`` resamples of x with replacement, in chunks of about ``chunk`` draws."""
    rng = np.random.default_rng(seed)
    n = len(x)
    rows = max(1, chunk // n)
    out = []
    for start in range(0, n_boot, rows):
        m = min(rows, n_boot - start)
        out.append(x[rng.integers(0, n, (m, n))].mean(axis=1))
    return np.concatenate(out) if out else np.empty(0)


def _summary(x: np.ndarray, level: float, n_boot: int, seed: int) -> dict:
    x = x[np.isfinite(x)]
    n = len(x)
    if n == 0:
        return {"mean": None, "low": None, "high": None, "half_width": None, "se": None, "n": 0}
    means = _bootstrap_means(x, n_boot, seed)
    tail = 100 * (1 - level) / 2
    lo, hi = (float(v) for v in np.percentile(means, [tail, 100 - tail]))
    return {"mean": float(x.mean()), "low": lo, "high": hi, "half_width": (hi - lo) / 2,
            "se": float(means.std(ddof=1)) if len(means) > 1 else None, "n": n}


def bootstrap_mean_interval(per_item_losses: Sequence[float], level: float = LEVEL, n_boot: int = 2000,
                            seed: int = 0) -> dict:
    """Percentile bootstrap interval of the mean loss over validation items (windows):
    {mean, low, high, half_width, se (sd of the bootstrap means), n}."""
    return _summary(np.asarray(per_item_losses, dtype=float), level, n_boot, seed)


def paired_bootstrap_difference(a_items: Sequence[float], b_items: Sequence[float], level: float = LEVEL,
                                n_boot: int = 2000, seed: int = 0) -> dict:
    """Percentile bootstrap interval of mean(a - b) over the same validation items (windows) evaluated by
    two models, the items resampled jointly: {mean, low, high, half_width, se, n}."""
    a, b = np.asarray(a_items, dtype=float), np.asarray(b_items, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"paired_bootstrap_difference: {len(a)} and {len(b)} items; pairs need the same windows")
    return _summary(a - b, level, n_boot, seed)
