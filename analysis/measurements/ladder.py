"""``ladder: {}``: each step of the ladder (every arm that is not ``side: true``) against the arm
it extends, paired by seed, with what the step changes in the costs (parameters, FLOPs per token,
tokens/s, KV-cache bytes); and the waterfall plot of the steps. No settings; nothing to compute
beyond the run folders.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from analysis.experiments import Context, Group, Section, errbar, figure_md, fmt_ci, fmt_count, table
from analysis.measurements.base import Measurement, register
from analysis.plotting import COLORS, pyplot, save_figure, style_axes


@register
class Ladder(Measurement):
    """Each arm against the one it extends, and the waterfall."""

    name = "ladder"
    title = "Ladder: one change at a time"

    def section(self, ctx: Context) -> Section:
        steps = [g for g in ctx.arm_groups() if not ctx.arms[g.arm]["side"]]
        rows, data = [], []
        for g in steps:
            parent = ctx.group(ctx.arms[g.arm]["parent"]) if ctx.arms[g.arm]["parent"] else None
            entry = {"arm": g.arm, "parent": parent.arm if parent else None, "loss": g.loss, "step": g.vs_parent,
                     "vs_reference": g.vs_reference}
            if parent is None:
                rows.append([g.label, "-", fmt_ci(g.loss), "-", "-", "-", "-", "-", "-"])
            else:
                c, pc = g.costs, parent.costs
                entry["cost_change"] = {k: c[k] - pc[k] for k in ("params_total", "params_active", "flops_per_token",
                                                                  "kv_bytes_per_token")}
                speed, pspeed = g.speed(), parent.speed()
                entry["cost_change"]["tokens_per_s_ratio"] = speed / pspeed if speed and pspeed else None
                rows.append([g.label, " ".join(f"`{o}`" for o in ctx.arms[g.arm]["own"]), fmt_ci(g.loss),
                             fmt_ci(g.vs_parent, signed=True), fmt_ci(g.vs_reference, signed=True),
                             _delta(c["params_total"], pc["params_total"], True) + " / "
                             + _delta(c["params_active"], pc["params_active"], True),
                             _delta(c["flops_per_token"], pc["flops_per_token"], True),
                             f"x{speed / pspeed:.2f}" if speed and pspeed else "-",
                             _delta(c["kv_bytes_per_token"], pc["kv_bytes_per_token"]) + " B"])
            data.append(entry)
        md = table(["step", "change", "final val loss", "step change (paired, vs previous)", "vs reference (paired)",
                    "params total / active change", "FLOPs/token change", "tokens/s ratio", "KV bytes/token change"],
                   rows)
        figures: list[str] = []
        md += figure_md(figures, plot_waterfall(ctx, steps, ctx.out / "waterfall.png"), "waterfall of the ladder")
        md += ("\n\nEach step is paired by seed with the step before it: a negative change is an improvement. An "
               "interval that contains 0 means the step's effect is not resolved by these seeds at this budget.")
        return Section(self.title, md, figures, {"steps": data})


def _delta(a: Optional[float], b: Optional[float], count: bool = False) -> str:
    if a is None or b is None:
        return "-"
    d = a - b
    if count:
        return ("+" if d >= 0 else "-") + fmt_count(abs(d)) if d else "0"
    return f"{d:+.3g}"


def _waterfall_bars(ctx: Context, steps: list[Group]) -> list[dict]:
    """Per step: its start (the parent's mean), end (its own mean), the paired interval, or a start marker."""
    bars = []
    for i, g in enumerate(steps):
        mean = g.loss.get("mean")
        d = g.vs_parent
        if mean is None:
            bars.append({"i": i, "kind": "missing"})
        elif i == 0 or d is None or d.get("mean") is None:
            bars.append({"i": i, "kind": "start", "start": mean, "end": mean, "low": mean, "high": mean})
        else:
            start = ctx.group(ctx.arms[g.arm]["parent"]).loss["mean"]
            end = start + d["mean"]
            err = errbar(d)
            bars.append({"i": i, "kind": "step", "start": start, "end": end, "err": err, "delta": d["mean"],
                         "low": min(start, end, end - err[0][0] if err else end),
                         "high": max(start, end, end + err[1][0] if err else end)})
    return bars


def _draw_waterfall(ax, bars: list[dict], labels: list[str], ylim: Optional[tuple] = None) -> None:
    seen: set[str] = set()

    def once(label: str) -> Optional[str]:
        if label in seen:
            return None
        seen.add(label)
        return label

    shown = [b for b in bars if b["kind"] != "missing"]
    lo = min(b["low"] for b in shown) if ylim is None else ylim[0]
    hi = max(b["high"] for b in shown) if ylim is None else ylim[1]
    span = hi - lo or 0.1
    for b in shown:
        i = b["i"]
        if b["kind"] == "start":
            ax.plot([i - 0.3, i + 0.3], [b["end"], b["end"]], color="0.2", lw=2.5, label=once("start: mean loss"))
        else:
            better = b["delta"] < 0
            ax.bar(i, b["end"] - b["start"], bottom=b["start"], width=0.6, color=COLORS[2] if better else COLORS[3],
                   alpha=0.8, label=once("step lowers the loss" if better else "step raises the loss"))
            if b["err"]:
                ax.errorbar([i], [b["end"]], yerr=b["err"], color="0.15", capsize=4, lw=1.2,
                            label=once("paired 95% interval of the step"))
            if lo - 0.1 * span <= b["high"] <= hi + 0.1 * span:
                ax.text(i, b["high"] + 0.02 * span, f"{b['delta']:+.3f}", ha="center", va="bottom", fontsize=8)
        if i + 1 < len(labels):
            ax.plot([i + 0.3, i + 0.7], [b["end"], b["end"]], color="0.5", lw=0.8, ls=":")
    ax.set_ylim(lo - 0.12 * span, hi + 0.15 * span)
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right")


def plot_waterfall(ctx: Context, steps: list[Group], path) -> Optional[object]:
    """Floating bars from each step's parent mean to its own mean, with the paired 95% interval.
    When one step dwarfs the others (more than 5x the median size), a second panel zooms on the
    steps after it."""
    bars = _waterfall_bars(ctx, steps)
    if not steps or bars[0]["kind"] == "missing":
        return None
    labels = [g.label for g in steps]
    sizes = [abs(b["delta"]) for b in bars if b["kind"] == "step"]
    big = max(range(len(bars)), key=lambda k: abs(bars[k].get("delta", 0.0)))
    zoom = len(sizes) > 2 and abs(bars[big]["delta"]) > 5 * float(np.median(sizes)) and big + 1 < len(bars)
    plt = pyplot()
    width = max(7.0, 0.85 * len(steps) + 2)
    fig, axes = plt.subplots(2 if zoom else 1, 1, figsize=(width, 9.0 if zoom else 5.2), squeeze=False,
                             sharex=True)
    ax = axes[0][0]
    _draw_waterfall(ax, bars, labels)
    title = f"{ctx.spec['name']}: final validation loss, one change per step (bars: mean change)"
    xlabel = "step (each adds one change to the previous)"
    style_axes(ax, title, "" if zoom else xlabel, "final validation loss (nats/token)")
    if zoom:
        after = [b for b in bars[big:] if b["kind"] != "missing"]
        ylim = (min(min(b["low"] for b in after[1:]), after[0]["end"]), max(max(b["high"] for b in after[1:]),
                                                                             after[0]["end"]))
        _draw_waterfall(axes[1][0], bars, labels, ylim=ylim)
        style_axes(axes[1][0], f"zoom on the steps after '{labels[big]}'", xlabel, "final validation loss (nats/token)",
                   legend=False)
        ax.tick_params(axis="x", labelbottom=False)
        fig.subplots_adjust(hspace=0.12)
    return save_figure(fig, path)
