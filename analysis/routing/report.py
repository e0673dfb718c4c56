"""Every figure and summary of one MoE run into a folder (:func:`analyse`): summary.json and summary.md."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from analysis.routing.checkpoint import _resolve_ckpt, inspect_checkpoint
from analysis.routing.health import expert_health, health_table, routed_load_table
from analysis.routing.plots import (
    plot_balance,
    plot_bias,
    plot_coactivation,
    plot_load_heatmaps,
    plot_routed_load,
    plot_saturation,
    plot_specialisation,
    plot_telemetry,
)
from analysis.routing.series import global_series, maxvio_percentiles, training_series, training_summary
from analysis.routing.trace import read_trace, trace_summary
from analysis.runs import Run, RunError, open_run, write_json_atomic, write_text_atomic
from archlab.nn.moe.stats import STARVED_FRACTION
from archlab.train.checkpoint import checkpoints


def _markdown(run: Run, train: dict, ck: Optional[dict], files: list[str], health: Optional[dict] = None) -> str:
    lines = [f"# Routing of {run.name}", "", f"family: {run.family}; status: {run.status}"
             + (f" ({run.reason})" if run.reason else ""), "", "## Over training", ""]
    if train:
        lines += ["| layer | records | MaxVio first -> last | entropy first -> last (nats) | dropped slots last "
                  "| dropped tokens last | dead experts last |", "|---|---|---|---|---|---|---|"]
        for layer, d in train.items():
            def f(k):
                return f"{d[k + '_first']:.3f} -> {d[k + '_last']:.3f}" if k + "_first" in d else "-"

            def last(k, fmt="{:.0f}"):
                return fmt.format(d[k + "_last"]) if k + "_last" in d else "-"
            lines.append(f"| {layer} | {d['records']} | {f('maxvio')} | {f('router_entropy')} "
                         f"| {last('dropped_fraction', '{:.4f}')} | {last('dropped_tokens')} "
                         f"| {last('dead_experts')} |")
        lines += [""] + health_table(health or {})
    else:
        lines.append("(no routing records in the run folder)")
    if ck:
        lines += ["", f"## Checkpoint step {ck['step']} over {ck['tokens']} tokens of {ck['source']}", ""]
        lines += routed_load_table(ck["load"]) + [""] if ck.get("load") else []
        lines += [
                  "| layer | specialisation (mean over ids) | weighted | token ids | random ~ K/E |",
                  "|---|---|---|---|---|"]
        for layer, s in ck["spec"].items():
            lines.append(f"| {layer} | {s['mean']:.3f} | {s['weighted_mean']:.3f} | {s['n_token_ids']} "
                         f"| {s['uniform_baseline']:.3f} |")
        if ck["saturation"]:
            lines += ["", "Router saturation against this checkpoint:", ""]
            for step, per in sorted(ck["saturation"].items()):
                lines.append(f"- step {step}: " + ", ".join(f"{layer} {v:.3f}" for layer, v in per.items()))
        K = ck.get("top_k")
        lines += ["", "Top tokens per expert (first MoE layer), each as 'token' (occurrences routed to the expert, "
                  "share of this token's occurrences routed to the expert"
                  + (f"; top-{K}: every occurrence goes to {K} experts, so a token reaches up to 100% in each of "
                     f"{K} experts" if K and K > 1 else "") + "):", ""]
        first = next(iter(ck["top_tokens"]))
        for e, toks in enumerate(ck["top_tokens"][first]):
            shown = ", ".join(f"{t['text']!r} ({t['count']}, {t['share_of_id']:.0%})" for t in toks[:6])
            lines.append(f"- expert {e}: " + (shown or "no token of these was routed to it"))
    lines += ["", "Files: " + ", ".join(files)]
    return "\n".join(lines) + "\n"


def analyse(run_dir: str, out: Path, checkpoint: Optional[str] = None, compare: Sequence[str] = (),
            text: Sequence[str] = (), max_tokens: int = 32768, min_count: int = 5, use_checkpoint: bool = True,
            allow_incomplete: bool = False, starved_fraction: float = STARVED_FRACTION,
            starved_window: Optional[float] = None, log=print) -> dict:
    """Every figure and summary of one MoE run into ``out``; a figure with nothing to show is left out and
    ``log`` says why. Starved experts: under ``starved_fraction`` of uniform over the last ``starved_window``
    steps (:func:`analysis.routing.health.expert_health`)."""
    run = open_run(run_dir)
    if not run.is_moe:
        raise RunError(f"{run.path}: a dense run (recipe has no model.moe); routing inspection needs an MoE run")
    if run.status == "incomplete" and not allow_incomplete and (run.metrics or not use_checkpoint):
        raise RunError(f"{run.path}: incomplete run ({run.reason}); pass --allow-incomplete to inspect it anyway")
    series = training_series(run)
    if not series and not use_checkpoint:
        raise RunError(f"{run.path}: no routing records (routing.jsonl / moe rows in metrics.jsonl)")
    out.mkdir(parents=True, exist_ok=True)
    totals = global_series(run)
    files = []
    for made, name, why in (
            (plot_load_heatmaps(series, run.name, out / "load_heatmap.png"), "load_heatmap.png",
             "no load per expert in the routing records"),
            (plot_balance(series, run.name, out / "balance.png"), "balance.png",
             "no MaxVio, router entropy or dropped fraction in the routing records"),
            (plot_telemetry(series, totals, run.name, out / "telemetry.png"), "telemetry.png",
             "no tokens per expert or MaxVio in the routing records"),
            (plot_bias(series, run.name, out / "bias.png"), "bias.png",
             "no aux-loss-free selection bias (the run does not balance with it)")):
        if made is not None:
            files.append(made.name)
        else:
            log(f"routing: {name} not written: {why}")
    ck = None
    if use_checkpoint:
        ckpt = _resolve_ckpt(run, checkpoint)
        if compare:
            others = [_resolve_ckpt(run, c) for c in compare]
        else:
            others = [c for c in checkpoints(run.path) if c.resolve() != ckpt.resolve()]
        ck = inspect_checkpoint(run, ckpt, others, text, max_tokens, min_count, starved_fraction)
        files.append(plot_routed_load(ck["load"], run.name, f"{ck['tokens']} tokens of {ck['source']}",
                                      out / "routed_load.png").name)
        files.append(plot_specialisation(ck["spec"], run.name, out / "specialisation.png").name)
        files.append(plot_coactivation(ck["coact"], run.name, out / "coactivation.png").name)
        if ck["saturation"]:
            files.append(plot_saturation(ck["saturation"], ck["step"], run.name, out / "saturation.png").name)
        else:
            log("routing: saturation.png not written: no other checkpoint to compare with (--compare CKPT)")
    else:
        log("routing: specialisation.png, coactivation.png, saturation.png not written: --no-checkpoint")
    train = training_summary(series)
    health = expert_health(series, starved_fraction, starved_window)
    summary = {"run": str(run.path), "family": run.family, "status": run.status, "training": train,
               "expert_health": health, "files": files}
    pct = maxvio_percentiles(series, totals)
    if pct:
        summary["maxvio_across_layers_last"] = {k: float(v[-1]) for k, v in pct.items() if k != "step"}
    try:
        summary["router_trace"] = trace_summary(read_trace(run.path))
    except RunError:
        pass  # the run was not traced
    if ck:
        summary["checkpoint"] = {
            "path": ck["checkpoint"], "step": ck["step"], "tokens": ck["tokens"], "source": ck["source"],
            "specialisation": {layer: {k: s[k] for k in ("mean", "weighted_mean", "n_token_ids", "uniform_baseline")}
                               for layer, s in ck["spec"].items()},
            "coactivation": {layer: np.where(np.isnan(c), None, c).tolist() for layer, c in ck["coact"].items()},
            "load": ck["load"],
            "saturation": {str(s): v for s, v in ck["saturation"].items()},
            "top_tokens": ck["top_tokens"],
        }
    write_json_atomic(out / "summary.json", summary)
    write_text_atomic(out / "summary.md", _markdown(run, train, ck, files + ["summary.json"], health))
    return summary
