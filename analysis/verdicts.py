"""One inference per comparison: the verdict, the CEG and the interval printed beside them come from the same
per-seed paired values, at the level the verdict is read at.

Per common seed s, with the reference's compute curve C_ref(L) (``analysis.compute_curve.fit_compute_curve``):

    x_s = ln[C_ref(L_arm,s) / C_arm,s] - ln[C_ref(L_other,s) / C_other,s]     (scale "ln CEG")

the arm's seed s against the other arm's own run of seed s (the reference's seeded run is its 1x cooldown
branch), both read through the same fitted curve: an offset of the curve from the points cancels. Without a
curve, or when a seed's loss lies outside the curve's measured range (no extrapolation), x_s = L_arm,s -
L_other,s (scale "nats", lower is better) with the margin converted to nats on the curve.

The estimate is mean(x); its variance s^2 / n plus, on the ln CEG scale, the curve's refit variance
(leave-one-reference-seed-out jackknife of mean(x)), with Welch-Satterthwaite degrees of freedom. Tests:
t of "no difference" and TOST of "inside the margin". Holm over the family (separately for the two tests);
each interval is at level 1 - alpha p / p_adj (two-sided), so it excludes 0 exactly when the Holm-adjusted
p does: an interval that excludes CEG 1 cannot stand beside "unresolved". Coverage by simulation:
``analysis.ceg_coverage``.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from analysis import compute_curve, fair, paired_tests

ALPHA = 0.05
POWER = 0.8
LN_CEG, NATS = "ln CEG", "nats"


def seed_values(fit: Optional[dict], arm: dict[int, float], other: dict[int, float],
                arm_compute: dict[int, float], other_compute: dict[int, float],
                names: tuple[str, str] = ("the arm", "the other arm")) -> tuple[str, dict[int, float], str]:
    """(scale, {seed: x_s}, why nats) over the seeds both arms have a finite loss for (module docstring); the
    why names the run that left the curve's range (``names``: the arm's and the other arm's)."""
    seeds = sorted(s for s in set(arm) & set(other) if _finite(arm[s]) and _finite(other[s]))
    nats = {s: arm[s] - other[s] for s in seeds}
    if fit is None:
        return NATS, nats, "no compute curve"
    out = {}
    for s in seeds:
        ca, co = compute_curve.compute_for_loss(fit, arm[s]), compute_curve.compute_for_loss(fit, other[s])
        if ca is None or co is None:
            who, loss = (names[0], arm[s]) if ca is None else (names[1], other[s])
            return NATS, nats, (f"{who}'s seed {s} ({loss:.3f}) lies outside the curve's measured range "
                                f"[{fit['l_min']:.3f}, {fit['l_max']:.3f}]")
        out[s] = math.log(ca / arm_compute[s]) - math.log(co / other_compute[s])
    return LN_CEG, out, ""


def _finite(v) -> bool:
    return v is not None and math.isfinite(v)


def curve_variance(ref_curves: dict[int, list[tuple[float, float]]], arm: dict[int, float],
                   other: dict[int, float], arm_compute: dict[int, float], other_compute: dict[int, float],
                   fit: Optional[dict] = None) -> tuple[float, int]:
    """Jackknife variance of mean(x) over the reference's seeds (each left out, the curve refitted):
    (variance, number of reference curves); (0, m) when m < 2 or a refit leaves the range."""
    m = len(ref_curves)
    if m < 2:
        return 0.0, m
    thetas = []
    for left in ref_curves:
        rest = [p for s, pts in ref_curves.items() if s != left for p in pts]
        refit = compute_curve.fit_compute_curve(rest, start=fit)
        scale, x, _ = seed_values(refit, arm, other, arm_compute, other_compute)
        if scale != LN_CEG or not x:
            return 0.0, m
        thetas.append(sum(x.values()) / len(x))
    t = np.asarray(thetas)
    return float((m - 1) / m * np.sum((t - t.mean()) ** 2)), m


def paired_inference(values: Sequence[float], margin: tuple[float, float], curve_var: float = 0.0,
                     n_curves: int = 0) -> dict:
    """Mean, se (seed and curve parts), Welch-Satterthwaite df, p of "no difference" and of TOST within
    ``margin`` = (lo, hi) on the same scale as ``values``."""
    from scipy import stats

    lo, hi = float(margin[0]), float(margin[1])
    if not lo < hi:
        raise ValueError(f"margin {tuple(margin)!r}: needs low < high")
    x = np.asarray([v for v in values if _finite(v)], dtype=float)
    n = len(x)
    res = {"n": n, "mean": float(x.mean()) if n else None, "sd": None, "se": None, "se_seeds": None,
           "se_curve": math.sqrt(curve_var), "df": None, "t": None, "p_difference": None, "p_tost": None,
           "margin": [lo, hi]}
    if n < 2:
        return res
    sd = 0.0 if x.max() == x.min() else float(x.std(ddof=1))
    a, b = sd * sd / n, float(curve_var)
    se = math.sqrt(a + b)
    if b > 0 and n_curves >= 2:
        df = (a + b) ** 2 / (a * a / (n - 1) + b * b / (n_curves - 1))
    else:
        df = float(n - 1)
    mean = res["mean"]
    t = paired_tests.ratio(mean, se)
    p_lo = float(stats.t.sf(paired_tests.ratio(mean - lo, se), df))
    p_hi = float(stats.t.cdf(paired_tests.ratio(mean - hi, se), df))
    res.update(sd=sd, se=se, se_seeds=math.sqrt(a), df=df, t=t,
               p_difference=float(min(1.0, 2 * stats.t.sf(abs(t), df))), p_tost=max(p_lo, p_hi))
    return res


def interval(res: dict, alpha: float, two_sided: bool = True) -> tuple[Optional[float], Optional[float]]:
    """mean +- t_q se with q = 1 - alpha/2 (two-sided) or 1 - alpha (TOST's 1 - 2 alpha interval)."""
    from scipy import stats

    if res.get("se") is None:
        return None, None
    q = 1 - alpha / 2 if two_sided else 1 - alpha
    half = float(stats.t.ppf(q, res["df"])) * res["se"]
    return res["mean"] - half, res["mean"] + half


def decide(results: list[dict], alpha: float = ALPHA) -> list[dict]:
    """Holm over the family (difference and TOST separately), the verdict, and the intervals at the Holm level
    of each comparison. Each result needs ``scale`` (ln CEG: higher is better; nats: lower is better)."""
    diff = paired_tests.holm([r.get("p_difference") for r in results], alpha)
    equiv = paired_tests.holm([r.get("p_tost") for r in results], alpha)
    out = []
    for r, d, e in zip(results, diff, equiv):
        r = dict(r)
        a_d = _level(alpha, d)
        a_e = _level(alpha, e)
        r.update(p_difference_holm=d["p_adj"], p_tost_holm=e["p_adj"], alpha_interval=a_d, alpha_equivalence=a_e)
        r["low"], r["high"] = interval(r, a_d)
        r["equivalence_low"], r["equivalence_high"] = interval(r, a_e, two_sided=False)
        good = (r["mean"] or 0.0) > 0 if r["scale"] == LN_CEG else (r["mean"] or 0.0) < 0
        if d["reject"]:
            side = "better" if good else "worse"
            r["class"] = f"{side} (within the margin)" if e["reject"] else side
        else:
            r["class"] = "equivalent within the margin" if e["reject"] else "unresolved"
        if r["class"] == "unresolved" and r.get("sd"):
            r["seeds_needed"] = seeds_to_resolve(r["mean"], r["sd"], tuple(r["margin"]), a_d, a_e)
        out.append(r)
    return out


def _level(alpha: float, h: dict) -> Optional[float]:
    """The per-comparison alpha at which an interval excludes the null exactly when Holm rejects it."""
    if h["p"] is None:
        return None
    if h["p_adj"] is None or h["p_adj"] <= 0:
        return alpha
    return alpha * float(h["p"]) / float(h["p_adj"])


def seeds_to_resolve(mean: float, sd: float, margin: tuple[float, float], alpha_d: Optional[float],
                     alpha_e: Optional[float], power: float = POWER, n_max: int = 1000) -> Optional[int]:
    """Fewest seeds with which either test resolves the comparison with ``power`` when the true mean and sd
    are the observed ones (normal mean, t critical value): the difference test if mean != 0, TOST if the
    mean lies inside the margin. None when neither could within ``n_max``."""
    from scipy import stats

    cands = []
    if alpha_e is not None and margin[0] < mean < margin[1]:
        n = paired_tests.seeds_needed(sd, margin, mean=mean, alpha=alpha_e, power=power, n_max=n_max)
        if n is not None:
            cands.append(n)
    if alpha_d is not None and mean != 0 and sd > 0:
        for n in range(2, n_max + 1):
            se = sd / math.sqrt(n)
            if stats.norm.cdf(abs(mean) / se - stats.t.ppf(1 - alpha_d / 2, n - 1)) >= power:
                cands.append(n)
                break
    return min(cands) if cands else None


def calibration(fit: dict, ref: dict[int, float], ref_compute: dict[int, float]) -> dict:
    """The curve against the reference's own seeded runs: ln[C_ref(L_ref,s) / C_s] with a 95% t-interval over
    seeds. The paired CEG divides this offset out; it shows how well the curve passes through the budget."""
    vals = []
    for s, v in sorted(ref.items()):
        c = compute_curve.compute_for_loss(fit, v) if _finite(v) else None
        if c is not None:
            vals.append(math.log(c / ref_compute[s]))
    r = paired_inference(vals, (-1.0, 1.0))
    lo, hi = interval(r, ALPHA)
    return {"ceg": math.exp(r["mean"]) if r["mean"] is not None else None, "n": r["n"],
            "low": math.exp(lo) if lo is not None else None, "high": math.exp(hi) if hi is not None else None}


COMPUTE_TOLERANCE = 0.02  # arms whose mean compute differs by more are compared at another matched resource


def margins(fit: Optional[dict], budget_c: Optional[float], margin_spec: dict) -> dict:
    """The equivalence margin on both scales: {"ln CEG": (lo, hi) or None, "nats": (lo, hi), "from": text}."""
    if "ceg" in margin_spec:
        g_lo, g_hi = margin_spec["ceg"]
        text = f"CEG in [{g_lo:g}, {g_hi:g}]"
        if fit is None or not budget_c:
            m = 0.02
            return {LN_CEG: None, NATS: (-m, m), "from": f"+-{m:g} nats (no compute curve for {text})"}
        return {LN_CEG: (math.log(g_lo), math.log(g_hi)), NATS: fair.loss_margin_from_ceg(fit, budget_c, (g_lo, g_hi)),
                "from": f"{text}; in nats at the budget on the fitted reference curve"}
    m = float(margin_spec["nats"])
    out = {LN_CEG: None, NATS: (-m, m), "from": f"+-{m:g} nats"}
    if fit is not None and budget_c:
        lb = compute_curve.loss_at(fit, budget_c)
        c_worse, c_better = compute_curve.compute_for_loss(fit, lb + m), compute_curve.compute_for_loss(fit, lb - m)
        if c_worse is not None and c_better is not None:
            out[LN_CEG] = (math.log(c_worse / budget_c), math.log(c_better / budget_c))
            out["from"] += (f" at the budget; as CEG [{c_worse / budget_c:.3f}, {c_better / budget_c:.3f}] on "
                            "the fitted reference curve")
    return out


def family(fit: Optional[dict], ref_curves: dict, comparisons: list[dict], margin: dict,
           alpha: float = ALPHA) -> list[dict]:
    """Every comparison of a family from one model each, Holm over the family (module docstring).

    ``comparisons``: [{arm, against, arm_losses, other_losses, arm_compute, other_compute}] (per-seed dicts);
    ``margin``: :func:`margins`. Each result: the :func:`paired_inference` fields, ``scale``, ``why_nats``,
    ``seeds``, ``values`` (per seed), the verdict ``class``, the intervals at the Holm level (``low``, ``high``,
    ``alpha_interval``), ``ceg`` / ``ceg_low`` / ``ceg_high`` (on the ln CEG scale) and ``seeds_needed``."""
    results = []
    for c in comparisons:
        scale, x, why = seed_values(fit, c["arm_losses"], c["other_losses"], c["arm_compute"], c["other_compute"],
                                    (f"`{c['arm']}`", f"`{c['against']}`"))
        seeds = sorted(x)
        ca = [c["arm_compute"].get(s) for s in seeds]
        co = [c["other_compute"].get(s) for s in seeds]
        known = seeds and None not in ca + co and sum(co) > 0  # (no compute counted: the losses alone)
        ratio = sum(ca) / sum(co) if known else 1.0
        if scale == LN_CEG and abs(ratio - 1) > COMPUTE_TOLERANCE:
            scale, why = NATS, (f"the arms' compute differs ({ratio:.2f}x): the verdict compares losses at the "
                                "spec's matched resource, the CEG is per FLOP")
            x_ceg = x
            x = {s: c["arm_losses"][s] - c["other_losses"][s] for s in seeds}
        else:
            x_ceg = x if scale == LN_CEG else None
        if scale == LN_CEG and margin[LN_CEG] is None:
            scale, why = NATS, "the nats margin falls outside the curve's measured range"
            x = {s: c["arm_losses"][s] - c["other_losses"][s] for s in seeds}
        var, m = (curve_variance(ref_curves, c["arm_losses"], c["other_losses"], c["arm_compute"],
                                 c["other_compute"], fit) if scale == LN_CEG else (0.0, len(ref_curves)))
        r = paired_inference([x[s] for s in seeds], margin[scale], var, m)
        r.update(arm=c["arm"], against=c["against"], scale=scale, why_nats=why, seeds=seeds,
                 values={s: x[s] for s in seeds}, compute_ratio=ratio,
                 ceg_point=(math.exp(sum(x_ceg.values()) / len(x_ceg)) if x_ceg else None))
        results.append(r)
    out = decide(results, alpha)
    for r in out:
        if r["scale"] == LN_CEG and r["mean"] is not None:
            r["ceg"] = math.exp(r["mean"])
            r["ceg_low"] = math.exp(r["low"]) if r["low"] is not None else None
            r["ceg_high"] = math.exp(r["high"]) if r["high"] is not None else None
        else:
            r["ceg"], r["ceg_low"], r["ceg_high"] = r["ceg_point"], None, None
    return out


def fmt_interval(r: dict) -> str:
    """'CEG 1.14x [1.02, 1.27] at 98.3%' (ln CEG scale) or '+0.012 nats [-0.030, +0.054] at 97.5%'."""
    level = "" if r.get("alpha_interval") is None else f" at {100 * (1 - r['alpha_interval']):.1f}%"
    if r["mean"] is None:
        return "-"
    if r["scale"] == LN_CEG:
        if r.get("ceg_low") is None:
            return f"{r['ceg']:.2f}x (1 seed)"
        return f"{r['ceg']:.2f}x [{r['ceg_low']:.2f}, {r['ceg_high']:.2f}]{level}"
    if r.get("low") is None:
        return f"{r['mean']:+.3f} nats (1 seed)"
    return f"{r['mean']:+.3f} nats [{r['low']:+.3f}, {r['high']:+.3f}]{level}"
