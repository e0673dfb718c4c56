"""``routing: {heatmaps, held_out_tokens}``: per MoE arm the expert-load imbalance MaxVio over training
(from the runs' routing records, ``analysis.routing``) and at the end of training on held-out data (the
final weights on ``held_out_tokens`` tokens of the validation split, default 32768, as Wang et al. 2024
report it; computed after training and cached under ``<out>/measurements/routing/``) against its final
validation loss, and the expert-load heat maps of the arms listed in ``heatmaps`` (their first finished
seed), with the aux-loss-free selection bias of every expert against the step for those that use it (has
it settled by the end of training?).

Shape legend: T routing records, E experts, L layers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np

from analysis.experiments import Context, Section, errbar, figure_md, fmt_ci, fmt_count, t_interval, table
from analysis.measurements.base import Measurement, cached, check_int, check_names, measurement_folder, register
from analysis.plotting import COLORS, pyplot, save_figure, style_axes
from analysis.routing.checkpoint import held_out_maxvio
from analysis.routing.plots import load_vmax, plot_bias, plot_load_heatmaps
from analysis.routing.series import load_matrix, training_series
from analysis.runs import open_run

HELD_OUT_TOKENS = 32768  # validation tokens the end-of-training MaxVio is measured on


@register
class Routing(Measurement):
    """MaxVio against validation loss, per arm; load heat maps of the listed arms."""

    name = "routing"
    title = "Load balancing: MaxVio against validation loss"
    keys = ("heatmaps", "held_out_tokens")

    def check(self, settings, where: str) -> dict:
        s = super().check(settings, where)
        check_names(s, "heatmaps", where)
        check_int(s, "held_out_tokens", where)
        return s

    loads_checkpoints = True

    def _scored(self, record: dict) -> list[tuple[dict, Path]]:
        """(run, cache file) of every finished run of a MoE model."""
        folder = measurement_folder(record) / "routing"
        out = []
        for r in record["runs"]:
            try:
                run = open_run(r["run_dir"])
            except Exception:  # a missing or broken run: the report lists it elsewhere
                continue
            if run.status == "finished" and run.recipe.model.get("moe") is not None:
                out.append((r, folder / f"{r['point']}.json"))
        return out

    def checkpoints(self, record: dict) -> dict[str, Path]:
        return {r["run_dir"]: path for r, path in self._scored(record)}

    def run(self, record: dict, log=print) -> dict:
        """Held-out MaxVio at the end of training of every finished run (cached per run)."""
        tokens = int(self.settings(record).get("held_out_tokens", HELD_OUT_TOKENS))
        out = {}
        for r, path in self._scored(record):
            if not path.is_file():
                log(f"routing: held-out MaxVio of {r['point']}")
            out[r["point"]] = cached(path, {"run_dir": r["run_dir"], "tokens": tokens},
                                     lambda r=r: held_out_maxvio(r["run_dir"], tokens))
        return out

    def section(self, ctx: Context) -> Section:
        conf = ctx.spec.wanted.get("routing") or {}
        held_out = ctx.measures.get(self.name) or {}
        held_tokens = int(conf.get("held_out_tokens", HELD_OUT_TOKENS))
        rows, data = [], []
        for g in ctx.arm_groups():
            per_seed = {s: maxvio(r["run_dir"]) for s, r in g.runs.items() if r["status"] in ("finished", "diverged")}
            per_seed = {s: v for s, v in per_seed.items() if v}
            if not per_seed:
                continue
            glob = t_interval([v["global"] for v in per_seed.values()])
            batch = t_interval([v["batch"] for v in per_seed.values()])
            held = [held_out[r["point"]] for r in g.runs.values() if r["point"] in held_out]
            end_glob = t_interval([h["global"] for h in held])
            end_batch = t_interval([h["batch"] for h in held])
            data.append({"arm": g.arm, "label": g.label, "family": g.costs["family"], "loss": g.loss,
                         "maxvio_global": glob, "maxvio_batch": batch, "maxvio_end_global": end_glob,
                         "maxvio_end_batch": end_batch, "vs_reference": g.vs_reference,
                         "parent": ctx.arms[g.arm].parent, "vs_parent": g.vs_parent,
                         "per_seed": {str(s): v for s, v in per_seed.items()}})
            balance = ctx.arms[g.arm].own
            rows.append([f"{g.label} (`{g.arm}`)", g.costs["family"], " ".join(f"`{o}`" for o in balance) or "-",
                         fmt_ci(g.loss), fmt_ci(g.vs_reference, signed=True) if g.vs_reference else "reference",
                         fmt_ci(glob, 3), fmt_ci(batch, 3), fmt_ci(end_glob, 3), fmt_ci(end_batch, 3),
                         fmt_count(g.speed())])
        md = ("MaxVio = max over experts of load / mean load - 1 (0: perfectly balanced). Global: the expert loads "
              "summed over all routing records of training (every `train.routing_every` steps), per MoE layer, then "
              "averaged over layers; per record: each record's MaxVio (a window of steps), averaged over training and "
              "layers (Wang et al. 2024 call the per-batch figure MaxVio_batch). At the end, held out: the final "
              f"weights on {held_tokens} tokens of the validation split, over all of them (global) and per batch "
              "of the training step's size (batch), averaged over layers: the figure Wang et al. report.\n\n"
              + table(["arm", "family", "balancing overrides", "final val loss", "vs reference (paired)",
                       "MaxVio global (training)", "MaxVio per record (training)", "MaxVio global (end, held out)",
                       "MaxVio_batch (end, held out)", "tokens/s"], rows))
        figures: list[str] = []
        md += figure_md(figures, plot_maxvio(data, ctx.out / "maxvio_vs_loss.png"), "MaxVio against validation loss")
        maps = []  # the listed arms' first finished runs, drawn on one colour scale so that they compare
        for arm in conf.get("heatmaps") or []:
            g = ctx.group(arm)
            run = next((r for r in (g.runs.values() if g else []) if r["status"] == "finished"), None)
            if run is not None:
                maps.append((arm, g, run, training_series(open_run(run["run_dir"]))))
        tops = [t for t in (load_vmax(series) for *_, series in maps) if t is not None]
        for arm, g, run, series in maps:
            path = plot_load_heatmaps(series, f"{g.label} (seed {run['seed']})", ctx.out / f"load_heatmap_{arm}.png",
                                      vmax=max(tops) if tops else None)
            md += figure_md(figures, path, f"load heatmap of {arm}")
        for arm, g, run, series in maps:  # whether the aux-loss-free bias has settled: its trajectory per expert
            path = plot_bias(series, f"{g.label} (seed {run['seed']})", ctx.out / f"bias_{arm}.png")
            md += figure_md(figures, path, f"selection bias trajectories of {arm}")
        return Section(self.title, md, figures, {"arms": data})


def maxvio(run_dir: str) -> Optional[dict]:
    """MaxVio of one MoE run from its routing records: ``global`` = max_e load_e / mean load - 1
    with the loads summed over all of training (per layer, then the mean over MoE layers), and
    ``batch`` = the mean over records of each record's MaxVio (each record covers the steps since
    the previous one), also averaged over layers."""
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


def plot_maxvio(data: list[dict], path):
    """One row per arm, grouped by model family. Left: MaxVio, over training and at the end on held-out
    data (Wang et al.'s figure) where measured, on a log axis; right: the arm's final loss minus the
    loss of the arm it extends (the family's unbalanced arm; paired by seed, which removes the spread
    the arms share), with 95% intervals. Rows never overlap, however close two schemes are."""
    pts = [d for d in data if d["loss"].get("mean") is not None]
    if not pts:
        return None
    plt = pyplot()
    families = list(dict.fromkeys(d["family"] for d in pts))
    rows: list[tuple[float, dict]] = []
    y = 0.0
    for family in families:
        for d in (d for d in pts if d["family"] == family):
            rows.append((y, d))
            y += 1
        y += 0.6  # a gap between families
    fig, (ax_m, ax_l) = plt.subplots(1, 2, figsize=(13, 0.38 * len(rows) + 2.4), sharey=True,
                                     gridspec_kw={"width_ratios": [1.0, 1.0]})
    names = {d["arm"] for d in pts}
    marked: set[str] = set()

    def once(label: str):
        if label in marked:
            return None
        marked.add(label)
        return label

    positive = []
    for y, d in rows:
        for key, fmt, color, label in (("maxvio_global", "o", COLORS[0], "over training (all steps' loads)"),
                                       ("maxvio_end_batch", "D", COLORS[1], "end of training, held out, per batch")):
            iv = d[key]
            if iv.get("mean") is None or iv["mean"] <= 0:
                continue
            xerr = errbar(iv)
            if xerr is not None:  # a log axis: an interval reaching 0 or below is drawn down to 1% of the mean
                xerr[0][0] = min(xerr[0][0], 0.99 * iv["mean"])
            ax_m.errorbar([iv["mean"]], [y], xerr=xerr, fmt=fmt, color=color, capsize=2, ms=5, label=once(label))
            positive.append(iv["mean"])
        diff = d["vs_parent"] if d["parent"] in names else None
        if diff and diff.get("mean") is not None:
            ax_l.errorbar([diff["mean"]], [y], xerr=errbar(diff), fmt="o", color=COLORS[2], capsize=2, ms=5)
        else:
            ax_l.plot([0.0], [y], "|", color="0.2", ms=10)
    if positive:  # a log axis with plain ticks at 1-2-5 steps (no 2x10^-1 minor labels)
        from matplotlib.ticker import NullFormatter

        ax_m.set_xscale("log")
        lo, hi = min(positive) / 1.6, max(positive) * 1.6
        ticks = [m * 10.0 ** k for k in range(-4, 3) for m in (1, 2, 5) if lo <= m * 10.0 ** k <= hi]
        ax_m.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax_m.xaxis.set_minor_formatter(NullFormatter())
    ax_l.axvline(0.0, color="0.3", lw=0.8)
    ax_m.set_yticks([y for y, _ in rows], [d["label"] for _, d in rows], fontsize=8)
    ax_m.set_ylim(rows[-1][0] + 0.6, -0.6)
    style_axes(ax_m, "Load imbalance (MaxVio; 0 = balanced)", "MaxVio = max load / mean load - 1 (log scale)", "",
               legend=False, grid="both")
    fig.legend(*ax_m.get_legend_handles_labels(), loc="lower center", ncol=2, fontsize=8, frameon=False)
    style_axes(ax_l, "Loss against the family's unbalanced arm\n(paired by seed, 95% CI; | : the unbalanced arm)",
               "final val loss minus the unbalanced arm's (nats/token)", "", legend=False)
    fig.suptitle("Balancing schemes: expert-load imbalance and what it costs in loss (95% CIs over seeds)")
    fig.tight_layout(rect=(0, 0.5 / (0.38 * len(rows) + 2.4), 1, 1))  # room for the legend below
    return save_figure(fig, path)
