"""``stability: {}``: over the spec's ``grid`` (rows: its first key, columns: its second), per arm
and cell the final validation loss and each seed's outcome: learned, did not learn (the loss stayed
at the unigram entropy) or diverged; and the heat map of the grid. No settings; nothing to compute
beyond the run folders.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from analysis.experiments import (
    COST_HEADER,
    Context,
    Group,
    Section,
    _finite,
    cost_cells,
    figure_md,
    mean_unigram,
    table,
)
from analysis.measurements.base import Measurement, register
from analysis.plotting import pyplot, save_figure, style_axes, wrap_label


@register
class Stability(Measurement):
    """Which settings of the grid diverge or fail to learn."""

    name = "stability"
    title = "Stability over the learning-rate x warmup grid"

    def section(self, ctx: Context) -> Section:
        grid = ctx.spec.grid or {}
        keys = list(grid)
        if not keys:
            return Section("Stability", "(the spec has no grid)")
        row_key, col_key = keys[0], (keys[1] if len(keys) > 1 else None)
        arms = list(ctx.arms)
        data, md = [], []
        for arm in arms:
            header = [f"{row_key.split('.')[-1]} \\ {col_key.split('.')[-1]}" if col_key else row_key.split(".")[-1]]
            cols = [str(v) for v in grid[col_key]] if col_key else [""]
            header += [f"{col_key.split('.')[-1]}={c}" if col_key else "final val loss" for c in cols]
            rows = []
            for rv in grid[row_key]:
                cells = [str(rv)]
                for cv in cols:
                    cell = {row_key: str(rv), **({col_key: cv} if col_key else {})}
                    g = _group_at(ctx, arm, cell)
                    if g is None:
                        cells.append("-")
                        continue
                    outcomes = [_outcome(r) for r in g.runs.values()]
                    data.append({"arm": arm, "cell": g.cell, "loss": g.loss, "outcomes": outcomes})
                    seeds = [f"{v:.2f}" for _, v in sorted(g.losses().items()) if _finite(v)]
                    text = f"{g.loss['mean']:.2f} ({', '.join(seeds)})" if g.loss.get("mean") is not None else ""
                    bad = [o for o in outcomes if o != "learned"]
                    if bad:
                        counts = ", ".join(f"{bad.count(o)} {o}" for o in sorted(set(bad)))
                        text += (" " if text else "") + "**" + counts + "**"
                    cells.append(text or "-")
                rows.append(cells)
            md += [f"**{ctx.arms[arm].label}** (`{arm}`): final validation loss, mean over seeds (each seed's "
                   "in parentheses); runs that diverged or did not learn are counted in bold.", "",
                   table(header, rows), ""]
        figures: list[str] = []
        embed = figure_md(figures, plot_stability(ctx, arms, row_key, col_key, ctx.out / "stability.png"),
                          "stability grid")
        md += [embed.strip()] if embed else []
        cost_rows = [[f"{g.label} (`{g.arm}`)", *cost_cells(g)] for g in ctx.groups.values()
                     if g.cell == ctx.groups[next(iter(ctx.groups))].cell]
        md += ["", "Costs (the same in every cell of the grid; tokens/s and peak RSS of the first cell):", "",
               table(["arm", *COST_HEADER], cost_rows)]
        return Section(self.title, "\n".join(md), figures, {"cells": data})


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
                g = _group_at(ctx, arm, {row_key: rv, **({col_key: cv} if col_key else {})})
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
