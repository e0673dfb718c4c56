"""``ladder: {}``: each step of the ladder (every arm that is not ``side: true``) against the arm
it extends, paired by seed, with what the step changes in the costs (parameters, FLOPs per token,
tokens/s, KV-cache bytes); and the waterfall plot of the steps. No settings; nothing to compute
beyond the run folders.
"""

from __future__ import annotations

import textwrap
from typing import Optional

import numpy as np

from analysis.ceg_report import fmt_ceg
from analysis.experiments import Context, Group, Section, errbar, figure_md, fmt_ci, fmt_count, table
from analysis.measurements.base import Measurement, register
from analysis.plotting import COLORS, pyplot, save_figure, style_axes


@register
class Ladder(Measurement):
    """Each arm against the one it extends, and the waterfall."""

    name = "ladder"
    title = "Ladder: one change at a time"

    def section(self, ctx: Context) -> Section:
        steps = [g for g in ctx.arm_groups() if not ctx.arms[g.arm].side]
        rows, data = [], []
        for g in steps:
            parent = ctx.group(ctx.arms[g.arm].parent) if ctx.arms[g.arm].parent else None
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
                rows.append([g.label, " ".join(f"`{o}`" for o in ctx.arms[g.arm].own), fmt_ci(g.loss),
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
            start = ctx.group(ctx.arms[g.arm].parent).loss["mean"]
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
        if i + 1 < len(labels):
            ax.plot([i + 0.3, i + 0.7], [b["end"], b["end"]], color="0.5", lw=0.8, ls=":")
    ax.set_ylim(lo - 0.12 * span, hi + 0.15 * span)
    ax.set_xticks(range(len(labels)), labels)


def plot_waterfall(ctx: Context, steps: list[Group], path) -> Optional[object]:
    """Left: floating bars from each step's parent mean to its own mean (the ladder as a whole).
    Right: each step's paired change against its parent with its 95% interval, one row per step, on
    an axis scaled to the steps' intervals; a step that dwarfs the others (more than 5x the median
    size) is drawn at the axis edge with an arrow and its value, so the small steps stay readable.
    Where the spec measures CEG, each step's CEG against the reference is written beside its row."""
    bars = _waterfall_bars(ctx, steps)
    if not steps or bars[0]["kind"] == "missing":
        return None
    numbers = [str(i) for i in range(len(steps))]  # the left panel's ticks; the right panel names each step
    labels = [f"{i}. " + textwrap.shorten(g.label, 60, placeholder=" ...") for i, g in enumerate(steps)]
    plt = pyplot()
    height = max(5.2, 0.42 * len(steps) + 2.6)
    fig, (ax, ax_d) = plt.subplots(1, 2, figsize=(15.0, height), gridspec_kw={"width_ratios": [0.8, 1.0]})
    _draw_waterfall(ax, bars, numbers)
    style_axes(ax, "Final validation loss, one change per step\n(bars: mean change; whiskers: paired 95% CI)",
               "step (numbered as on the right)", "final validation loss (nats/token)")
    _draw_step_effects(ctx, ax_d, bars, labels, [g.arm for g in steps])
    fig.suptitle(f"{ctx.spec.name}: the ladder", fontsize=12)
    fig.tight_layout()
    return save_figure(fig, path)


def _draw_step_effects(ctx: Context, ax, bars: list[dict], labels: list[str], arms: list[str]) -> None:
    """Forest plot of the steps' paired changes (rows top to bottom in ladder order)."""
    rows = [b for b in bars if b["kind"] == "step"]
    if not rows:
        ax.set_axis_off()
        return
    sizes = [abs(b["delta"]) for b in rows]
    med = float(np.median(sizes))
    big = {b["i"] for b in rows if len(rows) > 2 and abs(b["delta"]) > 5 * med}
    inner = [b for b in rows if b["i"] not in big] or rows
    ends = []
    for b in inner:
        lo_e, hi_e = (b["err"][0][0], b["err"][1][0]) if b["err"] else (0.0, 0.0)
        ends += [b["delta"] - lo_e, b["delta"] + hi_e]
    lim = max(abs(min(ends)), abs(max(ends)), 1e-3) * 1.15
    ceg = (ctx.comparison or {}).get("arms", {}) if ctx.comparison else {}
    for b in rows:
        y = b["i"]
        color = COLORS[2] if b["delta"] < 0 else COLORS[3]
        if b["i"] in big:  # off scale: an arrow at the edge and the value
            edge = lim if b["delta"] > 0 else -lim
            ax.annotate("", xy=(edge, y), xytext=(0.55 * edge, y),
                        arrowprops={"arrowstyle": "->", "color": color, "lw": 2})
            ax.text(0.5 * edge, y - 0.28, f"{b['delta']:+.3f} (off scale)", ha="center", va="bottom", fontsize=8,
                    color=color)
            continue
        xerr = b["err"] if b["err"] else None
        ax.errorbar([b["delta"]], [y], xerr=xerr, fmt="o", color=color, capsize=3, lw=1.4)
    ax.axvline(0.0, color="0.3", lw=0.8)
    ax.set_xlim(-lim, lim)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    if ceg:
        missing = set()
        for i, arm in enumerate(arms):
            res = (ceg.get(arm) or {}).get("ceg")
            if res and arm != ctx.reference and res.get("ceg") is None and res.get("bound") is None:
                missing.add(res.get("status") or "no CEG")  # said once, below, not on every row
            elif res and arm != ctx.reference:
                ax.text(1.02, i, f"vs step 0: CEG {fmt_ceg(res)}", transform=ax.get_yaxis_transform(), va="center",
                        fontsize=7)
        if missing:
            ax.text(1.02, 0.5, textwrap.fill("no CEG vs step 0: " + "; ".join(sorted(missing)), 40),
                    transform=ax.transAxes, va="center", fontsize=7, color="0.3")
    style_axes(ax, "Each step against the previous one\n(paired by seed: mean and 95% CI; < 0: the step helps)",
               "change in final validation loss (nats/token)", "", legend=False)
