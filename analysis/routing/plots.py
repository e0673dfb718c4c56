"""The routing figures: load heatmaps, balance, telemetry and bias over training; specialisation,
co-activation and saturation from a checkpoint. A figure with nothing to show returns None."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import numpy as np

from analysis.routing.series import _layer_sort_key, expert_telemetry, load_matrix, maxvio_percentiles, window_steps
from analysis.runs import pyplot, save_figure, style_axes
from archlab.nn.moe.stats import STARVED_FRACTION


def _grid(plt, n: int, w: float = 4.2, h: float = 3.4, ncols_max: int = 4):
    ncols = min(ncols_max, n)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(w * ncols, h * nrows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.axis("off")
    return fig, list(axes.flat[:n])


def load_vmax(series: dict[str, dict]) -> Optional[float]:
    """The largest expert-load share over every layer and record of a run (None without routing records)."""
    loads = [load_matrix(s) for s in series.values()]
    loads = [x for x in loads if x is not None]
    return max(float(x.max()) for x in loads) if loads else None


def plot_load_heatmaps(series: dict[str, dict], run_name: str, path: Path, vmax: Optional[float] = None
                       ) -> Optional[Path]:
    """Expert load over training as a multiple of the uniform share 1/E, one panel per MoE layer, on one
    diverging colour scale centred on uniform (white at 1): blue below (0, dead, the deepest), red above up to
    ``vmax`` (a share; default the run's largest, at least twice uniform): pass the same ``vmax`` to compare
    runs. Below and above uniform each take half the colours, so a starved expert is as plain as a hot one."""
    from matplotlib.colors import TwoSlopeNorm

    plt = pyplot()
    layers = [layer for layer in series if load_matrix(series[layer]) is not None]
    if not layers:
        return None
    E = load_matrix(series[layers[0]]).shape[1]
    top = max(2.0, E * (vmax if vmax is not None else load_vmax(series)))  # in multiples of uniform
    fig, axes = _grid(plt, len(layers), w=5.0, h=3.6, ncols_max=2)
    im = None
    for ax, layer in zip(axes, layers):
        ratio_TE = load_matrix(series[layer]) * E
        steps = series[layer]["step"]
        im = ax.imshow(ratio_TE.T, aspect="auto", origin="lower", cmap="RdBu_r", interpolation="nearest",
                       extent=(steps[0], steps[-1], -0.5, E - 0.5), norm=TwoSlopeNorm(vmin=0.0, vcenter=1.0, vmax=top))
        style_axes(ax, f"{layer}: expert load over training", "training step", "expert id", legend=False)
        ax.grid(False)
    fig.suptitle(f"{run_name}: expert load per MoE layer against uniform\n(one colour scale for every panel)")
    fig.tight_layout()
    cb = fig.colorbar(im, ax=axes, shrink=0.9)
    cb.set_label(f"load / uniform share (1 = 1/{E} of the slots)\n0 = dead; under {STARVED_FRACTION:g}: starved")
    return save_figure(fig, path)


def plot_balance(series: dict[str, dict], run_name: str, path: Path) -> Optional[Path]:
    """MaxVio, router entropy and dropped fraction per layer against the step; a dropped fraction that is
    zero in every record is a line under the title, not an empty panel."""
    plt = pyplot()
    panels = [("maxvio", "MaxVio = (max load - mean) / mean", "MaxVio (ratio)"),
              ("router_entropy", "router entropy (mean over tokens)", "entropy (nats)"),
              ("dropped_fraction", "dropped token-slots (capacity)", "fraction of slots dropped")]
    panels = [p for p in panels if any(p[0] in s for s in series.values())]
    none_dropped = any(p[0] == "dropped_fraction" for p in panels) and \
        all(not np.any(s.get("dropped_fraction", np.zeros(1))) for s in series.values())
    if none_dropped:
        panels = [p for p in panels if p[0] != "dropped_fraction"]
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4), squeeze=False)
    for ax, (key, title, ylabel) in zip(axes[0], panels):
        for layer, s in series.items():
            if key in s and s[key].ndim == 1:
                ax.plot(s["step"], s[key], lw=1.2, label=layer)
        if key == "router_entropy":
            E = next((load_matrix(s).shape[1] for s in series.values() if load_matrix(s) is not None), None)
            if E:
                ax.axhline(math.log(E), color="gray", ls=":", lw=1, label=f"uniform over E={E}: ln E")
        style_axes(ax, title, "training step", ylabel, legend=False)
    note = "\nno token-slot dropped in any record (dropless routing or ample capacity)" if none_dropped else ""
    fig.suptitle(f"{run_name}: load balance over training{note}")
    fig.tight_layout()
    # one legend under the panels: inside one, it covered the curves' ends (they end at the right edge)
    entries: dict[str, object] = {}
    for ax in axes[0]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    fig.legend(list(entries.values()), list(entries), loc="upper center", bbox_to_anchor=(0.5, 0.0),
               ncol=min(len(entries), 6), fontsize=8, title="MoE layer", title_fontsize=8)
    return save_figure(fig, path)


def plot_telemetry(series: dict[str, dict], totals: dict[str, np.ndarray], run_name: str,
                   path: Path) -> Optional[Path]:
    """Per layer against the step: tokens per expert (min, mean, max; std), dead experts, dropped
    tokens; across layers: p50/p90/p95/max of MaxVio. Token counts are divided by the steps each
    record covers (``moe/window_steps``), so records of unequal windows compare."""
    plt = pyplot()
    tele = {layer: expert_telemetry(s) for layer, s in series.items()}
    tele = {layer: t for layer, t in tele.items() if "max" in t}
    pct = maxvio_percentiles(series, totals)
    if not tele and not pct:
        return None
    per_step = window_steps(series, totals)
    E = next((load_matrix(s).shape[1] for s in series.values() if load_matrix(s) is not None), None)
    fig, axes = plt.subplots(2, 3, figsize=(16, 8.4), squeeze=False)
    ax_mm, ax_std, ax_dead, ax_drop, ax_pct, ax_note = axes.flat
    cmap = plt.get_cmap("tab10")

    def scaled(values: np.ndarray) -> np.ndarray:
        return values / per_step if per_step is not None and len(per_step) == len(values) else values

    unit = "tokens per expert per step" if per_step is not None else "tokens per expert (whole window)"
    for i, (layer, t) in enumerate(tele.items()):
        steps, color = series[layer]["step"], cmap(i % cmap.N)
        ax_mm.plot(steps, scaled(t["max"]), color=color, lw=1.3, label=layer)
        ax_mm.plot(steps, scaled(t["min"]), color=color, lw=1.3, ls="--")
        if "mean" in t:
            ax_mm.plot(steps, scaled(t["mean"]), color=color, lw=0.9, ls=":")
        ax_std.plot(steps, scaled(t["std"]), color=color, lw=1.3, label=layer)
        if "dead" in t:
            ax_dead.step(steps, t["dead"], where="pre", color=color, lw=1.3, label=layer)  # a record closes its window
        if "starved" in t:
            ax_dead.step(steps, t["starved"], where="pre", color=color, lw=1.3, ls="--")
        if "dropped_tokens" in t:
            ax_drop.plot(steps, scaled(t["dropped_tokens"]), color=color, lw=1.3, label=layer)
    for style, label in (("-", "max over experts"), ("--", "min over experts"), (":", "mean over experts")):
        ax_mm.plot([], [], color="gray", ls=style, label=label)
    style_axes(ax_mm, "tokens per expert: max, min and mean\n(legend: bottom-right panel)", "training step",
               unit, legend=False)
    style_axes(ax_std, "tokens per expert: standard deviation", "training step", unit,
               legend_title="MoE layer")
    dead_title = f"dead (solid: zero tokens) and starved experts\n(dashed: under {STARVED_FRACTION:.0%} of uniform)"
    if E:
        ax_dead.set_ylim(-0.3, E + 0.3)
        dead_title += f" of E={E} per layer"
    style_axes(ax_dead, dead_title, "training step", "experts (count)", legend_title="MoE layer")
    if all("dropped_tokens" in t and not np.any(t["dropped_tokens"]) for t in tele.values()):
        ax_drop.cla()
        ax_drop.axis("off")  # an all-zero panel says less than one line
        ax_drop.text(0.0, 0.9, "dropped tokens (all K slots over capacity): none\nin any record of any layer "
                     "(dropless routing or ample capacity)", va="top", fontsize=10, transform=ax_drop.transAxes)
    else:
        drop_unit = "tokens per step" if per_step is not None else "tokens (whole window)"
        style_axes(ax_drop, "dropped tokens (all K slots over capacity)", "training step", drop_unit,
                   legend_title="MoE layer")
    if pct:
        for key, style, color in (("max", "-", "k"), ("p95", "--", "tab:purple"), ("p90", "-.", "tab:pink"),
                                  ("p50", ":", "tab:cyan")):  # colours unlike the layers' of the other panels
            ax_pct.plot(pct["step"], pct[key], ls=style, lw=1.4, color=color,
                        label="max" if key == "max" else f"{key[1:]}th percentile")
    style_axes(ax_pct, f"MaxVio across the {len(series)} MoE layer(s)", "training step",
               "MaxVio = (max load - mean) / mean (ratio)", legend_title="over layers")
    ax_note.axis("off")
    handles, labels = ax_mm.get_legend_handles_labels()
    if handles:
        ax_note.legend(handles, labels, loc="upper left", fontsize=8, ncol=2, frameon=True,
                       title="tokens per expert panel: MoE layer (colour), statistic (line)", title_fontsize=8)
    ax_note.text(0.0, 0.45, "Counts are over each routing record's window (the steps since\nthe previous "
                 "record), divided by the steps in it.\nDead: an expert no token was routed to in the whole window."
                 f"\nStarved: one with under {STARVED_FRACTION:.0%} of the mean over experts (but not none)."
                 "\nPercentiles: linear interpolation between the layers' MaxVio values."
                 "\nCoinciding lines (e.g. max at the capacity) overlap.",
                 va="top", fontsize=9, transform=ax_note.transAxes)
    fig.suptitle(f"{run_name}: routing telemetry")
    fig.tight_layout()
    return save_figure(fig, path)


def plot_bias(series: dict[str, dict], run_name: str, path: Path) -> Optional[Path]:
    """Aux-loss-free selection bias of every expert against the step, one panel per layer."""
    plt = pyplot()
    layers = [layer for layer, s in series.items() if "bias" in s and s["bias"].ndim == 2]
    if not layers:
        return None
    fig, axes = _grid(plt, len(layers), w=6.0, h=4.0, ncols_max=2)
    for ax, layer in zip(axes, layers):
        s = series[layer]
        E = s["bias"].shape[1]
        cmap = plt.get_cmap("tab20" if E > 10 else "tab10")
        for e in range(E):
            ax.plot(s["step"], s["bias"][:, e], lw=1, color=cmap(e % cmap.N), label=f"expert {e}" if E <= 20 else None)
        if E > 20:
            ax.plot([], [], color="gray", label=f"{E} experts (one line each)")
        style_axes(ax, f"{layer}: selection bias per expert", "training step", "bias (added to router scores)",
                   legend=False)
        ax.legend(fontsize=7, ncol=2 if E > 8 else 1, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(f"{run_name}: aux-loss-free bias trajectories")
    fig.tight_layout()
    return save_figure(fig, path)


def plot_routed_load(load: dict[str, dict], run_name: str, source: str, path: Path) -> Path:
    """Each expert's load over the routed text as a multiple of the uniform share, one row per MoE layer, on the
    diverging scale of :func:`plot_load_heatmaps` (white at 1, blue below down to 0 = dead, red above)."""
    from matplotlib.colors import TwoSlopeNorm

    plt = pyplot()
    layers = list(load)
    ratio_LE = np.asarray([load[layer]["share_of_uniform"] for layer in layers])
    L, E = ratio_LE.shape
    fig, ax = plt.subplots(figsize=(max(5.0, 0.45 * E + 2.5), max(2.6, 0.5 * L + 1.8)))
    im = ax.imshow(ratio_LE, aspect="auto", cmap="RdBu_r", interpolation="nearest",
                   norm=TwoSlopeNorm(vmin=0.0, vcenter=1.0, vmax=max(2.0, float(ratio_LE.max()))))
    ax.set_xticks(range(E))
    ax.set_yticks(range(L), layers)
    style_axes(ax, f"{run_name}: expert load over {source}", "expert id", "MoE layer", legend=False)
    ax.grid(False)
    cb = fig.colorbar(im, ax=ax, shrink=0.9)
    cb.set_label(f"load / uniform share (1 = 1/{E} of the slots)\n0 = dead; under {STARVED_FRACTION:g}: starved")
    fig.tight_layout()
    return save_figure(fig, path)


def plot_specialisation(spec: dict[str, dict], run_name: str, path: Path) -> Path:
    plt = pyplot()
    layers = list(spec)
    x = np.arange(len(layers))
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(layers) + 2), 4))
    ax.bar(x - 0.2, [spec[layer]["mean"] for layer in layers], width=0.4, label="mean over token ids")
    ax.bar(x + 0.2, [spec[layer]["weighted_mean"] for layer in layers], width=0.4, label="weighted by occurrences")
    base = spec[layers[0]]["uniform_baseline"]
    ax.axhline(base, color="k", ls=":", label=f"floor K/E = {base:.2f} (id spread evenly)")
    ax.set_xticks(x, layers)
    ax.set_ylim(0, 1.3)  # room for the legend above the bars
    ax.set_yticks(np.linspace(0, 1, 6))
    style_axes(ax, f"{run_name}: token-id specialisation (OLMoE)", "MoE layer",
               "share of a token id's occurrences\nrouted to its most frequent expert", legend=False)
    ax.legend(fontsize=8, loc="upper center", ncol=2)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_coactivation(coact: dict[str, np.ndarray], run_name: str, path: Path) -> Path:
    """N(a, b) / N(a) per layer, every panel on one colour scale (0 to the largest value of any layer)."""
    plt = pyplot()
    fig, axes = _grid(plt, len(coact), w=4.4, h=3.8)
    finite = [float(np.nanmax(C)) for C in coact.values() if np.isfinite(C).any()]
    top = max([1e-9] + finite)
    im = None
    for ax, (layer, C) in zip(axes, coact.items()):
        im = ax.imshow(C, cmap="viridis", vmin=0, vmax=top, interpolation="nearest")
        style_axes(ax, f"{layer}: expert co-activation", "expert b (chosen with a)", "expert a", legend=False)
        ax.grid(False)
    fig.suptitle(f"{run_name}: expert co-activation\n(all pairs of the K chosen experts; one colour scale)")
    fig.tight_layout()
    cb = fig.colorbar(im, ax=axes, shrink=0.9)
    cb.set_label("N(a, b) / N(a)  (white: a never chosen)")
    return save_figure(fig, path)


def plot_saturation(sat: dict[int, dict[str, float]], ref_step: int, run_name: str, path: Path) -> Path:
    plt = pyplot()
    steps = sorted(sat)
    layers = sorted({layer for s in sat.values() for layer in s}, key=_layer_sort_key)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for layer in layers:
        xs = steps + [ref_step]
        ys = [sat[s][layer] for s in steps] + [1.0]
        ax.plot(xs, ys, "o-", label=layer)
    ax.set_ylim(0, 1.05)
    style_axes(ax, f"{run_name}: router saturation against step {ref_step}",
               "checkpoint (training step)", "mean |TopK ∩ TopK_ref| / K", legend_title="MoE layer")
    fig.tight_layout()
    return save_figure(fig, path)
