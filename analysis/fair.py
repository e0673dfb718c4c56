"""The compute-equivalent gain (CEG) of an arm over the reference, with its unpaired bootstrap interval, and the
loss margin a CEG margin stands for. Pure functions over plain numbers (numpy, scipy): no run folders, no
plotting; ``tools.experiment.stages.ceg`` reads the runs and calls these.

An arm trained with C_arm FLOPs whose seeds reach the mean loss L_arm is worth

    CEG = C_ref(L_arm) / C_arm,    C_ref = L_ref^-1,

the compute the reference needs for the arm's loss over the compute the arm used: CEG = 1.3 means the
arm matches the reference trained 1.3 times longer. L_ref(C) is the reference's compute curve
(``analysis.compute_curve``: the fit, its local fallback and the inverse that never extrapolates).

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

Also read as ``fair.<name>``, from the modules that hold them: the compute curve (``fit_compute_curve``,
``loss_at``, ``compute_for_loss``), the paired tests' pieces (``analysis.paired_tests``: ``holm``,
``seeds_needed``, ``_ratio``) and the validation-set bootstrap (``analysis.val_bootstrap``).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np
from scipy import stats

from analysis.compute_curve import (
    compute_for_loss,
    curve_points,
    fit_compute_curve,
    fit_curve,
    loss_at,
    power_law_start,
)

__all__ = ["LEVEL", "ABOVE", "BELOW", "loss_margin_from_ceg", "ceg_replicates", "boot_tail", "compute_equivalent_gain"]

LEVEL = 0.95

ABOVE = "above the measured range"
BELOW = "below the measured range"


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
    pts = {s: curve_points(ref_curves[s]) for s in ref_seeds}
    if point_fit is None:
        point_fit = fit_compute_curve([p for s in ref_seeds for p in ref_curves[s]])
    start = power_law_start(point_fit)
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
            cache[key] = fit_curve(C, L, start)
        j = rng.integers(0, len(seeds), len(seeds))
        out[b] = _log_ceg(cache[key], float(x_loss[j].mean()), float(x_comp[j].mean()))
    return out


def boot_tail(level: float, n_seeds: Sequence[int]) -> float:
    """The tail share of the expanded percentile interval (module docstring): Phi(-sqrt(n/(n-1)) t_{q, n-1}),
    q = (1 + level) / 2, n the fewest seeds among the resampled sources with >= 2; (1 - level) / 2 without one."""
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
