"""One report section per measurement of an experiment spec (``measurements:``): a title, markdown
(tables), figures and the numbers behind them. Each function takes the report's
:class:`analysis.experiments.Context`; :data:`SECTIONS` maps the spec's names to them.

Shape legend: T routing records, E experts, L layers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from analysis.experiments import (
    COST_HEADER,
    Context,
    Group,
    _finite,
    cost_cells,
    figure_md,
    fmt_ci,
    fmt_count,
    paired_difference,
    t_interval,
    table,
)
from analysis.plotting import COLORS, pyplot, save_figure, style_axes
from analysis.runs import open_run


@dataclass
class Section:
    title: str
    markdown: str
    figures: list = field(default_factory=list)
    data: dict = field(default_factory=dict)


def _errbar(iv: dict) -> Optional[list]:
    if iv.get("low") is None:
        return None
    return [[iv["mean"] - iv["low"]], [iv["high"] - iv["mean"]]]


def _delta(a: Optional[float], b: Optional[float], count: bool = False) -> str:
    if a is None or b is None:
        return "-"
    d = a - b
    if count:
        return ("+" if d >= 0 else "-") + fmt_count(abs(d)) if d else "0"
    return f"{d:+.3g}"


# --------------------------------------------------------------------------------------------
# ladder: each arm against the one it extends, and the waterfall
# --------------------------------------------------------------------------------------------


def ladder(ctx: Context) -> Section:
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
    return Section("Ladder: one change at a time", md, figures, {"steps": data})


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
            err = _errbar(d)
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


# --------------------------------------------------------------------------------------------
# extrapolation: loss at L, 2L, 4L, 8L and per position
# --------------------------------------------------------------------------------------------


def _extrapolation_table(ctx: Context) -> tuple[list[dict], list[int]]:
    """Per variant: per multiplier the loss interval over seeds (or n/a), and the paired growth
    from L to the longest length."""
    results = ctx.measures.get("extrapolation") or []
    variants: dict[str, dict] = {}
    for r in results:
        v = variants.setdefault(r["variant"], {"variant": r["variant"], "arm": r["arm"], "label": r["label"],
                                               "by_seed": {}})
        v["by_seed"][r["seed"]] = r["result"]
    multipliers = sorted({row["multiplier"] for r in results for row in r["result"]["lengths"]})
    out = []
    for v in variants.values():
        per_m, na, curves = {}, {}, {}
        for m in multipliers:
            vals, reasons = {}, set()
            for seed, res in v["by_seed"].items():
                row = next((x for x in res["lengths"] if x["multiplier"] == m), None)
                if row is None:
                    continue
                if row["status"] == "ok":
                    vals[seed] = row["loss"]
                    curves.setdefault(m, []).append(row["per_position"])
                else:
                    reasons.add(row["reason"])
            per_m[m] = {"loss": t_interval(list(vals.values())), "by_seed": vals}
            if reasons and not vals:
                na[m] = "; ".join(sorted(reasons))
        ok = [m for m in multipliers if m not in na and per_m[m]["loss"]["n"]]
        growth = None
        if len(ok) > 1:
            growth = paired_difference(per_m[ok[-1]]["by_seed"], per_m[ok[0]]["by_seed"])
            growth["from"], growth["to"] = ok[0], ok[-1]
        out.append({**{k: v[k] for k in ("variant", "arm", "label")}, "per_multiplier": per_m, "not_applicable": na,
                    "growth": growth, "train_len": next(iter(v["by_seed"].values()))["train_len"],
                    "per_position": {m: _mean_curve(c) for m, c in curves.items()}})
    return out, multipliers


def _mean_curve(curves: list[dict]) -> dict:
    width = curves[0]["bin_width"]
    arr = np.array([c["loss"] for c in curves], dtype=float)
    return {"bin_width": width, "loss": arr.mean(axis=0).tolist(), "n": len(curves)}


def extrapolation(ctx: Context) -> Section:
    rows_data, multipliers = _extrapolation_table(ctx)
    if not rows_data:
        return Section("Length extrapolation", "(no evaluations: no finished runs of the listed arms)")
    L = rows_data[0]["train_len"]
    header = ["position encoding", *[f"{m}L = {m * L}" for m in multipliers],
              f"loss({multipliers[-1]}L) - loss(L), paired"]
    rows = []
    for v in rows_data:
        cells = []
        for m in multipliers:
            cells.append(f"n/a ({v['not_applicable'][m]})" if m in v["not_applicable"]
                         else fmt_ci(v["per_multiplier"][m]["loss"]))
        g = v["growth"]
        growth = (fmt_ci(g, signed=True) + (f" (to {g['to']}L)" if g["to"] != multipliers[-1] else "")) if g else "-"
        rows.append([v["label"], *cells, growth])
    md = (f"Validation loss (nats/token, mean [95% CI] over seeds) at multiples of the training context L = {L}, "
          f"{int((ctx.spec['measurements']['extrapolation'] or {}).get('tokens', 32768))} validation tokens per "
          "length (the same windows for every run). Variants with `+` apply a RoPE scaling at evaluation only, "
          "with factor s = length / L (at L: s = 1, the unscaled model).\n\n" + table(header, rows))
    figures = []
    for fig in (plot_extrapolation(ctx, rows_data, multipliers, ctx.out / "extrapolation.png"),
                plot_per_position(ctx, rows_data, max(multipliers), ctx.out / "per_position.png")):
        md += figure_md(figures, fig, fig.stem if fig else "")  # alt text: the file's stem
    return Section("Length extrapolation", md, figures, {"variants": rows_data, "multipliers": multipliers})


def _unigram(ctx: Context) -> Optional[float]:
    vals = [r["unigram_entropy"] for r in ctx.rows if _finite(r["unigram_entropy"])]
    return sum(vals) / len(vals) if vals else None


def _growth_curve(v: dict, ms: list[int]) -> list[float]:
    """Mean over seeds of loss(m L) - loss(L), paired by seed, at each multiplier m of ``ms``."""
    base = v["per_multiplier"][ms[0]]["by_seed"]
    out = []
    for m in ms:
        here = v["per_multiplier"][m]["by_seed"]
        diffs = [here[s] - base[s] for s in here if s in base]
        out.append(sum(diffs) / len(diffs) if diffs else float("nan"))
    return out


def plot_extrapolation(ctx: Context, rows_data: list[dict], multipliers: list[int], path):
    """Left: the loss at each evaluated length with its interval. Right: the paired increase over
    the loss at L, zoomed so that one encoding that blows up does not flatten the others."""
    plt = pyplot()
    fig, (ax, ax_g) = plt.subplots(1, 2, figsize=(14, 5.2))
    L = rows_data[0]["train_len"]
    tops, growth = [], {}
    for i, v in enumerate(rows_data):
        ms = [m for m in multipliers if m not in v["not_applicable"] and v["per_multiplier"][m]["loss"]["n"]]
        means = [v["per_multiplier"][m]["loss"]["mean"] for m in ms]
        low = [v["per_multiplier"][m]["loss"]["low"] for m in ms]
        high = [v["per_multiplier"][m]["loss"]["high"] for m in ms]
        style = "--" if v["variant"] != v["arm"] else "-"
        color = COLORS[i % len(COLORS)]
        ax.plot([m * L for m in ms], means, style, marker="o", color=color,
                label=v["label"] + (" (n/a past " + f"{ms[-1] * L})" if v["not_applicable"] and ms else ""))
        if all(x is not None for x in low):
            ax.fill_between([m * L for m in ms], low, high, color=color, alpha=0.15)
        tops.append(means[0] if means else None)
        if len(ms) > 1:
            growth[v["label"]] = ([m * L for m in ms], _growth_curve(v, ms), style, color)
    unigram = _unigram(ctx)
    for a in (ax, ax_g):
        a.axvline(L, color="0.3", ls="--", lw=0.8, label=f"training context L = {L}")
        a.set_xscale("log", base=2)
        a.set_xticks([m * L for m in multipliers], [f"{m * L}" for m in multipliers])
    finite = [t for t in tops if t is not None]
    top = max(finite) + 0.8 if finite else None  # the trained-length losses stay readable when a variant blows up
    if unigram and (top is None or unigram < top + 0.6):  # the unigram line only when it is near the curves
        ax.axhline(unigram, color="0.5", ls=":", lw=1, label="unigram entropy")
        top = None if top is None else max(top, unigram + 0.1)
    if finite:
        ax.set_ylim(min(finite) - 0.15, top)
    style_axes(ax, "Validation loss against evaluation context\n(shaded: 95% CI over seeds)",
               "evaluation context length (tokens, log scale)", "validation loss (nats/token)", legend=False)
    peaks = sorted(max(abs(g) for g in c[1]) for c in growth.values())
    clip = peaks[-2] * 1.4 + 0.02 if len(peaks) > 1 and peaks[-1] > 2.5 * peaks[-2] else None
    ax_g.axhline(0.0, color="0.3", lw=0.8)
    for label, (x, y, style, color) in growth.items():
        off = clip is not None and max(abs(g) for g in y) > clip
        ax_g.plot(x, y, style, marker="o", color=color, label=label + (" (off scale)" if off else ""))
    if clip is not None:
        ax_g.set_ylim(-clip, clip)
    style_axes(ax_g, "Increase over the loss at L (mean of the same-seed differences)",
               "evaluation context length (tokens, log scale)", "loss(length) - loss(L) (nats/token)",
               legend=False)
    handles, labels = ax_g.get_legend_handles_labels()
    for h, label in zip(*ax.get_legend_handles_labels()):  # one legend for both panels
        if not any(x.split(" (")[0] == label.split(" (")[0] for x in labels):
            handles.append(h)
            labels.append(label)
    ax_g.legend(handles, labels, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save_figure(fig, path)


def plot_per_position(ctx: Context, rows_data: list[dict], multiplier: int, path):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    L = rows_data[0]["train_len"]
    drawn = 0
    firsts = []
    for i, v in enumerate(rows_data):
        curve = v["per_position"].get(multiplier)
        if curve is None:
            continue
        w = curve["bin_width"]
        x = [w * (j + 0.5) for j in range(len(curve["loss"]))]
        ax.plot(x, curve["loss"], "--" if v["variant"] != v["arm"] else "-", color=COLORS[i % len(COLORS)],
                label=v["label"], lw=1.3)
        firsts.append(min(curve["loss"]))
        drawn += 1
    if not drawn:
        return None
    unigram = _unigram(ctx)
    ax.axvline(L, color="0.3", ls="--", lw=0.8, label=f"training context L = {L}")
    if unigram:
        ax.axhline(unigram, color="0.5", ls=":", lw=1, label="unigram entropy")
        ax.set_ylim(min(firsts) - 0.2, unigram + 1.0)
    style_axes(ax, f"Loss per token position in windows of {multiplier}L = {multiplier * L} tokens "
               f"(mean over seeds, bins of {rows_data[0]['per_position'][multiplier]['bin_width']})"
               if multiplier in rows_data[0]["per_position"] else f"Loss per token position at {multiplier}L",
               "token position in the window", "validation loss (nats/token)", legend_outside=True)
    return save_figure(fig, path)


# --------------------------------------------------------------------------------------------
# gradient norms at initialisation
# --------------------------------------------------------------------------------------------


def init_grad_norms(ctx: Context) -> Section:
    results = ctx.measures.get("init_grad_norms") or []
    groups: dict[tuple, list] = {}
    for r in results:
        groups.setdefault((r["arm"], r["depth"]), []).append(r["result"])
    rows, data = [], []
    for (arm, depth), res in groups.items():
        per_layer = np.array([x["per_layer"] for x in res])  # (seeds, L)
        mean = per_layer.mean(axis=0)
        ratio = t_interval(list(per_layer[:, -1] / per_layer[:, 0]))
        data.append({"arm": arm, "depth": depth, "per_layer_mean": mean.tolist(), "per_layer": per_layer.tolist(),
                     "last_over_first": ratio, "loss": t_interval([x["loss"] for x in res])})
        rows.append([ctx.arms[arm]["label"], depth, ", ".join(f"{v:.3g}" for v in mean), fmt_ci(ratio, 2),
                     f"{mean.sum():.3g}"])
    md = ("Gradient norm of each block's parameters at initialisation (mean over "
          f"{len(ctx.measures['init_grad_norms'] and {r['seed'] for r in results})} seeds, "
          f"{results[0]['result']['batches'] if results else 0} training batches each; the weights the runs start "
          "from). Xiong et al. (2020): with Post-LN the gradient norm grows towards the last layers; with Pre-LN it "
          "is about flat across layers and decreases with depth.\n\n"
          + table(["placement", "layers", "gradient norm per layer (layer 1 first)", "last / first layer [95% CI]",
                   "sum over layers"], rows))
    figures: list[str] = []
    md += figure_md(figures, plot_grad_norms(ctx, data, ctx.out / "init_grad_norms.png"),
                    "gradient norms at initialisation")
    return Section("Gradient norms at initialisation", md, figures, {"groups": data})


def plot_grad_norms(ctx: Context, data: list[dict], path):
    if not data:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    arms = list(dict.fromkeys(d["arm"] for d in data))
    depths = sorted({d["depth"] for d in data})
    markers = ["o", "s", "^", "D", "v"]
    for d in data:
        color = COLORS[arms.index(d["arm"]) % len(COLORS)]
        per = np.array(d["per_layer"])
        x = np.arange(1, d["depth"] + 1)
        ax.plot(x, per.mean(axis=0), marker=markers[depths.index(d["depth"]) % len(markers)], color=color,
                label=f"{ctx.arms[d['arm']]['label']}, {d['depth']} layers")
        if len(per) > 1:
            ax.fill_between(x, per.min(axis=0), per.max(axis=0), color=color, alpha=0.12)
    ax.set_yscale("log")
    ax.xaxis.get_major_locator().set_params(integer=True)
    style_axes(ax, "Gradient norm per layer at initialisation (shaded: min-max over seeds)",
               "layer (1 = next to the embedding)", "gradient norm of the block's parameters (log scale)",
               legend_outside=True)
    return save_figure(fig, path)


# --------------------------------------------------------------------------------------------
# stability grid: which settings diverge or fail to learn
# --------------------------------------------------------------------------------------------


def _outcome(r: dict) -> str:
    if r["status"] == "diverged":
        return "diverged"
    if r["status"] != "finished":
        return r["status"]
    return "learned" if r["learned"] else "did not learn"


def stability(ctx: Context) -> Section:
    grid = ctx.spec.get("grid") or {}
    keys = list(grid)
    if not keys:
        return Section("Stability", "(the spec has no grid)")
    row_key, col_key = keys[0], (keys[1] if len(keys) > 1 else None)
    arms = [a for a in ctx.arms]
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
                    text += (" " if text else "") + "**" + ", ".join(f"{bad.count(o)} {o}" for o in sorted(set(bad))) \
                        + "**"
                cells.append(text or "-")
            rows.append(cells)
        md += [f"**{ctx.arms[arm]['label']}** (`{arm}`): final validation loss, mean over seeds (each seed's in "
               "parentheses); runs that diverged or did not learn are counted in bold.", "", table(header, rows), ""]
    figures: list[str] = []
    embed = figure_md(figures, plot_stability(ctx, arms, row_key, col_key, ctx.out / "stability.png"), "stability grid")
    md += [embed.strip()] if embed else []
    cost_rows = [[f"{g.label} (`{g.arm}`)", *cost_cells(g)] for g in ctx.groups.values()
                 if g.cell == ctx.groups[next(iter(ctx.groups))].cell]
    md += ["", "Costs (the same in every cell of the grid; tokens/s and peak RSS of the first cell):", "",
           table(["arm", *COST_HEADER], cost_rows)]
    return Section("Stability over the learning-rate x warmup grid", "\n".join(md), figures, {"cells": data})


def _group_at(ctx: Context, arm: str, cell: dict) -> Optional[Group]:
    for g in ctx.groups.values():
        if g.arm == arm and all(str(g.cell.get(k)) == str(v) for k, v in cell.items()):
            return g
    return None


def plot_stability(ctx: Context, arms: list[str], row_key: str, col_key: Optional[str], path):
    grid = ctx.spec["grid"]
    rows = [str(v) for v in grid[row_key]]
    cols = [str(v) for v in grid[col_key]] if col_key else [""]
    unigram = _unigram(ctx) or 8.0
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
                ax.text(j, i, text + ("\n" + label if label else ""), ha="center", va="center", fontsize=7,
                        color="white" if mean is None or mean > (vmin + unigram) / 2 else "black")
        image = ax.imshow(M, cmap="viridis", vmin=vmin, vmax=unigram, aspect="auto")
        ax.set_xticks(range(len(cols)), cols)
        ax.set_yticks(range(len(rows)), rows)
        style_axes(ax, ctx.arms[arm]["label"], col_key or "", row_key if k == 0 else "", legend=False)
        ax.grid(False)
    if image is not None:
        cbar = fig.colorbar(image, ax=axes[0].tolist(), shrink=0.9)
        cbar.set_label("final val loss (nats/token)")
    fig.suptitle("Final validation loss per setting, mean over seeds; colours capped at the unigram entropy\n"
                 "(div: a seed diverged; no learn: a seed stayed at the unigram loss)", fontsize=10,
                 y=1.0 + 0.4 / (0.55 * len(rows) + 2.2))
    return save_figure(fig, path)


# --------------------------------------------------------------------------------------------
# routing balance: MaxVio against validation loss
# --------------------------------------------------------------------------------------------


def maxvio(run_dir: str) -> Optional[dict]:
    """MaxVio of one MoE run from its routing records: ``global`` = max_e load_e / mean load - 1
    with the loads summed over all of training (per layer, then the mean over MoE layers), and
    ``batch`` = the mean over records of each record's MaxVio (each record covers the steps since
    the previous one), also averaged over layers."""
    from analysis.routing import load_matrix, training_series

    run = open_run(run_dir)
    series = training_series(run)
    glob, batch, layers = [], [], {}
    for layer, s in series.items():
        counts = s.get("tokens_per_expert")
        if counts is None or counts.ndim != 2:
            share = load_matrix(s)
            if share is None:
                continue
            counts = share
        total_E = counts.sum(axis=0)
        g = float(total_E.max() / total_E.mean() - 1.0)
        per_T = counts.max(axis=1) / np.maximum(counts.mean(axis=1), 1e-12) - 1.0
        glob.append(g)
        batch.append(float(per_T.mean()))
        layers[layer] = {"global": g, "batch": float(per_T.mean())}
    if not glob:
        return None
    return {"global": float(np.mean(glob)), "batch": float(np.mean(batch)), "layers": layers}


def routing(ctx: Context) -> Section:
    conf = ctx.spec["measurements"].get("routing") or {}
    rows, data = [], []
    for g in ctx.arm_groups():
        per_seed = {s: maxvio(r["run_dir"]) for s, r in g.runs.items() if r["status"] in ("finished", "diverged")}
        per_seed = {s: v for s, v in per_seed.items() if v}
        if not per_seed:
            continue
        glob = t_interval([v["global"] for v in per_seed.values()])
        batch = t_interval([v["batch"] for v in per_seed.values()])
        data.append({"arm": g.arm, "label": g.label, "family": g.costs["family"], "loss": g.loss, "maxvio_global": glob,
                     "maxvio_batch": batch, "vs_reference": g.vs_reference, "parent": ctx.arms[g.arm]["parent"],
                     "vs_parent": g.vs_parent, "per_seed": {str(s): v for s, v in per_seed.items()}})
        balance = ctx.arms[g.arm]["own"]
        rows.append([f"{g.label} (`{g.arm}`)", g.costs["family"], " ".join(f"`{o}`" for o in balance) or "-",
                     fmt_ci(g.loss), fmt_ci(g.vs_reference, signed=True) if g.vs_reference else "reference",
                     fmt_ci(glob, 3), fmt_ci(batch, 3), fmt_count(g.speed())])
    md = ("MaxVio = max over experts of load / mean load - 1 (0: perfectly balanced). Global: the expert loads "
          "summed over all routing records of training (every `train.routing_every` steps), per MoE layer, then "
          "averaged over layers; per record: each record's MaxVio (a window of steps), averaged over training and "
          "layers (Wang et al. 2024 call the per-batch figure MaxVio_batch).\n\n"
          + table(["arm", "family", "balancing overrides", "final val loss", "vs reference (paired)",
                   "MaxVio global", "MaxVio per record", "tokens/s"], rows))
    figures: list[str] = []
    md += figure_md(figures, plot_maxvio(data, ctx.out / "maxvio_vs_loss.png"), "MaxVio against validation loss")
    for arm in conf.get("heatmaps") or []:
        g = ctx.group(arm)
        run = next((r for r in (g.runs.values() if g else []) if r["status"] == "finished"), None)
        if run is None:
            continue
        from analysis.routing import plot_load_heatmaps, training_series

        path = plot_load_heatmaps(training_series(open_run(run["run_dir"])), f"{g.label} (seed {run['seed']})",
                                  ctx.out / f"load_heatmap_{arm}.png")
        md += figure_md(figures, path, f"load heatmap of {arm}")
    return Section("Load balancing: MaxVio against validation loss", md, figures, {"arms": data})


def plot_maxvio(data: list[dict], path):
    """One panel per model family: each arm's MaxVio against its loss minus the loss of the arm it
    extends (the family's unbalanced arm; paired by seed, which removes the spread the arms share)."""
    pts = [d for d in data if d["loss"].get("mean") is not None]
    if not pts:
        return None
    plt = pyplot()
    families = list(dict.fromkeys(d["family"] for d in pts))
    fig, axes = plt.subplots(1, len(families), figsize=(6.5 * len(families), 5.2), squeeze=False, sharey=True)
    markers = ["o", "s", "^", "D", "v", "P", "X", "*", "h"]
    for ax, family in zip(axes[0], families):
        here = [d for d in pts if d["family"] == family]
        names = {d["arm"] for d in here}
        roots = [d["label"] for d in here if d["parent"] not in names]
        for i, d in enumerate(here):
            diff = d["vs_parent"] if d["parent"] in names else None
            y, yerr = (diff["mean"], _errbar(diff) if diff.get("low") is not None else None) if diff else (0.0, None)
            label = d["label"].split(", ", 1)[-1] if ", " in d["label"] else d["label"]
            ax.errorbar([d["maxvio_global"]["mean"]], [y], xerr=_errbar(d["maxvio_global"]), yerr=yerr,
                        fmt=markers[i % len(markers)], color=COLORS[i % len(COLORS)], capsize=3, label=label)
        ax.axhline(0.0, color="0.3", lw=0.8)
        style_axes(ax, f"{family}: loss change against load imbalance",
                   "MaxVio over training (max load / mean load - 1; 0 = balanced)",
                   f"final val loss minus {', '.join(roots)}'s (nats/token, paired)", legend=False, grid="both")
        ax.legend(fontsize=7, loc="best")
    fig.suptitle("Balancing schemes: expert-load imbalance and what it costs in loss (95% CIs over seeds)")
    return save_figure(fig, path)


# --------------------------------------------------------------------------------------------
# wall clock: equal FLOPs against equal time
# --------------------------------------------------------------------------------------------


def _val_curve(run_dir: str) -> tuple[list, list, list, list]:
    """(training seconds, tokens, training FLOPs, validation loss) at each validation of a run."""
    run = open_run(run_dir)
    train = run.train_rows
    steps = [r["step"] for r in train]
    secs = [r.get("elapsed_s", 0.0) for r in train]
    t, n, f, v = [], [], [], []
    for row in run.val_rows:
        if row.get("final"):
            continue
        t.append(float(np.interp(row["step"], steps, secs)) if steps else None)
        n.append(row.get("tokens", 0))
        f.append(row.get("tokens", 0) * run.flops_per_token)
        v.append(row["loss"])
    fin = run.final_val_loss
    if fin is not None and train:
        t.append(secs[-1])
        n.append(run.tokens_seen or 0)
        f.append((run.tokens_seen or 0) * run.flops_per_token)
        v.append(fin)
    return t, n, f, v


def _training_seconds(g: Group) -> dict:
    """Training time of each of the arm's runs: tokens / tokens per second (the benchmark's when
    measured, so that arms compare under the same load; else each run's own median)."""
    vals = []
    for r in g.runs.values():
        speed = g.bench_tokens_per_s or r["tokens_per_s"]
        if _finite(r["tokens"]) and _finite(speed):
            vals.append(r["tokens"] / speed)
    return t_interval(vals)


def wall_clock(ctx: Context) -> Section:
    timed = [a for a in ctx.arms.values() if "match_time_of" in a["budget"]]
    rows, data = [], []
    for a in timed:
        target, speed_arm = a["budget"]["match_time_of"], a["budget"]["speed_of"]
        g, tg, sg = ctx.group(a["name"]), ctx.group(target), ctx.group(speed_arm)
        if g is None or tg is None or sg is None:
            continue
        budget = (ctx.record.get("timed_budgets") or {}).get(a["name"], {})
        eq_flops = paired_difference(tg.losses(), sg.losses())
        eq_time = paired_difference(tg.losses(), g.losses())
        secs = {"target": _training_seconds(tg), "speed": _training_seconds(sg), "timed": _training_seconds(g)}
        ratio = tg.speed() / sg.speed() if tg.speed() and sg.speed() else None
        data.append({"arm": a["name"], "target": target, "speed_arm": speed_arm, "budget": budget,
                     "equal_flops": eq_flops, "equal_time": eq_time, "training_seconds": secs,
                     "speed_ratio": ratio})
        rows.append([f"{tg.label} vs {sg.label}", "equal training FLOPs", fmt_ci(tg.loss), fmt_ci(sg.loss),
                     fmt_ci(eq_flops, signed=True), f"{fmt_count(tg.measured()['tokens'])} / "
                     f"{fmt_count(sg.measured()['tokens'])}", f"{fmt_ci(secs['target'], 0)} / "
                     f"{fmt_ci(secs['speed'], 0)}"])
        rows.append([f"{tg.label} vs {g.label}", "equal training time", fmt_ci(tg.loss), fmt_ci(g.loss),
                     fmt_ci(eq_time, signed=True), f"{fmt_count(tg.measured()['tokens'])} / "
                     f"{fmt_count(g.measured()['tokens'])}", f"{fmt_ci(secs['target'], 0)} / "
                     f"{fmt_ci(secs['timed'], 0)}"])
    budgets = list((ctx.record.get("timed_budgets") or {}).values())
    speeds_from = budgets[0].get("speeds_from", "the runs") if budgets else "the runs"
    md = ("Two views of the same question. Equal FLOPs: both arms train the same training FLOPs. Equal time: the "
          "dense arm trains as many tokens as it processes in the training time of the MoE arm, training time = "
          f"tokens / tokens per second, the speeds from {speeds_from} (evaluation and start-up excluded). A negative "
          "difference: the first arm is better.\n\n"
          + table(["comparison", "view", "first arm loss", "second arm loss", "first - second (paired)",
                   "tokens (first / second)", "training s (first / second)"], rows))
    if data and data[0]["speed_ratio"]:
        md += "\n\n" + "; ".join(f"{ctx.arms[d['target']]['label']} trains at {d['speed_ratio']:.2f}x the tokens/s "
                                 f"of {ctx.arms[d['speed_arm']]['label']}" for d in data) + "."
    figures: list[str] = []
    md += figure_md(figures, plot_curves(ctx, ctx.out / "loss_vs_time_and_flops.png"),
                    "validation loss against time and FLOPs")
    return Section("Equal FLOPs against equal wall-clock time", md, figures, {"comparisons": data})


def plot_curves(ctx: Context, path):
    plt = pyplot()
    fig, (ax_t, ax_f) = plt.subplots(1, 2, figsize=(13, 5))
    drawn = 0
    bench = all(g.bench_tokens_per_s for g in ctx.arm_groups())
    for i, g in enumerate(ctx.arm_groups()):
        c = COLORS[i % len(COLORS)]
        for j, r in enumerate(g.runs.values()):
            if r["status"] != "finished":
                continue
            t, n, f, v = _val_curve(r["run_dir"])
            if bench:
                t = [x / g.bench_tokens_per_s for x in n]
            label = g.label if j == 0 else None
            ax_t.plot(t, v, color=c, lw=1.2, alpha=0.8, label=label, marker="." if j == 0 else None)
            ax_f.plot(f, v, color=c, lw=1.2, alpha=0.8, label=label)
            drawn += 1
    if not drawn:
        return None
    unigram = _unigram(ctx)
    finals = [r["val_loss"] for r in ctx.rows if _finite(r["val_loss"])]
    for ax in (ax_t, ax_f):  # the early losses (~ log V) would squash the end of the curves
        if unigram and finals:
            ax.set_ylim(min(finals) - 0.1, max(unigram, max(finals)) + 0.3)
    style_axes(ax_t, "Validation loss against training time (every seed)",
               "training time (s): tokens / benchmark tokens per second" if bench
               else "training wall-clock time (s, this machine)", "validation loss (nats/token)")
    ax_f.set_xscale("log")
    style_axes(ax_f, "Validation loss against training compute (every seed)", "training FLOPs (log scale)",
               "validation loss (nats/token)", grid="both")
    return save_figure(fig, path)


def throughput(ctx: Context) -> Section:
    bench = ctx.measures.get("throughput") or {}
    ref = bench.get(ctx.reference, {}).get("tokens_per_s")
    rows, data = [], []
    for name, b in bench.items():
        rounds = b["rounds"]
        rel = b["tokens_per_s"] / ref if ref else None
        data.append({"arm": name, **b, "relative_to_reference": rel})
        rows.append([f"{ctx.arms[name]['label']} (`{name}`)", fmt_count(b["tokens_per_s"]),
                     f"{fmt_count(min(rounds))} - {fmt_count(max(rounds))}", f"{rel:.2f}" if rel else "-",
                     fmt_count(ctx.arms[name]["costs"]["flops_per_token"])])
    first = next(iter(bench.values()), {})
    md = (f"Every arm's training step timed side by side in this process: {len(first.get('rounds', []))} rounds, "
          f"each timing {first.get('steps', 0)} steps of every arm in turn, {first.get('threads')} torch thread(s); "
          "the median over rounds. The arms see the same machine load, so their ratios mean something even on a "
          "shared machine (the runs' own tokens/s do not).\n\n"
          + table(["arm", "tokens/s (median over rounds)", "range over rounds", "relative to reference",
                   "train FLOPs/token"], rows))
    return Section("Throughput, measured side by side", md, [], {"arms": data})


# --------------------------------------------------------------------------------------------
# KV cache: validation loss against inference memory
# --------------------------------------------------------------------------------------------


def kv_cache(ctx: Context) -> Section:
    groups = ctx.arm_groups()
    ref = ctx.group(ctx.reference)
    rows, data = [], []
    for g in groups:
        kv = g.costs["kv_bytes_per_token"]
        rel = kv / ref.costs["kv_bytes_per_token"] if ref else None
        data.append({"arm": g.arm, "label": g.label, "kv_bytes_per_token": kv, "relative_kv": rel, "loss": g.loss,
                     "vs_reference": g.vs_reference})
        rows.append([f"{g.label} (`{g.arm}`)", f"{kv:.0f} B", f"{rel:.2f}" if rel else "-", fmt_ci(g.loss),
                     fmt_ci(g.vs_reference, signed=True) if g.vs_reference else "reference",
                     fmt_count(g.costs["params_total"]), fmt_count(g.speed())])
    md = ("KV cache per token of context at inference, bf16: 2 (K and V) x layers x KV heads x head dim x 2 bytes; "
          "MLA: layers x (latent + RoPE key width) x 2 bytes (`archlab.costs.kv_cache_bytes(cfg, batch=1, "
          "context=1)`, which asks the attention class).\n\n"
          + table(["arm", "KV bytes/token", "relative to reference", "final val loss", "vs reference (paired)",
                   "params", "tokens/s"], rows))
    figures: list[str] = []
    md += figure_md(figures, plot_kv(ctx, data, ctx.out / "loss_vs_kv.png"), "validation loss against KV-cache bytes")
    return Section("Validation loss against KV-cache size", md, figures, {"arms": data})


def plot_kv(ctx: Context, data: list[dict], path):
    """Left: each arm's loss with its interval. Right: the paired difference to the reference arm
    (same seeds), which removes the seed-to-seed spread the arms share."""
    pts = [d for d in data if d["loss"].get("mean") is not None]
    if not pts:
        return None
    plt = pyplot()
    fig, (ax, ax_d) = plt.subplots(1, 2, figsize=(13, 5))
    for i, d in enumerate(pts):
        color = COLORS[i % len(COLORS)]
        ax.errorbar([d["kv_bytes_per_token"]], [d["loss"]["mean"]], yerr=_errbar(d["loss"]), fmt="o",
                    color=color, capsize=4, label=d["label"])
        diff = d["vs_reference"] or {"mean": 0.0, "low": None}
        ax_d.errorbar([d["kv_bytes_per_token"]], [diff["mean"]], yerr=_errbar(diff) if diff.get("low") is not None
                      else None, fmt="o", color=color, capsize=4, label=d["label"])
    ax_d.axhline(0.0, color="0.3", lw=0.8)
    xs = sorted({d["kv_bytes_per_token"] for d in pts})
    for a in (ax, ax_d):
        a.set_xscale("log", base=2)
        a.set_xticks(xs, [f"{x:.0f}" for x in xs], rotation=45)  # near sizes (384, 432 B) stay apart
        a.minorticks_off()
    xlabel = "KV cache per token of context (bytes, bf16, log scale)"
    style_axes(ax, "Final validation loss (95% CI over seeds)", xlabel, "final validation loss (nats/token)",
               grid="both")
    style_axes(ax_d, f"Paired difference to {ctx.arms[ctx.reference]['label']} (95% CI)", xlabel,
               "loss minus the reference's (nats/token, same seeds)", legend=False, grid="both")
    return save_figure(fig, path)


SECTIONS = {"ladder": ladder, "extrapolation": extrapolation, "init_grad_norms": init_grad_norms,
            "stability": stability, "routing": routing, "wall_clock": wall_clock, "kv_cache": kv_cache,
            "throughput": throughput}
