"""The CEG section of an experiment's report: each arm's compute-equivalent gain against the reference's
compute curve, the family's verdicts (``analysis.verdicts``) and the CEG figure. The runs behind it are
``tools.experiment.stages.ceg``'s; the method is described there and in docs/experiments/README.md."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Optional

import numpy as np

from analysis import compute_curve, eval_error, sequential, verdicts
from analysis.experiments import Section, figure_md, table
from analysis.plotting import COLORS, plain_log_axis, pyplot, save_figure, style_axes, wrap_label


def curves(ctx, arm: str) -> dict[int, list[tuple[float, float]]]:
    """{seed: [(training FLOPs, final val loss)]} of the arm's finished cooldown branches."""
    out: dict[int, list] = {}
    for r in ctx.curve_rows:
        if r["arm"] == arm and r["role"] == "ceg-cooldown" and r["status"] == "finished" and r["learned"]:
            out.setdefault(r["seed"], []).append((float(r["training_flops"]), float(r["val_loss"])))
    return {s: sorted(v) for s, v in out.items()}


def compare(ctx) -> dict:
    """Per non-reference arm: the family's verdicts (``analysis.verdicts``: one paired inference per comparison,
    Holm over the family) and every arm's paired CEG against the reference."""
    spec = ctx.spec
    ref = ctx.group(ctx.reference)
    ref_curves = curves(ctx, ctx.reference) if spec.ceg else {}
    fit, curve_note = None, ""
    if ref_curves:
        try:
            fit = compute_curve.fit_compute_curve([p for pts in ref_curves.values() for p in pts])
        except ValueError as e:  # fewer than 2 distinct computes learned: no curve, no CEG
            curve_note = f"no compute curve: {e}"
    budget_c = _compute(ref) if ref is not None else None
    margin = verdicts.margins(fit, budget_c, spec.margin.to_dict())
    mode = spec.verdicts
    pairs = []
    for g in ctx.arm_groups():
        # the family: every arm against the reference, its `compare:` arm (verdicts: pairs) or the arm it extends
        # (verdicts: parent); a side arm (a control, e.g. a time-matched copy) only against its `compare:` arm
        arm = ctx.arms[g.arm]
        if mode == "pairs" or arm.side:
            other_name = arm.compare
        else:
            other_name = arm.parent if mode == "parent" else ctx.reference
        other = ctx.group(other_name) if other_name else None
        if other is None or g.arm == other_name or other.metric != g.metric:
            continue  # (losses of different objectives are not compared)
        if not set(g.losses()) & set(other.losses()):
            continue
        pairs.append(_pair(g, other))
    if spec.sequential and pairs:  # seeds: {min, max}: each comparison read at the look that stopped it
        results = sequential.family(spec.sequential, fit, ref_curves, pairs, margin)
    else:
        results = verdicts.family(fit, ref_curves, pairs, margin) if pairs else []
    family = {"pairs": "every arm against its `compare:` arm", "parent": "every step against the arm it extends"
              }.get(mode, "every arm against the reference")
    out = {"margin": {"nats": list(margin[verdicts.NATS]), "ln_ceg": margin[verdicts.LN_CEG], "from": margin["from"]},
           "fit": fit, "family": family, "arms": {}, "curve_note": curve_note, "method": "paired"}
    for r in results:
        out["arms"][r["arm"]] = {"verdict": r, "class": r["class"]}
    if fit is not None and ref is not None:  # every arm's CEG against the reference (descriptive at 95%)
        for g in ctx.arm_groups():
            if g.arm == ctx.reference or g.metric != ref.metric or not set(g.losses()) & set(ref.losses()):
                continue
            mine = out["arms"].get(g.arm, {}).get("verdict")
            res = mine if mine and mine["against"] == ctx.reference else \
                verdicts.family(fit, ref_curves, [_pair(g, ref)], margin)[0]
            out["arms"].setdefault(g.arm, {})["ceg"] = _ceg_view(res, holm=res is mine)
        out["calibration"] = verdicts.calibration(fit, ref.losses(), _computes(ref))
    return out


def _pair(g, other) -> dict:
    return {"arm": g.arm, "against": other.arm, "arm_losses": g.losses(), "other_losses": other.losses(),
            "arm_compute": _computes(g), "other_compute": _computes(other)}


def _computes(g) -> dict[int, float]:
    """{seed: training FLOPs} of the group's finished runs (the mean for a run without the count)."""
    mean = _compute(g)
    return {s: float(r["training_flops"] or mean) for s, r in g.runs.items() if r["status"] == "finished"}


def _ceg_view(r: dict, holm: bool) -> dict:
    """The CEG of a paired result in the form the plots read: {ceg, low, high, status, level, scale, holm}."""
    level = None if r.get("alpha_interval") is None else 1 - r["alpha_interval"]
    if r["scale"] == "ln CEG":
        return {"ceg": r["ceg"], "low": r["ceg_low"], "high": r["ceg_high"], "status": "ok", "level": level,
                "scale": r["scale"], "holm": holm}
    return {"ceg": None, "low": None, "high": None, "status": r["why_nats"], "level": level, "scale": r["scale"],
            "holm": holm, "point": r.get("ceg_point")}


def _compute(g) -> Optional[float]:
    vals = [r["training_flops"] for r in g.runs.values() if r["status"] == "finished" and r["training_flops"]]
    return sum(vals) / len(vals) if vals else None


def fmt_ceg(res: Optional[dict]) -> str:
    """'1.23x [1.05, 1.41]', an interval end beyond the measured range as '>2.00' / '<0.25', or the
    status with its bound when the point estimate itself lies outside the curve."""
    if not res:
        return "-"
    if res.get("ceg") is None:
        return f"{res['status']} ({res['direction']}{res['bound']:.2f}x)" if res.get("bound") else res["status"]
    ends = []
    for side in ("low", "high"):
        if res.get(side) is not None:
            ends.append(f"{res[side]:.2f}")
        elif res.get(f"{side}_bound") is not None:
            ends.append(f"{res[f'{side}_direction']}{res[f'{side}_bound']:.2f}")
        else:
            ends.append("?")
    level = f" at {100 * res['level']:.1f}%" if res.get("level") else ""
    return f"{res['ceg']:.2f}x [{ends[0]}, {ends[1]}]{level}"


# --------------------------------------------------------------------------------------------
# report section
# --------------------------------------------------------------------------------------------


def _p(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.3f}" if v >= 1e-3 else f"{v:.1e}"


def section(ctx, val_summary: Optional[dict] = None):
    """The verdict table (one paired inference per comparison, Holm), each verdict's evaluation-set error
    against its seed error (``analysis.eval_error``; ``val_summary``: a report.json's ``val_sampling`` section,
    where no per-window losses are at hand) and the reference's compute curve."""
    comp = ctx.comparison
    m = comp["margin"]
    rows_in = [c["verdict"] for c in comp["arms"].values() if c.get("verdict")]
    n = len(rows_in)
    ln_margin = m.get("ln_ceg")
    margin_text = (f"CEG in [{math.exp(ln_margin[0]):.3f}, {math.exp(ln_margin[1]):.3f}] on the ln CEG scale, "
                   if ln_margin else "") + f"[{m['nats'][0]:+.3f}, {m['nats'][1]:+.3f}] nats ({m['from']})"
    lines = [f"Family: {comp['family']} ({n} comparison{'' if n == 1 else 's'}). One inference per comparison "
             "(`analysis/verdicts.py`): per seed s, the arm's seed s against the compared arm's seed s, both read "
             "through the reference's fitted curve: ln CEG_s = ln[C_ref(L_arm,s) / C_arm] - ln[C_ref(L_other,s) / "
             "C_other]; the mean over seeds with a t-interval whose variance adds the curve's refit variance "
             "(jackknife over the reference's trunks; Welch-Satterthwaite df). Where a seed's loss lies outside "
             "the curve, there is no curve, or the arms' compute differs, the same on the paired loss difference "
             "(nats). Holm over the family at 5%, separately for the difference tests and the equivalence tests "
             f"(TOST, margin {margin_text}). Each interval is at the level its verdict is read at, 1 - 0.05 p / "
             "p_Holm (95% for the comparison with the largest Holm multiplier's complement, higher for the others), "
             "so it excludes 1 (or 0 nats) exactly when the verdict is better or worse. Verdicts: better / worse, "
             "equivalent within the margin, unresolved (with the seeds that would resolve it at 80% power if the "
             "observed mean and sd are the truth)."]
    design = ctx.spec.sequential
    if design:
        lines.append(f"Seeds: {design.describe()}, stated in the spec before the first run "
                     "(`analysis/sequential.py`). At each look the comparisons still unresolved are read with Holm "
                     "at that look's level; a verdict reached is final and its arms stop when all their comparisons "
                     "are resolved. The per-look levels sum to 5%, so each error rate stays at most 5% over the "
                     "looks; the intervals below are at the level of the look that stopped each comparison.")
    rows = []
    for r in rows_in:
        arm = r["arm"]
        need = str(r["seeds_needed"]) if r.get("seeds_needed") else ("" if r["class"] != "unresolved" else "> 1000")
        eq = ("-" if r.get("equivalence_low") is None else
              _scaled(r, r["equivalence_low"]) + " .. " + _scaled(r, r["equivalence_high"]))
        rows.append([f"{ctx.arms[arm].label} (`{arm}`)", f"`{r['against']}`", r["scale"]
                     + (f" ({r['why_nats']})" if r["why_nats"] else ""), str(len(r["seeds"])),
                     verdicts.fmt_interval(r), _p(r.get("p_difference")), _p(r.get("p_difference_holm")), eq,
                     _p(r.get("p_tost")), _p(r.get("p_tost_holm")), f"**{r['class']}**", need]
                    + ([r.get("stopped", "")] if design else []))
    md = "\n\n".join(lines) + "\n\n" + table(
        ["arm", "against", "scale", "seeds", "estimate [interval at the verdict's level]", "p (difference)", "Holm",
         "equivalence interval (TOST, Holm level)", "p (equivalence)", "Holm", "verdict",
         "seeds to resolve (if unresolved)"] + (["stopped"] if design else []), rows)
    checks = eval_error.check(ctx, rows_in, val_summary)
    comp["evaluation_error"] = checks
    md += "\n\n" + eval_error.text(checks, lambda a: f"{ctx.arms[a].label} (`{a}`)")
    fit = comp.get("fit")
    figures: list = []
    if fit:
        cal = comp.get("calibration") or {}
        cal_text = "-" if cal.get("ceg") is None else (
            f"{cal['ceg']:.2f}x" + ("" if cal.get("low") is None else f" [{cal['low']:.2f}, {cal['high']:.2f}]"))
        md += (f"\n\n**Compute curve of `{ctx.reference}`** (WSD trunks with cooldown branches at "
               f"{ctx.spec.ceg.fractions} x the budget, seeds {ctx.spec.ceg.seeds}): "
               f"{_fit_text(fit)}. Calibration: the reference's own seeded runs ("
               + ("the curve's WSD schedule" if ctx.spec.ceg.arms_schedule == "wsd" else "its recipe's schedule")
               + f") read through the curve sit at {cal_text} of their compute (95% t-interval over seeds): the "
               "offset every unpaired reading would carry, which the paired CEG divides out.")
        md += figure_md(figures, plot(ctx, fit, ctx.out / "compute_curve.png"),
                        "reference loss against training compute, with each arm's loss")
    return Section("Compute-equivalent gain and verdicts", md, figures, comp)


def _scaled(r: dict, v: float) -> str:
    return f"{math.exp(v):.3f}x" if r["scale"] == "ln CEG" else f"{v:+.3f}"


def _fit_text(fit: dict) -> str:
    if fit.get("kind") == "power_law":
        return (f"L(C) = {fit['E']:.3f} + A (C / {fit['c0']:.3g})^-{fit['alpha']:.3f}, fitted on "
                f"{fit.get('n_points', '?')} points from {fit['c_min']:.3g} to {fit['c_max']:.3g} FLOPs, rms residual "
                f"{fit.get('rms', float('nan')):.4f} nats")
    return (f"a local fit (log-linear interpolation between the measured points, from {fit['c_min']:.3g} to "
            f"{fit['c_max']:.3g} FLOPs)")


FEW_ARMS = 6  # more arms than this at one compute: their legend moves to the CEG panel's y axis


def ceg_limits(values) -> tuple[float, float]:
    """The CEG panel's log x limits: every value and 1 with 8% of the span (at least 5%) to spare on each side, so
    that an arm at 1.00x (the reference's calibration) sits on the dashed line inside the panel, not on its edge."""
    xs = [1.0] + [v for v in values if isinstance(v, (int, float)) and v > 0]
    pad = max(1.05, (max(xs) / min(xs)) ** 0.08)
    return min(xs) / pad, max(xs) * pad


def plot(ctx, fit: dict, path: Path):
    """Left: the reference's curve with each arm's loss at its compute (dotted: across to the reference
    compute with that loss, the CEG). Right: each arm's CEG with its interval (its verdict's level) on a log axis (a
    forest), which stays readable when many arms share one compute."""
    groups = [(i, g) for i, g in enumerate(ctx.arm_groups())
              if _compute(g) is not None and g.loss.get("mean") is not None]
    many = len(groups) > FEW_ARMS
    plt = pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(14, max(5.0, 0.34 * len(groups) + 2.0)),
                                 gridspec_kw={"width_ratios": [1.2, 1.0]})
    for i, (seed, pts) in enumerate(sorted(curves(ctx, ctx.reference).items())):
        ax.plot(*zip(*pts), "o", color=COLORS[0], alpha=0.6, label=f"{ctx.reference}: cooldown branches"
                if i == 0 else None)
    cs = np.geomspace(fit["c_min"], fit["c_max"], 100)
    ax.plot(cs, [compute_curve.loss_at(fit, c) for c in cs], "-", color=COLORS[0], label="fitted L(C)")
    rows = []
    for k, (i, g) in enumerate(groups):
        c = _compute(g)
        err = None if g.loss.get("low") is None else [[g.loss["mean"] - g.loss["low"]],
                                                      [g.loss["high"] - g.loss["mean"]]]
        color = COLORS[(i + 1) % len(COLORS)]
        label = (f"the {len(groups)} arms (seeded runs; named in the right panel)" if k == 0 else None) if many \
            else wrap_label(f"{g.label} (seeded runs)", 45)
        ax.errorbar([c], [g.loss["mean"]], yerr=err, fmt="D", color=color, capsize=3, alpha=0.8 if many else 1,
                    label=label)
        c_ref = compute_curve.compute_for_loss(fit, g.loss["mean"])
        if c_ref is not None and g.arm != ctx.reference:  # the CEG: the compute the reference needs for this loss
            ax.plot([c, c_ref], [g.loss["mean"]] * 2, ":", color=color, lw=1.2)
        rows.append((g, color, (ctx.comparison.get("arms", {}).get(g.arm) or {}).get("ceg")
                     or (ctx.comparison.get("calibration") if g.arm == ctx.reference else None)))
    ax.set_xscale("log")
    style_axes(ax, f"{ctx.spec.name}: loss against training compute\n(dotted: to the reference's compute, the CEG)",
               "training compute (FLOPs, log scale)", "final validation loss (nats/token)", legend=False, grid="both")
    ax.legend(loc="upper right", fontsize=8)  # the curve falls from upper left to lower right
    why = sorted({res["status"] for _, _, res in rows if res and res.get("ceg") is None and res.get("status")})
    for y, (g, color, res) in enumerate(rows):
        if not res or res.get("ceg") is None:  # a short mark per row; the reasons once, below the panel
            bx.text(1.0, y, " no CEG" + (f" ({why.index(res['status']) + 1})" if res and res.get("status") and
                                         len(why) > 1 else ""), va="center", fontsize=8, color="grey")
            continue
        lo = res.get("low") if res.get("low") is not None else res.get("low_bound")
        hi = res.get("high") if res.get("high") is not None else res.get("high_bound")
        xerr = [[res["ceg"] - lo if lo is not None else 0.0], [hi - res["ceg"] if hi is not None else 0.0]]
        bx.errorbar([res["ceg"]], [y], xerr=xerr, fmt="D", color=color, capsize=3)
        for end, missing, marker in ((lo, res.get("low") is None, "<"), (hi, res.get("high") is None, ">")):
            if end is not None and missing:  # an interval open on this side: its bound, with an arrow
                bx.plot([end], [y], marker, color=color)
    bx.axvline(1.0, color="grey", ls="--", lw=1)
    bx.set_xlim(*ceg_limits([v for _, _, res in rows if res for v in (
        res.get("ceg"), res.get("low"), res.get("high"), res.get("low_bound"), res.get("high_bound"))]))
    bx.set_yticks(range(len(rows)), [wrap_label(g.label, 38) for g, _, _ in rows], fontsize=8)
    bx.set_ylim(len(rows) - 0.5, -0.5)
    bx.set_xscale("log")
    plain_log_axis(bx.xaxis)
    style_axes(bx, f"compute-equivalent gain on {ctx.reference}'s curve\n(intervals at each verdict's level, else "
               "95%; > 1: worth more reference compute)",
               "CEG (x reference compute, log scale; dashed: 1, as the reference)", "arm", legend=False, grid="both")
    if why:
        text = "\n".join(textwrap.fill(("no CEG" if len(why) == 1 else f"({k + 1})") + f": {w}", 90)
                         for k, w in enumerate(why))
        fig.text(0.99, 0.01, text, ha="right", va="bottom", fontsize=8, color="0.3")
        fig.tight_layout(rect=(0, (0.3 + 0.16 * (1 + text.count("\n"))) / fig.get_figheight(), 1, 1))
    else:
        fig.tight_layout()
    return save_figure(fig, path)
