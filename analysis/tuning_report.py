"""The tuning section of an experiment's report: per arm the lr grid, the lr its seeded runs trained at, the
whole-grid fit (``analysis.lr_choice``) with its interval on the optimal lr, and the loss-against-lr figure. The
runs behind it are ``tools.experiment.stages.tuning``'s."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

from analysis import lr_choice
from analysis.experiments import Section, figure_md, table
from analysis.plotting import COLORS, pyplot, save_figure, style_axes, wrap_label
from analysis.runs import LEARN_MARGIN


def section(ctx):
    """The tuning table (per arm: grid, chosen lr, bracketed, cost) and the loss-vs-lr plot."""
    tuning = ctx.record.get("tuning") or {}
    tune = ctx.spec.tune
    if tune is not None and not tune.searched:
        return Section("Learning rate", f"Every arm trains at its recipe's lr, by design: {tune.shared}")
    if not tuning:
        return Section("Learning rate", "Not tuned: every arm trains at its recipe's lr (the spec has no `tune:`).")
    walls = ctx.record.get("tune_wall_s") or {}  # tuning run -> its wall seconds
    noise = seed_sd(ctx)
    rows = []
    for arm, t in tuning.items():
        where = "bracketed" if t["bracketed"] else "at the edge of the grid, extension limit hit"
        if not t.get("learned", True):
            where = "no lr of the grid learned (extension limit hit on the low side; the lowest loss chosen)"
        dnl = t.get("did_not_learn") or [False] * len(t["lrs"])
        losses = ", ".join("diverged" if d else f"{v:.3f} (did not learn)" if n else f"{v:.3f}" if v is not None
                           else "-" for v, d, n in zip(t["losses"], t["diverged"], dnl))
        if t.get("transferred_from"):
            where += f"; muP transfer from `{t['transferred_from']}`"
        fit = refit(t, noise)
        rows.append([f"{ctx.arms[arm].label} (`{arm}`)", ", ".join(f"{lr:g}" for lr in t["lrs"]), losses,
                     f"{t.get('grid_lr', t['lr']):g}", f"**{t['lr']:g}**", _fit_text(fit), where, len(t["runs"]),
                     f"{sum(walls.get(r, 0.0) for r in t['runs']) / 60:.1f}"])
    seeded = sum(r["elapsed_s"] for r in ctx.rows if r["elapsed_s"])
    runs = {r for t in tuning.values() for r in t["runs"]}  # under muP every arm shares the base's runs
    tuned_s = sum(walls.get(r, 0.0) for r in runs)
    share = ("the arm's full budget" if tune.budget_fraction == 1
             else f"{tune.budget_fraction:g} x the arm's budget")
    md = (f"Each arm's lr is chosen on its own (`tools/experiment/stages/tuning.py`): a log grid at {share}, one "
          f"run per lr at seed {tune.seed} (not one of the "
          "reported seeds); a run that diverged or did not learn (final loss not "
          f"{LEARN_MARGIN} nats below the unigram entropy) counts as worst, and when no lr learned the grid extends "
          "downwards (when it may not, the lowest loss of the runs that did not diverge is chosen); "
          "the grid extends by its own ratio until the best lr is interior. The chosen lr is the lr the seeded "
          "runs trained at. 'Whole-grid fit': the minimum of a weighted least-squares asymmetric parabola in log lr "
          "(its own curvature each side of the optimum) through every finite point of the grid, kept inside the "
          "bracket (`analysis/lr_choice.py`; the grid's best when not bracketed or the points do not curve "
          f"upwards), with an {100 * lr_choice.LEVEL:.0f}% interval on the optimal lr (the fit's profile, its "
          "cut-off from a parametric bootstrap of the grid; open on a side the grid does not bound) and the fitted "
          "loss at its ends above the fit's minimum; the points weighted by "
          + (f"the pooled sd of the seeded runs ({noise:.4f} nats; the residuals' where they reject it)"
             if noise else "the fit's residuals (no seeded runs to give a seed sd)")
          + ". Runs tuned by the earlier rule (a parabola through the best point and its neighbours) trained at "
          "that rule's lr; the fit beside it is the current rule's, for later runs.\n\n"
          + table(["arm", "lrs tried", "final val loss at each lr (nats/token)", "grid's best", "chosen lr",
                   f"whole-grid fit: lr, {100 * lr_choice.LEVEL:.0f}% interval", "where", "runs", "wall min"], rows)
          + f"\n\nTuning cost: {len(runs)} runs, {tuned_s / 60:.1f} min of training "
          f"wall time (the seeded runs: {len(ctx.rows)} runs, {seeded / 60:.1f} min; tuning is "
          f"{tuned_s / max(seeded, 1e-9):.2f}x their cost).")
    figures: list = []
    md += figure_md(figures, plot(ctx, tuning, ctx.out / "tuning.png"), "final validation loss against lr per arm")
    return Section("Learning rate, tuned per arm", md, figures, {"tuning": tuning, "wall_s": walls})


def seed_sd(ctx) -> Optional[float]:
    """The pooled sd of the seeded runs' final losses within arms (the noise one tuning run carries)."""
    ss, df = 0.0, 0
    for g in ctx.arm_groups():
        vals = [v for v in g.losses().values() if v is not None and math.isfinite(v)]
        if len(vals) > 1:
            m = sum(vals) / len(vals)
            ss += sum((v - m) ** 2 for v in vals)
            df += len(vals) - 1
    return math.sqrt(ss / df) if df else None


def refit(t: dict, noise_sd: Optional[float]) -> dict:
    """The tuning grid's lr choice (``analysis.lr_choice``: the whole-grid fit and its interval), the
    diverged and not-learned runs left out."""
    dnl = t.get("did_not_learn") or [False] * len(t["lrs"])
    losses = [None if d or n else v for v, d, n in zip(t["losses"], t["diverged"], dnl)]
    return lr_choice.choose(t["lrs"], losses, noise_sd)


def _fit_text(fit: dict) -> str:
    """'0.0059; 0.0041 .. 0.0083 (80%; +0.010 / +0.012 nats at the ends)', or the reason there is no fit."""
    if fit.get("low") is None:
        return f"- ({fit['reason']})"
    if fit.get("cost_low") is None:
        return f"{lr_choice.interval_text(fit)}: {fit['reason']}"
    return f"{fit['lr']:.2g}; {lr_choice.interval_text(fit)}"


def plot_key(stars: int, unstarred: list[str]) -> str:
    """What the tuning plot marks: a star per arm with a learned best run, a dashed line per chosen lr."""
    parts = ["star: the grid's best run"] if stars else []
    if unstarred:
        parts.append(f"no star for {', '.join(unstarred)}: no lr learned")
    return "; ".join(parts + ["dashed: the chosen lr"])


def plot(ctx, tuning: dict, path: Path):
    from matplotlib.ticker import NullFormatter

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    finite, chosen, tried, stars, unstarred = [], [], set(), 0, []
    for i, (arm, t) in enumerate(tuning.items()):
        pts = [(lr, v) for lr, v in zip(t["lrs"], t["losses"]) if v is not None]
        if not pts:
            continue
        finite += [v for _, v in pts]
        tried |= set(t["lrs"])
        color = COLORS[i % len(COLORS)]
        # past the palette's length colours repeat: the marker and line style tell those arms apart
        style = ["o-", "s--", "^:"][(i // len(COLORS)) % 3]
        ax.plot(*zip(*pts), style, color=color,
                label=wrap_label(f"{ctx.arms[arm].label} (chosen {t['lr']:g})", 50))
        if t["loss"] is not None:
            chosen.append(t["loss"])
            best = t.get("grid_lr", t["lr"])  # the grid's best run; the chosen lr may lie between grid points
            ax.plot([best], [t["loss"]], "*", color=color, markersize=14, markeredgecolor="black", zorder=5)
            stars += 1
        else:
            unstarred.append(arm)
        ax.axvline(t["lr"], color=color, ls="--", lw=1.2)  # the chosen lr, on or between the grid's points
        for lr, d in zip(t["lrs"], t["diverged"]):
            if d:
                ax.axvline(lr, color=color, ls=":", lw=1)
    if not finite:
        plt.close(fig)
        return None
    ax.set_xscale("log")
    ax.set_xticks(sorted(tried), [f"{lr:g}" for lr in sorted(tried)])  # the lrs tried, no crowded minor labels
    ax.xaxis.set_minor_formatter(NullFormatter())
    lo, hi = min(finite), sorted(finite)[-1]
    # the interesting range: the minima (every chosen one), not a run far off at an edge of the grid
    top = min(hi, max(lo + 4 * (sorted(finite)[len(finite) // 2] - lo) + 0.05, max(chosen, default=lo) + 0.1))
    ax.set_ylim(lo - 0.02 * max(top - lo, 0.05), top + 0.02 * max(top - lo, 0.05))
    style_axes(ax, f"{ctx.spec.name}: tuning runs, final validation loss against peak lr\n"
               f"({plot_key(stars, unstarred)})",
               "peak learning rate (log scale)", "final validation loss (nats/token)", grid="both",
               legend_outside=True)
    return save_figure(fig, path)
