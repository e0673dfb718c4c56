"""``stability: {}``: over the spec's ``grid`` (rows: its first key, columns: its second), per arm and cell the
final validation loss, mean with its 95% t-interval over the seeds that finished, and each seed's outcome: learned,
did not learn (the loss stayed at the unigram entropy) or diverged; under each arm but the reference, the paired
difference against the reference cell by cell, its verdict and interval from one inference per cell
(``analysis.verdicts.family``, Holm over the arm's cells); and the heat map of the grid. No settings; nothing to
compute beyond the run folders.

A seed that did not learn finished: its final loss (near the unigram entropy) is a measured failure and counts as
it is, in the cell's mean and in the pairs. A seed that diverged has no final model to read: the cell's mean leaves
it out (it is over the seeds that finished) and counts it in bold; in the pairs it counts at the unigram entropy of
its training split, what learning nothing scores (the heat map caps its colours there too), so that a divergence
weighs against its arm instead of dropping out of the comparison. A run that has not ended counts nowhere.
The method: docs/methods/stability-grid.md.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from analysis import verdicts
from analysis.experiments import (
    COST_HEADER,
    LEVEL,
    Context,
    Group,
    Section,
    _finite,
    cell_tag,
    cost_cells,
    figure_md,
    mean_unigram,
    table,
)
from analysis.measurements.base import Measurement, register
from analysis.plotting import pyplot, save_figure, style_axes, wrap_label


@register
class Stability(Measurement):
    """Which settings of the grid diverge or fail to learn, and where an arm differs from the reference."""

    name = "stability"
    title = "Stability over the learning-rate x warmup grid"

    def section(self, ctx: Context) -> Section:
        grid = ctx.spec.grid or {}
        keys = list(grid)
        if not keys:
            return Section("Stability", "(the spec has no grid)")
        row_key, col_key = keys[0], (keys[1] if len(keys) > 1 else None)
        arms = list(ctx.arms)
        margin = verdicts.margins(None, None, ctx.spec.margin.to_dict())  # no compute curve over a grid: nats
        paired = {arm: paired_cells(ctx, arm, row_key, col_key, margin) for arm in arms if arm != ctx.reference}
        data, md = [], [_loss_text()] + ([paired_text(ctx, margin)] if paired else []) + [""]
        for arm in arms:
            header = [f"{_short(row_key)} \\ {_short(col_key)}" if col_key else _short(row_key)]
            cols = [str(v) for v in grid[col_key]] if col_key else [""]
            header += [f"{_short(col_key)}={c}" if col_key else "final val loss" for c in cols]
            rows = []
            for rv in grid[row_key]:
                cells = [str(rv)]
                for cv in cols:
                    g = _group_at(ctx, arm, _cell(row_key, rv, col_key, cv))
                    if g is None:
                        cells.append("-")
                        continue
                    outcomes = [_outcome(r) for r in g.runs.values()]
                    data.append({"arm": arm, "cell": g.cell, "loss": g.loss, "level": LEVEL, "outcomes": outcomes,
                                 "seeds": {s: r["val_loss"] for s, r in sorted(g.runs.items())},
                                 "paired": paired.get(arm, {}).get(cell_tag(g.cell))})
                    cells.append(cell_text(g, outcomes))
                rows.append(cells)
            md += [f"**{ctx.arms[arm].label}** (`{arm}`): final validation loss, mean [95% t-interval] over the seeds "
                   "that finished (each seed's in parentheses); runs that diverged or did not learn are counted in "
                   "bold.", "", table(header, rows), ""]
            if arm in paired:
                md += [paired_table(ctx, arm, paired[arm]), ""]
        figures: list[str] = []
        embed = figure_md(figures, plot_stability(ctx, arms, row_key, col_key, ctx.out / "stability.png"),
                          "stability grid")
        md += [embed.strip()] if embed else []
        cost_rows = [[f"{g.label} (`{g.arm}`)", *cost_cells(g)] for g in ctx.groups.values()
                     if g.cell == ctx.groups[next(iter(ctx.groups))].cell]
        md += ["", "Costs (the same in every cell of the grid; tokens/s and peak RSS of the first cell):", "",
               table(["arm", *COST_HEADER], cost_rows)]
        out = {"cells": data, "paired": {"against": ctx.reference, "alpha": verdicts.ALPHA,
                                         "family": "each arm's cells against the reference's same cells",
                                         "margin": {"nats": list(margin[verdicts.NATS]), "from": margin["from"]}}}
        return Section(self.title, "\n".join(md), figures, out)


def _short(key: str) -> str:
    return key.split(".")[-1]


def _cell(row_key: str, rv, col_key: Optional[str], cv) -> dict:
    return {row_key: str(rv), **({col_key: cv} if col_key else {})}


def _outcome(r: dict) -> str:
    if r["status"] == "diverged":
        return "diverged"
    if r["status"] != "finished":
        return r["status"]
    return "learned" if r["learned"] else "did not learn"


def _group_at(ctx: Context, arm: str, cell: dict) -> Optional[Group]:
    for g in ctx.groups.values():
        if g.arm == arm and all(str(g.cell.get(k)) == str(v) for k, v in cell.items()):
            return g
    return None


# --------------------------------------------------------------------------------------------
# a cell's losses
# --------------------------------------------------------------------------------------------


def _loss_text() -> str:
    return ("Per cell, the mean final validation loss with its 95% t-interval over the seeds that finished "
            "(mean +- t_{0.975, n-1} sd / sqrt(n); none with fewer than 2), then each seed's loss. A seed that did "
            "not learn finished at a loss near the unigram entropy: it counts as it is. A seed that diverged is left "
            "out of the mean and counted in bold.")


def cell_text(g: Group, outcomes: list[str]) -> str:
    """'5.16 [5.09, 5.23] (5.13, 5.18, 5.17) **1 did not learn**'; with one seed finished '..., 1 seed finished:
    no interval'; '-' when nothing finished and nothing failed."""
    loss = g.loss
    seeds = ", ".join(f"{v:.2f}" for _, v in sorted(g.losses().items()) if _finite(v))
    n = loss.get("n") or 0
    if n >= 2:
        text = f"{loss['mean']:.2f} [{loss['low']:.2f}, {loss['high']:.2f}] ({seeds})"
    elif n == 1:
        text = f"{loss['mean']:.2f} (1 seed finished: no interval)"
    else:
        text = "no seed finished" if g.runs else ""
    bad = [o for o in outcomes if o != "learned"]
    if bad:
        counts = ", ".join(f"{bad.count(o)} {o}" for o in sorted(set(bad)))
        text += (" " if text else "") + "**" + counts + "**"
    return text or "-"


def paired_losses(g: Group, unigram: Optional[float]) -> tuple[dict[int, float], list[int]]:
    """({seed: the loss it pairs with}, the seeds that diverged and count at the unigram entropy): finished seeds
    at their final loss, diverged ones at their training split's unigram entropy (``unigram`` when the run does
    not record it; left out when neither is known), unfinished ones left out (module docstring)."""
    out, imputed = {}, []
    for s, r in sorted(g.runs.items()):
        if r["status"] == "finished" and _finite(r["val_loss"]):
            out[s] = float(r["val_loss"])
        elif r["status"] == "diverged":
            u = r.get("unigram_entropy") if _finite(r.get("unigram_entropy")) else unigram
            if _finite(u):
                out[s] = float(u)
                imputed.append(s)
    return out, imputed


# --------------------------------------------------------------------------------------------
# the paired differences against the reference
# --------------------------------------------------------------------------------------------


def paired_cells(ctx: Context, arm: str, row_key: str, col_key: Optional[str], margin: dict) -> dict[str, dict]:
    """{cell tag: the verdict of arm - reference in that cell} over every cell where both arms have a seed in
    common: one inference per cell (``analysis.verdicts.family`` on the paired loss differences, nats), Holm over
    the arm's cells. Each result also names the seeds that diverged and count at the unigram entropy."""
    unigram = mean_unigram(ctx)
    grid = ctx.spec.grid
    comparisons, notes = [], []
    for rv in grid[row_key]:
        for cv in ([str(v) for v in grid[col_key]] if col_key else [""]):
            cell = _cell(row_key, rv, col_key, cv)
            g, ref = _group_at(ctx, arm, cell), _group_at(ctx, ctx.reference, cell)
            if g is None or ref is None:
                continue
            (mine, mine_div), (theirs, their_div) = paired_losses(g, unigram), paired_losses(ref, unigram)
            common = set(mine) & set(theirs)
            if not common:
                continue
            comparisons.append({"arm": arm, "against": ctx.reference, "arm_losses": mine, "other_losses": theirs,
                                "arm_compute": {}, "other_compute": {}})  # no compute: the losses alone
            notes.append((cell_tag(g.cell), sorted(s for s in mine_div if s in common),
                          sorted(s for s in their_div if s in common)))
    results = verdicts.family(None, {}, comparisons, margin) if comparisons else []
    out = {}
    for (tag, mine_div, their_div), r in zip(notes, results):
        r.update(cell=tag, diverged_at_unigram={"arm": mine_div, "against": their_div})
        out[tag] = r
    return out


def paired_text(ctx: Context, margin: dict) -> str:
    return (f"\nUnder each arm but the reference (`{ctx.reference}`), its paired difference from the reference cell by "
            "cell: per seed s, the arm's final loss minus the reference's in the same cell with the same seed (same "
            "initial weights and data order), so the seed-to-seed variance the arms share cancels. One inference per "
            "cell (`analysis/verdicts.py`, the one the headline verdicts use): the t-test of no difference and TOST "
            f"within the margin [{margin[verdicts.NATS][0]:+.3f}, {margin[verdicts.NATS][1]:+.3f}] nats "
            f"({margin['from']}), Holm over the arm's cells at 5%, separately for the two tests. Each "
            "interval is at the level its verdict is read at, 1 - 0.05 p / p_Holm (at least 95%, printed beside "
            "it), so it excludes 0 exactly when the verdict is better or worse; with n paired seeds the t has n - 1 "
            "degrees of freedom (2 with 3 seeds). Below 0: the arm's loss is lower (better). A seed that did not "
            "learn counts at its final loss; a seed that diverged counts at the unigram entropy of its training "
            "split (learning nothing; the table says where); a run that has not ended is left out of its pair. "
            "Method: docs/methods/stability-grid.md.")


def paired_table(ctx: Context, arm: str, results: dict[str, dict]) -> str:
    rows = []
    for tag, r in results.items():
        div = r["diverged_at_unigram"]
        notes = [f"{who} seed {s} diverged: at the unigram entropy" for who, key in ((f"`{arm}`", "arm"),
                                                                                   (f"`{ctx.reference}`", "against"))
                 for s in div[key]]
        if len(r["seeds"]) < 2:
            notes.append("fewer than 2 paired seeds: no interval, no test")
        if r.get("seeds_needed"):
            need = str(r["seeds_needed"])
        else:
            need = "" if r["class"] != "unresolved" else ("-" if r.get("sd") is None else "> 1000")
        rows.append([tag, str(len(r["seeds"])), verdicts.fmt_interval(r), _p(r.get("p_difference")),
                     _p(r.get("p_difference_holm")), _p(r.get("p_tost")), _p(r.get("p_tost_holm")),
                     f"**{r['class']}**", need, "; ".join(notes)])
    tested = sum(r.get("p_difference") is not None for r in results.values())
    return (f"Paired difference `{arm}` - `{ctx.reference}` per cell (nats/token; below 0: `{arm}` is better; Holm "
            f"over the {tested} cells with at least 2 paired seeds):\n\n"
            + table(["cell", "seeds", "estimate [interval at the verdict's level]", "p (difference)", "Holm",
                     "p (equivalence)", "Holm", "verdict (Holm over the arm's cells)", "seeds to resolve (if "
                     "unresolved)", "notes"], rows))


def _p(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.3f}" if v >= 1e-3 else f"{v:.1e}"


# --------------------------------------------------------------------------------------------
# the heat map
# --------------------------------------------------------------------------------------------


def plot_stability(ctx: Context, arms: list[str], row_key: str, col_key: Optional[str], path):
    grid = ctx.spec.grid
    rows = [str(v) for v in grid[row_key]]
    cols = [str(v) for v in grid[col_key]] if col_key else [""]
    unigram = mean_unigram(ctx) or 8.0
    plt = pyplot()
    fig, axes = plt.subplots(1, len(arms), figsize=(3.6 * len(arms) + 1.5, 0.55 * len(rows) + 2.2), squeeze=False)
    fig.subplots_adjust(wspace=0.35)
    vals = [g.loss["mean"] for g in ctx.groups.values() if g.loss.get("mean") is not None]
    vmin = min(vals) if vals else 0.0
    if unigram <= vmin:  # nothing learned beyond unigram statistics: scale to the losses themselves
        unigram = max(vals, default=vmin) + 1e-3
    image = None
    for k, (ax, arm) in enumerate(zip(axes[0], arms)):
        M = np.full((len(rows), len(cols)), np.nan)
        for i, rv in enumerate(rows):
            for j, cv in enumerate(cols):
                g = _group_at(ctx, arm, _cell(row_key, rv, col_key, cv))
                if g is None:
                    continue
                outcomes = [_outcome(r) for r in g.runs.values()]
                mean = g.loss.get("mean")
                if mean is not None:
                    M[i, j] = min(mean, unigram)
                label = "div" if "diverged" in outcomes else ("no\nlearn" if "did not learn" in outcomes else "")
                text = f"{mean:.2f}" if mean is not None else ""
                # viridis is dark at the low end (low loss) and bright at the high end: white text on the dark half
                dark = mean is not None and min(mean, unigram) < (vmin + unigram) / 2
                ax.text(j, i, text + ("\n" + label if label else ""), ha="center", va="center", fontsize=7,
                        color="white" if dark else "black")
        image = ax.imshow(M, cmap="viridis", vmin=vmin, vmax=unigram, aspect="auto")
        ax.set_xticks(range(len(cols)), cols)
        ax.set_yticks(range(len(rows)), rows)
        style_axes(ax, wrap_label(ctx.arms[arm].label, 34), col_key or "", row_key if k == 0 else "", legend=False)
        ax.grid(False)
    if image is not None:
        cbar = fig.colorbar(image, ax=axes[0].tolist(), shrink=0.9)
        cbar.set_label("final val loss (nats/token)")
    # centred over the panels, not over the figure (the colour bar takes the right edge)
    centre = (axes[0][0].get_position().x0 + axes[0][-1].get_position().x1) / 2
    fig.suptitle("Final validation loss per setting, mean over seeds; colours capped at the unigram entropy\n"
                 "(div: a seed diverged; no learn: a seed stayed at the unigram loss)", fontsize=10, x=centre,
                 y=1.0 + 0.4 / (0.55 * len(rows) + 2.2))
    return save_figure(fig, path)
