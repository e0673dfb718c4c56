"""The compute-equivalent gain (CEG) of each arm and the classification of every comparison.

Spec keys (``tools.experiment``)::

    ceg:
      fractions: [0.25, 0.5, 1.0, 2.0]   # cooldown branches at these shares of the budget (>= 4)
      seeds: [0, 1, 2]                   # one WSD trunk per seed (default: the spec's seeds)
      decay_fraction: 0.2                # share of each branch's steps that decays
      shape: sqrt                        # 1 - sqrt (default) | linear
      arms_schedule: wsd                 # wsd (default): every arm trains the curve's WSD schedule | recipe
    margin: {ceg: [0.9, 1.1]}            # equivalence margin: CEG in [0.9, 1.1] (default), or {nats: 0.02}

The reference arm (at its tuned lr) trains one WSD trunk per seed with cooldown branches ending at
each fraction of the budget (``tools.sweep``'s cooldown machinery, under ``<out>/ceg/``): its loss
as a function of training compute, L_ref(C), measured at >= 4 points per seed. Fractions above 1
matter: an arm better than the reference reaches a loss the reference only reaches with more
compute than the budget, so the curve must be measured beyond it. ``analysis.fair`` fits
L_ref(C) = E + A C^-alpha and inverts it at each arm's mean final loss: CEG = C_ref(L_arm) / C_arm
(> 1: the change is worth that multiple of the reference's compute), with a 95% bootstrap interval
that resamples the reference's seeds (whole trunks, refitted) and the arm's seeds. A loss outside
the measured range of the curve is reported as a bound, never extrapolated.

Each arm's paired (same-seed) loss difference against the reference is tested both ways: a
paired t-test of "no difference" and two one-sided tests (TOST) of equivalence within the margin.
A CEG margin [0.9, 1.1] is turned into nats at the budget on the fitted curve
(``analysis.fair.loss_margin_from_ceg``); without a curve the margin is +-0.02 nats (or
``margin: {nats: m}``). The report's family of comparisons (every arm against the reference; with
``verdicts: pairs``, every arm that names a ``compare:`` arm against that arm, e.g. AdamW/Muon pairs; with
``verdicts: parent``, every arm against the arm it extends, a ladder's steps; a side arm only against its
``compare:`` arm, if it names one) is
corrected with Holm's step-down method, separately for the difference and the equivalence tests;
each comparison is "better", "worse", "equivalent within the margin" or "unresolved". An arm tested
against another arm than the reference (a ladder's step against its parent, a pair) also gets its CEG
against that arm on the reference's curve (``analysis.fair.relative_ceg``: CEG_arm / CEG_other with a
paired bootstrap), which needs no curve of the other arm.

With ``arms_schedule: wsd`` (the default) every arm's tuning and seeded runs train the curve's own
schedule (WSD: warmup, constant lr, the last ``decay_fraction`` of the steps decaying with
``shape``), so that the curve is the reference arm's own loss against compute: a cooldown branch at
1x the budget is a seeded run of the reference. Measured on attention-kv, the recipes' cosine
schedule (to 0.1 x lr) lands 13% of compute below the WSD (1 - sqrt) branches (CEG 0.87 [0.77, 0.96]
of the reference against its own curve), a bias every arm's CEG would carry. ``recipe`` keeps the
recipes' schedules. Either way the reference's own seeded runs are converted too: their CEG should
include 1; it is reported as the calibration check of the method.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from archlab.config import RecipeError
from tools import sweep

KEYS = ("fractions", "seeds", "decay_fraction", "shape", "arms_schedule")
MARGIN_KEYS = ("ceg", "nats")
FOLDER = "ceg"
DEFAULT_MARGIN = {"ceg": [0.9, 1.1]}
DEFAULT_NATS = 0.02


def check(value, seeds: Sequence[int], where: str = "ceg") -> Optional[dict]:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise RecipeError(f"{where}={value!r}: expected a mapping such as {{fractions: [0.25, 0.5, 1.0, 2.0]}}")
    unknown = sorted(set(value) - set(KEYS))
    if unknown:
        raise RecipeError(f"{where}: unknown keys {unknown}; valid: {', '.join(KEYS)}")
    out = {"fractions": [0.25, 0.5, 1.0, 2.0], "seeds": list(seeds), "decay_fraction": 0.2, "shape": "sqrt",
           "arms_schedule": "wsd", **value}
    if out["arms_schedule"] not in ("wsd", "recipe"):
        raise RecipeError(f"{where}.arms_schedule={out['arms_schedule']!r}: wsd (every arm trains the curve's "
                          "schedule) or recipe (the recipes' own schedules)")
    try:
        fractions = sorted({float(f) for f in out["fractions"]})
    except (TypeError, ValueError):
        raise RecipeError(f"{where}.fractions={out['fractions']!r}: a list of positive numbers") from None
    if len(fractions) < 4 or fractions[0] <= 0:
        raise RecipeError(f"{where}.fractions={fractions}: needs >= 4 distinct positive shares of the budget (a "
                          "power law has 3 parameters; the 4th point is what tests it)")
    s = out["seeds"]
    if not isinstance(s, list) or not s or not all(isinstance(x, int) and x >= 0 for x in s):
        raise RecipeError(f"{where}.seeds={s!r}: a list of integers >= 0")
    out["fractions"] = fractions
    sweep.cooldown_spec({"tokens": [1.0], "decay_fraction": out["decay_fraction"], "shape": out["shape"]})
    return out


def check_margin(value, where: str = "margin") -> dict:
    if value is None:
        return dict(DEFAULT_MARGIN)
    if not isinstance(value, dict) or len(value) != 1 or next(iter(value)) not in MARGIN_KEYS:
        raise RecipeError(f"{where}={value!r}: give one of {{ceg: [0.9, 1.1]}} or {{nats: 0.02}}")
    kind, v = next(iter(value.items()))
    if kind == "ceg":
        ok = isinstance(v, (list, tuple)) and len(v) == 2 and 0 < float(v[0]) < 1 < float(v[1])
        if not ok:
            raise RecipeError(f"{where}.ceg={v!r}: [low, high] with 0 < low < 1 < high, e.g. [0.9, 1.1]")
        return {"ceg": [float(v[0]), float(v[1])]}
    if not float(v) > 0:
        raise RecipeError(f"{where}.nats={v!r}: a positive number of nats")
    return {"nats": float(v)}


def arms_schedule(spec: dict) -> list[str]:
    """The overrides that give every arm the curve's schedule (``arms_schedule: wsd``), else none."""
    c = spec.get("ceg")
    if not c or c["arms_schedule"] != "wsd":
        return []
    return ["train.schedule=wsd", f"train.decay_fraction={c['decay_fraction']:g}", f"train.decay_shape={c['shape']}"]


def ladder_name(arm: str, seed: int) -> str:
    return sweep._safe(f"{arm}-seed{seed}")


def sweep_spec(spec: dict, arm, lr_set: Sequence[str]) -> dict:
    """One trunk per seed (a ladder each) with a branch at each fraction of the arm's budget."""
    c = spec["ceg"]
    kind, value = next(iter(arm.budget.items()))
    warmup = [f"train.warmup_steps={seeded_warmup(arm)}"]  # the seeded runs' warmup, not a shorter one
    own = [o for o in arm.overrides if o.split("=", 1)[0].strip() not in sweep.COOLDOWN_OWNED]  # the sweep's
    ladders = {ladder_name(arm.name, s): {"recipe": arm.recipe, "set": [*own, *lr_set, *warmup, f"train.seed={s}"]}
               for s in c["seeds"]}
    cooldown = {kind: [float(f"{float(value) * f:.6g}") for f in c["fractions"]], "decay_fraction": c["decay_fraction"],
                "shape": c["shape"]}
    return {"out": str(Path(spec["out"]) / FOLDER), "ladders": ladders, "cooldown": cooldown,
            "description": f"compute curve of {arm.name} ({spec['name']})"}


def seeded_warmup(arm) -> int:
    """The warmup steps of the arm's seeded runs (``tools.sweep``: the recipe's, at most a tenth of the run)."""
    ladder = {"recipe": arm.recipe, "set": arm.overrides, **{k: [float(v)] for k, v in arm.budget.items()}}
    pt = sweep.plan_points({"out": "/nonexistent", "ladders": {arm.name: ladder}})
    launch = dict(o.split("=", 1) for o in pt[0].extra["launch_overrides"])
    return int(launch.get("train.warmup_steps") or next(o.split("=", 1)[1] for o in reversed(arm.overrides)
                                                         if o.startswith("train.warmup_steps=")))


def records(sspec: dict, points: Sequence[sweep.Point], arm: str, seeds: Sequence[int]) -> list[dict]:
    owner = {ladder_name(arm, s): s for s in seeds}
    return [{"arm": arm, "seed": owner[p.ladder], "cell": {}, "role": "ceg-" + p.role, "point": p.name,
             "sweep": FOLDER, "run_dir": p.run_dir, "max_steps": p.max_steps, "planned_tokens": p.planned_tokens,
             "planned_flops": p.planned_flops} for p in points]


def run(spec: dict, arm, lr_set: Sequence[str], *, jobs: int = 1, threads: Optional[int] = None,
        log=print) -> list[dict]:
    sspec = sweep_spec(spec, arm, lr_set)
    points = sweep.run_sweep(sspec, jobs=jobs, threads=threads, log=log)
    left = [p.name for p in points if p.status in ("pending", "running", "interrupted", "failed", "blocked")]
    if left:
        raise sweep.Stopped(f"compute curve: {len(left)} runs not finished ({', '.join(left[:3])}); run the same "
                            "command again to resume them")
    return records(sspec, points, arm.name, spec["ceg"]["seeds"])


def plan(spec: dict, arm, log=print) -> None:
    if not spec.get("ceg"):
        log("compute curve: none (no `ceg:` in the spec: no compute-equivalent gains)")
        return
    c = spec["ceg"]
    log(f"compute curve of {arm.name}: {len(c['seeds'])} WSD trunks (seeds {c['seeds']}), branches at "
        f"{c['fractions']} x the budget (the trunk's lr: the arm's tuned lr, chosen before it trains)")
    try:
        sweep.run_sweep(sweep_spec(spec, arm, []), dry_run=True, log=log)
    except ValueError as e:  # the folder holds the trunks at the tuned lr, which the plan does not know
        log(f"(not listed: {e})")


# --------------------------------------------------------------------------------------------
# the comparisons
# --------------------------------------------------------------------------------------------


def curves(ctx, arm: str) -> dict[int, list[tuple[float, float]]]:
    """{seed: [(training FLOPs, final val loss)]} of the arm's finished cooldown branches."""
    out: dict[int, list] = {}
    for r in ctx.curve_rows:
        if r["arm"] == arm and r["role"] == "ceg-cooldown" and r["status"] == "finished" and r["learned"]:
            out.setdefault(r["seed"], []).append((float(r["training_flops"]), float(r["val_loss"])))
    return {s: sorted(v) for s, v in out.items()}


def compare(ctx) -> dict:
    """Per non-reference arm: paired tests against the reference, CEG, Holm-corrected classification."""
    from analysis import fair

    spec = ctx.spec
    margin_spec = spec.get("margin") or dict(DEFAULT_MARGIN)
    ref = ctx.group(ctx.reference)
    ref_curves = curves(ctx, ctx.reference) if spec.get("ceg") else {}
    fit, curve_note = None, ""
    if ref_curves:
        try:
            fit = fair.fit_compute_curve([p for pts in ref_curves.values() for p in pts])
        except ValueError as e:  # fewer than 2 distinct computes learned: no curve, no CEG
            curve_note = f"no compute curve: {e}"
    budget_c = _compute(ref) if ref is not None else None
    if "ceg" in margin_spec and fit is not None and budget_c:
        lo, hi = fair.loss_margin_from_ceg(fit, budget_c, tuple(margin_spec["ceg"]))
        margin = {"nats": [lo, hi], "from": f"CEG in [{margin_spec['ceg'][0]:g}, {margin_spec['ceg'][1]:g}] at the "
                  "budget, on the fitted reference curve"}
    else:
        m = margin_spec.get("nats", DEFAULT_NATS)
        margin = {"nats": [-m, m], "from": f"+-{m:g} nats" + (" (no compute curve for a CEG margin)"
                                                              if "ceg" in margin_spec else "")}
    mode = spec.get("verdicts", "reference")
    arms, tests, against = [], [], []
    for g in ctx.arm_groups():
        # the family: every arm against the reference, its `compare:` arm (verdicts: pairs) or the arm it extends
        # (verdicts: parent); a side arm (a control, e.g. a time-matched copy) only against its `compare:` arm
        arm = ctx.arms[g.arm]
        if mode == "pairs" or arm.get("side"):
            other_name = arm.get("compare")
        else:
            other_name = arm.get("parent") if mode == "parent" else ctx.reference
        other = ctx.group(other_name) if other_name else None
        if other is None or g.arm == other_name or other.metric != g.metric:
            continue  # (losses of different objectives are not compared)
        seeds = sorted(set(g.losses()) & set(other.losses()))
        if not seeds:
            continue
        arms.append(g.arm)
        against.append(other_name)
        tests.append(fair.paired_tests([g.losses()[s] - other.losses()[s] for s in seeds], tuple(margin["nats"])))
    classes = fair.classify(tests) if tests else []
    holm_diff = fair.holm([t["p_difference"] for t in tests])
    holm_tost = fair.holm([t["p_tost"] for t in tests])
    family = {"pairs": "every arm against its `compare:` arm", "parent": "every step against the arm it extends"
              }.get(mode, "every arm against the reference")
    out = {"margin": margin, "fit": fit, "family": family, "arms": {}, "curve_note": curve_note}
    for arm, other_name, t, cls, hd, ht in zip(arms, against, tests, classes, holm_diff, holm_tost):
        t = {**t, "p_difference_holm": hd["p_adj"], "p_tost_holm": ht["p_adj"], "against": other_name}
        if cls == "unresolved" and t["sd"]:
            t["seeds_needed"] = fair.seeds_needed(t["sd"], tuple(margin["nats"]), mean=t["mean"])
        out["arms"][arm] = {"tests": t, "class": cls}
    for g in ctx.arm_groups():
        if fit is None or not g.losses() or (ref is not None and g.metric != ref.metric):
            continue
        c_arm = _compute(g)
        res = fair.compute_equivalent_gain(ref_curves, g.losses(), c_arm)
        out["arms"].setdefault(g.arm, {})["ceg"] = res
        if g.arm == ctx.reference:
            out["calibration"] = res
    for arm, other_name in zip(arms, against):  # a step against the arm it extends, on the reference's curve
        if fit is None or other_name == ctx.reference:
            continue
        g, other = ctx.group(arm), ctx.group(other_name)
        try:
            out["arms"][arm]["ceg_vs"] = fair.relative_ceg(ref_curves, g.losses(), other.losses(), _compute(g),
                                                           _compute(other))
        except ValueError as e:  # no seed in common: no paired ratio
            out["arms"][arm]["ceg_vs"] = {"ratio": None, "status": str(e)}
    return out


def _compute(g) -> Optional[float]:
    vals = [r["training_flops"] for r in g.runs.values() if r["status"] == "finished" and r["training_flops"]]
    return sum(vals) / len(vals) if vals else None


def fmt_relative_ceg(res: Optional[dict]) -> str:
    """'1.45x [1.30, 1.62]', '1.45x [interval not determined: 12% of replicates off the curve]', or the status."""
    if not res:
        return "-"
    if res.get("ratio") is None:
        return res["status"]
    if res.get("low") is None:
        return f"{res['ratio']:.2f}x [not determined: {res['undefined_share']:.0%} of replicates off the curve]"
    return f"{res['ratio']:.2f}x [{res['low']:.2f}, {res['high']:.2f}]"


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
    return f"{res['ceg']:.2f}x [{ends[0]}, {ends[1]}]"


# --------------------------------------------------------------------------------------------
# report section
# --------------------------------------------------------------------------------------------


def _p(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.3f}" if v >= 1e-3 else f"{v:.1e}"


def section(ctx):
    """Classification table (paired tests, Holm, CEG) and the reference's compute curve."""
    from analysis.experiments import Section, figure_md, table

    comp = ctx.comparison
    m = comp["margin"]
    n = sum(1 for c in comp["arms"].values() if c.get("tests"))
    lines = [f"Family: {comp['family']} ({n} comparison{'' if n == 1 else 's'}), "
             f"Holm-corrected at 5% for the difference tests and, separately, for the equivalence tests (TOST). "
             f"Equivalence margin: [{m['nats'][0]:+.3f}, {m['nats'][1]:+.3f}] nats ({m['from']}). "
             "Verdicts: better / worse (the paired difference is significant after Holm), equivalent within the "
             "margin (TOST significant after Holm), unresolved (neither: the seeds cannot tell)."]
    relative = any(c.get("ceg_vs") for c in comp["arms"].values())
    if relative:
        lines.append("CEG vs the compared arm: CEG of the arm over CEG of the arm it is compared with, both on the "
                     "reference's curve (the factor of reference compute between their losses; equal to the CEG on "
                     "the compared arm's own curve when the curves are parallel in log compute), with a paired "
                     "bootstrap interval (same reference resamples, same seeds).")
    rows = []
    for arm, c in comp["arms"].items():
        t = c.get("tests")
        if not t:
            continue
        ci90 = [t.get("low"), t.get("high")]
        need = str(t["seeds_needed"]) if t.get("seeds_needed") else ""
        rows.append([f"{ctx.arms[arm]['label']} (`{arm}`)", f"`{t.get('against', ctx.reference)}`",
                     f"{t['mean']:+.3f}" if t.get("mean") is not None else "-",
                     "-" if ci90[0] is None else f"[{ci90[0]:+.3f}, {ci90[1]:+.3f}]",
                     _p(t.get("p_difference")), _p(t.get("p_difference_holm")), _p(t.get("p_tost")),
                     _p(t.get("p_tost_holm")),
                     fmt_ceg(c.get("ceg")), *([fmt_relative_ceg(c.get("ceg_vs"))] if relative else []),
                     f"**{c['class']}**", need])
    md = "\n\n".join(lines) + "\n\n" + table(
        ["arm", "against", "paired difference (nats)", "90% CI (TOST)", "p (difference)", "Holm", "p (equivalence)",
         "Holm", f"CEG on `{ctx.reference}`'s curve [95% CI]",
         *(["CEG vs the compared arm [95% CI]"] if relative else []), "verdict", "seeds for TOST (if unresolved)"],
        rows)
    fit = comp.get("fit")
    figures: list = []
    if fit:
        cal = comp.get("calibration") or {}
        md += (f"\n\n**Compute curve of `{ctx.reference}`** (WSD trunks with cooldown branches at "
               f"{ctx.spec['ceg']['fractions']} x the budget, seeds {ctx.spec['ceg']['seeds']}): "
               f"{_fit_text(fit)}. Calibration: the reference's own seeded runs ("
               + ("the curve's WSD schedule" if ctx.spec["ceg"]["arms_schedule"] == "wsd" else "its recipe's schedule")
               + ") convert to "
               f"CEG {fmt_ceg(cal)}; an interval that includes 1 says the curve and the seeded runs agree.")
        md += figure_md(figures, plot(ctx, fit, ctx.out / "compute_curve.png"),
                        "reference loss against training compute, with each arm's loss")
    return Section("Compute-equivalent gain and verdicts", md, figures, comp)


def _fit_text(fit: dict) -> str:
    if fit.get("kind") == "power_law":
        return (f"L(C) = {fit['E']:.3f} + A (C / {fit['c0']:.3g})^-{fit['alpha']:.3f}, fitted on "
                f"{fit.get('n_points', '?')} points from {fit['c_min']:.3g} to {fit['c_max']:.3g} FLOPs, rms residual "
                f"{fit.get('rms', float('nan')):.4f} nats")
    return (f"a local fit (log-linear interpolation between the measured points, from {fit['c_min']:.3g} to "
            f"{fit['c_max']:.3g} FLOPs)")


FEW_ARMS = 6  # more arms than this at one compute: their legend moves to the CEG panel's y axis


def plot(ctx, fit: dict, path: Path):
    """Left: the reference's curve with each arm's loss at its compute (dotted: across to the reference
    compute with that loss, the CEG). Right: each arm's CEG with its 95% interval on a log axis (a
    forest), which stays readable when many arms share one compute."""
    import numpy as np

    from analysis import fair
    from analysis.plotting import COLORS, plain_log_axis, pyplot, save_figure, style_axes, wrap_label

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
    ax.plot(cs, [fair.loss_at(fit, c) for c in cs], "-", color=COLORS[0], label="fitted L(C)")
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
        c_ref = fair.compute_for_loss(fit, g.loss["mean"])
        if c_ref is not None and g.arm != ctx.reference:  # the CEG: the compute the reference needs for this loss
            ax.plot([c, c_ref], [g.loss["mean"]] * 2, ":", color=color, lw=1.2)
        rows.append((g, color, (ctx.comparison.get("arms", {}).get(g.arm) or {}).get("ceg")
                     or (ctx.comparison.get("calibration") if g.arm == ctx.reference else None)))
    ax.set_xscale("log")
    style_axes(ax, f"{ctx.spec['name']}: loss against training compute\n(dotted: to the reference's compute, the CEG)",
               "training compute (FLOPs, log scale)", "final validation loss (nats/token)", legend=False, grid="both")
    ax.legend(loc="upper right", fontsize=8)  # the curve falls from upper left to lower right
    for y, (g, color, res) in enumerate(rows):
        if not res or res.get("ceg") is None:
            bx.text(1.0, y, f" {res['status'] if res else 'no CEG'}", va="center", fontsize=8, color="grey")
            continue
        lo = res.get("low") if res.get("low") is not None else res.get("low_bound")
        hi = res.get("high") if res.get("high") is not None else res.get("high_bound")
        xerr = [[res["ceg"] - lo if lo is not None else 0.0], [hi - res["ceg"] if hi is not None else 0.0]]
        bx.errorbar([res["ceg"]], [y], xerr=xerr, fmt="D", color=color, capsize=3)
        for end, missing, marker in ((lo, res.get("low") is None, "<"), (hi, res.get("high") is None, ">")):
            if end is not None and missing:  # an interval open on this side: its bound, with an arrow
                bx.plot([end], [y], marker, color=color)
    bx.axvline(1.0, color="grey", ls="--", lw=1)
    bx.set_yticks(range(len(rows)), [wrap_label(g.label, 38) for g, _, _ in rows], fontsize=8)
    bx.set_ylim(len(rows) - 0.5, -0.5)
    bx.set_xscale("log")
    plain_log_axis(bx.xaxis)
    style_axes(bx, f"compute-equivalent gain on {ctx.reference}'s curve\n(95% intervals; > 1: the arm is worth more "
               "reference compute)", "CEG (x reference compute, log scale; dashed: 1, as the reference)", "arm",
               legend=False, grid="both")
    fig.tight_layout()
    return save_figure(fig, path)
