"""Routing inspection of an MoE run: how the router behaved over training, and what it learned.

    python -m analysis.routing runs/mixtral-tiny --out reports/mixtral-tiny-routing
    python -m analysis.routing runs/mixtral-tiny --checkpoint runs/mixtral-tiny/checkpoints/step_00000300 \\
        --text my_held_out.txt --out reports/routing

Over training (from the run's routing.jsonl / metrics.jsonl):
  load_heatmap.png     load per expert against the uniform share (a diverging scale: red above, blue below,
                       white at 1/E), per MoE layer, against the step
  balance.png          MaxVio, router entropy and dropped fraction per layer against the step
  telemetry.png        per layer: tokens per expert (min, max, std), dead experts (zero tokens in
                       the record's window) and starved ones (under 10% of uniform), dropped tokens;
                       across layers: p50/p90/p95/max of MaxVio
  summary.md lists the dead and starved experts of each layer by id over the last steps
  (:mod:`analysis.routing_health`); a figure with nothing to show is not written, and a line says why.
  bias.png             aux-loss-free selection bias per expert (runs that use it)

Router trace (``train.router_trace_every``): ``read_trace(run_dir)`` returns the traced tokens'
chosen experts, gate weights, dropped slots and router logits of every traced step as arrays;
summary.json says how many steps were traced and what collecting and writing them cost.

From a checkpoint (default: the newest complete one) over held-out text (default: the run's own
validation split; ``--text`` files instead), with the top-K expert ids captured per token and
layer by a forward hook on each router:
  specialisation.png   token-id specialisation per layer (OLMoE): for each token id seen at least
                       ``--min-count`` times, the share of its occurrences routed (among its K) to
                       its most frequent expert; mean over token ids, and the uniform baseline K/E
  coactivation.png     per layer, N(a, b) / N(a): how often expert b is chosen with expert a,
                       counting every pair of the K chosen experts (one colour scale for all layers)
  saturation.png       router saturation (OLMoE): mean over tokens of |TopK_ckpt ∩ TopK_ref| / K
                       of each other checkpoint against the analysed one, per layer
  summary.json / summary.md, including each expert's top tokens.

Shape legend: N tokens, K experts per token, E experts, V vocabulary, L MoE layers, P traced
steps, T traced tokens per step.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import re
import sys
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch

from analysis.routing_health import expert_health, health_table
from analysis.runs import (
    Run,
    RunError,
    open_run,
    pyplot,
    save_figure,
    style_axes,
    write_json_atomic,
    write_text_atomic,
)
from archlab.nn.moe.stats import STARVED_FRACTION

_LAYER_KEY = re.compile(r"^moe/(layer\d+)/(.+)$")


# --------------------------------------------------------------------------------------------
# statistics over training (run folder)
# --------------------------------------------------------------------------------------------


def _layer_sort_key(name: str) -> int:
    return int(name[len("layer"):])


def training_series(run: Run) -> dict[str, dict]:
    """Per MoE layer, the logged routing statistics against the step.

    Reads routing.jsonl (falling back to metrics.jsonl rows) for flat keys ``moe/layer<i>/<stat>``
    as written by ``archlab.nn.moe.routing_stats``. Returns layer -> {"step": (T,), stat: (T,) or
    (T, E) array}, only stats present in every row of that layer.
    """
    rows = run.routing_rows or [r for r in run.metrics if r.get("kind", "train") == "train"]
    per_layer: dict[str, dict[str, list]] = {}
    for row in rows:
        step = row.get("step")
        if step is None:
            continue
        found: dict[str, dict] = {}
        for key, value in row.items():
            m = _LAYER_KEY.match(key)
            if m:
                found.setdefault(m.group(1), {})[m.group(2)] = value
        for layer, stats in found.items():
            d = per_layer.setdefault(layer, {"step": []})
            d["step"].append(step)
            for k, v in stats.items():
                d.setdefault(k, []).append(v)
    series = {}
    for layer in sorted(per_layer, key=_layer_sort_key):
        d = per_layer[layer]
        T = len(d["step"])
        out = {"step": np.asarray(d["step"], dtype=float)}
        for k, vals in d.items():
            if k == "step" or len(vals) != T:
                continue
            try:
                out[k] = np.asarray(vals, dtype=float)
            except (TypeError, ValueError):
                continue
        series[layer] = out
    return series


def global_series(run: Run) -> dict[str, np.ndarray]:
    """The across-layer numbers of the routing records against the step: flat keys ``moe/<stat>``
    (``maxvio``, ``maxvio_p50`` ..., ``dead_experts``, ``dropped_tokens``, ``window_steps``) as
    {"step": (T,), stat: (T,)}, only stats present in every record."""
    rows = [r for r in (run.routing_rows or [r for r in run.metrics if r.get("kind", "train") == "train"])
            if r.get("step") is not None]
    out: dict[str, np.ndarray] = {"step": np.asarray([r["step"] for r in rows], dtype=float)}
    keys = {k for r in rows for k in r if k.startswith("moe/") and not _LAYER_KEY.match(k)}
    for key in sorted(keys):
        vals = [r.get(key) for r in rows]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
            out[key[len("moe/"):]] = np.asarray(vals, dtype=float)
    return out


def window_steps(series: dict[str, dict], totals: dict[str, np.ndarray]) -> Optional[np.ndarray]:
    """(T,) optimizer steps each routing record covers: ``moe/window_steps`` as logged, else (runs
    from before it was logged) the step differences, the first record counting from step 0."""
    if "window_steps" in totals and len(totals["window_steps"]):
        return np.maximum(totals["window_steps"], 1)
    steps = next((s["step"] for s in series.values()), None)
    if steps is None or not len(steps):
        return None
    return np.maximum(np.diff(steps, prepend=0.0), 1)


def maxvio_percentiles(series: dict[str, dict],
                       totals: Optional[dict[str, np.ndarray]] = None) -> dict[str, np.ndarray]:
    """Percentiles of the per-layer MaxVio across MoE layers against the step: {"step", "p50",
    "p90", "p95", "max"}, each (T,). As logged (``moe/maxvio_p50`` ...) where the records have them,
    else computed from the layers' MaxVio with the same rule (linear interpolation between order
    statistics, ``archlab.nn.moe.stats.layer_percentiles``). Empty without MaxVio records."""
    names = ("p50", "p90", "p95", "max")
    if totals and all(f"maxvio_{n}" in totals for n in names):
        return {"step": totals["step"], **{n: totals[f"maxvio_{n}"] for n in names}}
    layers = [s for s in series.values() if "maxvio" in s and s["maxvio"].ndim == 1]
    if not layers or len({len(s["step"]) for s in layers}) != 1:
        return {}
    v_LT = np.stack([s["maxvio"] for s in layers])
    q = np.percentile(v_LT, [50, 90, 95], axis=0)  # numpy's default: linear interpolation
    return {"step": layers[0]["step"], "p50": q[0], "p90": q[1], "p95": q[2], "max": v_LT.max(axis=0)}


def load_matrix(s: dict) -> Optional[np.ndarray]:
    """(T, E) share of routed slots per expert, from load fractions or token counts."""
    if "load_fraction" in s and s["load_fraction"].ndim == 2:
        return s["load_fraction"]
    if "tokens_per_expert" in s and s["tokens_per_expert"].ndim == 2:
        c = s["tokens_per_expert"]
        return c / np.maximum(c.sum(axis=1, keepdims=True), 1)
    return None


# --------------------------------------------------------------------------------------------
# statistics from a checkpoint (pure functions of the captured top-K ids)
# --------------------------------------------------------------------------------------------


def specialisation(token_ids_N: np.ndarray, experts_NK: np.ndarray, num_experts: int,
                   min_count: int = 5) -> dict:
    """OLMoE's token-id (vocabulary) specialisation of one layer.

    For token id x with N_x occurrences and N_{x,i} occurrences where expert i is among its K
    chosen experts: spec(x) = max_i N_{x,i} / N_x, in [K/E-ish, 1]; 1 means every occurrence of x
    goes to the same expert. Returns the mean over token ids with N_x >= min_count, the
    occurrence-weighted mean, the number of such ids, and the (V_seen, E) count matrix with its ids.
    """
    ids, inverse, n_x = np.unique(token_ids_N, return_inverse=True, return_counts=True)
    counts_VE = np.zeros((len(ids), num_experts), dtype=np.int64)
    K = experts_NK.shape[1]
    np.add.at(counts_VE, (np.repeat(inverse, K), experts_NK.reshape(-1)), 1)
    spec_V = counts_VE.max(axis=1) / n_x
    keep = n_x >= min_count
    return {
        "mean": float(spec_V[keep].mean()) if keep.any() else math.nan,
        "weighted_mean": float((spec_V[keep] * n_x[keep]).sum() / n_x[keep].sum()) if keep.any() else math.nan,
        "n_token_ids": int(keep.sum()),
        "uniform_baseline": K / num_experts,
        "ids": ids, "n_x": n_x, "counts_VE": counts_VE, "spec_V": spec_V,
    }


def top_tokens(spec: dict, decode, n: int = 8, min_count: int = 5) -> list[list[dict]]:
    """Per expert: the token ids routed to it most often (among ids seen >= min_count times),
    with how often and which share of that id's occurrences."""
    ids, n_x, counts_VE = spec["ids"], spec["n_x"], spec["counts_VE"]
    keep = n_x >= min_count
    out = []
    for e in range(counts_VE.shape[1]):
        c = np.where(keep, counts_VE[:, e], 0)
        order = np.argsort(-c, kind="stable")[:n]
        out.append([{"token_id": int(ids[j]), "text": decode(int(ids[j])), "count": int(c[j]),
                     "share_of_id": float(c[j] / n_x[j])} for j in order if c[j] > 0])
    return out


def maxvio_of_choices(experts_NK: np.ndarray, num_experts: int, batch_tokens: int) -> dict[str, float]:
    """MaxVio (Wang et al. 2024: max over experts of load / mean load - 1) of one layer's routing
    decisions on held-out tokens: ``global`` over all N tokens, ``batch`` the mean over consecutive
    batches of ``batch_tokens`` tokens (their MaxVio_batch; a shorter tail is dropped)."""
    load_E = np.bincount(experts_NK.reshape(-1), minlength=num_experts).astype(np.float64)
    n_batches = max(1, experts_NK.shape[0] // batch_tokens)
    per_batch = []
    for b in range(n_batches):
        chunk = experts_NK[b * batch_tokens:(b + 1) * batch_tokens]
        counts = np.bincount(chunk.reshape(-1), minlength=num_experts).astype(np.float64)
        per_batch.append(counts.max() / counts.mean() - 1.0)
    return {"global": float(load_E.max() / load_E.mean() - 1.0), "batch": float(np.mean(per_batch))}


def held_out_maxvio(run_dir, max_tokens: int = 32768) -> dict:
    """MaxVio of a run's final weights on its own validation split, as Wang et al. (2024) report it (at the
    end of training, on held-out data): per MoE layer ``global`` and ``batch`` (batches of the run's
    global batch in tokens), and their means over layers."""
    from archlab.data import prepare_data
    from archlab.train.checkpoint import load_model

    model, cfg = load_model(run_dir)
    t = cfg.train
    S = int(t.seq_len)
    ids = np.asarray(prepare_data(cfg).val[:max_tokens], dtype=np.int64)
    topk = capture_topk(model, to_windows(ids, S))
    E = int(cfg.model.moe.num_experts)
    batch_tokens = int(t.micro_batch_size) * int(t.grad_accum) * S
    layers = {layer: maxvio_of_choices(e_NK, E, batch_tokens) for layer, e_NK in topk.items()}
    return {"layers": layers, "tokens": int(len(ids) // S * S), "batch_tokens": batch_tokens,
            "global": float(np.mean([v["global"] for v in layers.values()])),
            "batch": float(np.mean([v["batch"] for v in layers.values()]))}


def coactivation(experts_NK: np.ndarray, num_experts: int) -> np.ndarray:
    """(E, E) matrix C[a, b] = N(a, b) / N(a): over tokens that chose expert a, the share that
    also chose b, counting every pair of the K chosen experts. Diagonal 0; rows of experts never
    chosen are NaN."""
    N, K = experts_NK.shape
    onehot_NE = np.zeros((N, num_experts), dtype=np.float64)
    np.put_along_axis(onehot_NE, experts_NK, 1.0, axis=1)
    pairs_EE = onehot_NE.T @ onehot_NE  # [a, b] = tokens with both a and b (diagonal: N(a))
    n_a = np.diag(pairs_EE).copy()
    np.fill_diagonal(pairs_EE, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n_a[:, None] > 0, pairs_EE / n_a[:, None], np.nan)


def saturation(experts_a_NK: np.ndarray, experts_b_NK: np.ndarray) -> float:
    """Mean over tokens of |TopK_a ∩ TopK_b| / K (OLMoE's router saturation)."""
    if experts_a_NK.shape != experts_b_NK.shape:
        raise ValueError(f"saturation needs the same tokens and K: {experts_a_NK.shape} vs {experts_b_NK.shape}")
    K = experts_a_NK.shape[1]
    inter_N = (experts_a_NK[:, :, None] == experts_b_NK[:, None, :]).any(axis=2).sum(axis=1)
    return float(inter_N.mean() / K)


# --------------------------------------------------------------------------------------------
# the router trace a run wrote (train.router_trace_every)
# --------------------------------------------------------------------------------------------

TRACE_LEGEND = {
    "steps": "(P,) the traced optimizer steps",
    "skipped": "(P,) bool: that step's batch was skipped (non-finite loss)",
    "seconds": "(P,) host seconds the trainer spent collecting and writing that step's trace",
    "token_index": "(P, T) row n = b*S + s of the flattened (B, S) first micro-batch on rank 0",
    "row": "(P, T) the sequence b of that row in the micro-batch",
    "position": "(P, T) the position s of that row in its sequence",
    "token_id": "(P, T) the input token id",
    "experts": "(P, T, L, K) int64 chosen expert ids, in top-k order",
    "weights": "(P, T, L, K) float32 gate weights as applied",
    "dropped": "(P, T, L, K) bool: slot dropped by capacity",
    "logits": "(P, T, L, E) float32 raw router logits",
    "expert_bias": "(P, L, E) float32 aux-loss-free selection bias (runs that use it)",
}


def read_trace(run_dir) -> dict:
    """The router trace of a run (``router_trace/`` written with ``train.router_trace_every``), every
    traced step stacked: the arrays of :data:`TRACE_LEGEND` (P traced steps, T tokens per step, L
    MoE layers, K, E), plus ``layers`` (names "layer<i>", the L axis), ``num_experts``, ``top_k``,
    ``seq_len``, ``legend`` (that shape legend) and ``index`` (index.json as written).
    RunError when the run has no trace or a file is missing."""
    from archlab.io import read_jsonl
    from archlab.train.router_trace import INDEX, STEPS, TRACE_DIR

    folder = Path(run_dir) / TRACE_DIR
    try:
        index = json.loads((folder / INDEX).read_text())
    except (OSError, ValueError):
        raise RunError(f"{run_dir}: no router trace ({TRACE_DIR}/{INDEX}); train with train.router_trace_every=N") \
            from None
    by_step = {int(e["step"]): e for e in read_jsonl(folder / STEPS) if "step" in e and "file" in e}  # last wins
    entries = [by_step[s] for s in sorted(by_step)]
    if not entries:
        raise RunError(f"{folder / STEPS}: no traced step listed")
    per_step: dict[str, list] = {}
    for e in entries:
        path = folder / e["file"]
        if not path.is_file():
            raise RunError(f"{path}: listed in {INDEX} but missing")
        with np.load(path) as z:
            for k in z.files:
                per_step.setdefault(k, []).append(z[k])
    out = {k: np.stack(v) for k, v in per_step.items()}
    out["experts"] = out["experts"].astype(np.int64)
    S = int(index["seq_len"])
    out["row"], out["position"] = out["token_index"] // S, out["token_index"] % S
    out["steps"] = np.asarray([e["step"] for e in entries], dtype=np.int64)
    out["skipped"] = np.asarray([bool(e.get("skipped", False)) for e in entries])
    out["seconds"] = np.asarray([float(e.get("seconds", math.nan)) for e in entries])
    out.update({"layers": list(index["layers"]), "num_experts": int(index["num_experts"]),
                "top_k": int(index["top_k"]), "seq_len": S, "legend": dict(TRACE_LEGEND), "index": index})
    return out


def trace_summary(trace: dict) -> dict:
    """What summary.json says about a router trace: steps, tokens, and its measured host cost."""
    P, T, L, K = trace["experts"].shape
    secs = trace["seconds"][np.isfinite(trace["seconds"])]
    return {"steps": int(P), "first_step": int(trace["steps"][0]), "last_step": int(trace["steps"][-1]),
            "tokens_per_step": int(T), "layers": trace["layers"], "top_k": int(K),
            "num_experts": int(trace["num_experts"]),
            "mean_seconds_per_traced_step": float(secs.mean()) if len(secs) else None,
            "dropped_slot_fraction": float(trace["dropped"].mean())}


# --------------------------------------------------------------------------------------------
# capturing routing decisions
# --------------------------------------------------------------------------------------------


def moe_routers(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """layer name ("layer<i>", i = decoder block index) -> that block's router module."""
    out = {}
    for i, block in enumerate(getattr(model, "blocks", [])):
        router = getattr(getattr(block, "ffn", None), "router", None)
        if getattr(block, "is_moe", False) and router is not None:
            out[f"layer{i}"] = router
    return out


@torch.no_grad()
def capture_topk(model: torch.nn.Module, windows_BS: torch.Tensor, batch_size: int = 16) -> dict[str, np.ndarray]:
    """Run the model (eval mode) over token windows; return layer -> (N, K) chosen expert ids,
    N = B*S tokens in row-major order of ``windows_BS``. A forward hook on each router reads the
    ``experts_NK`` of its output; no model code is changed."""
    routers = moe_routers(model)
    if not routers:
        raise RunError("the model has no MoE layer: routing inspection needs an MoE run")
    captured: dict[str, list[torch.Tensor]] = {name: [] for name in routers}
    hooks = [r.register_forward_hook(lambda mod, inp, out, name=name: captured[name].append(out.experts_NK.cpu()))
             for name, r in routers.items()]
    was_training = model.training
    model.eval()
    try:
        for i in range(0, windows_BS.shape[0], batch_size):
            model(windows_BS[i:i + batch_size])
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)
    return {name: torch.cat(chunks).numpy() for name, chunks in captured.items()}


def held_out_tokens(run: Run, text_paths: Sequence[str], max_tokens: int) -> tuple[np.ndarray, str]:
    """Token ids to analyse: ``--text`` files through the run's tokenizer, else the run's own
    validation split. Returns (ids, description)."""
    if text_paths:
        from archlab.data import Tokenizer

        tok_path = run.path / "tokenizer.json"
        if not tok_path.is_file():
            raise RunError(f"{run.path}: tokenizer.json missing; cannot tokenise --text")
        tok = Tokenizer.load(tok_path)
        files = []
        for t in text_paths:
            matches = sorted(glob.glob(t)) if glob.has_magic(t) else [t]
            if not matches or not all(Path(m).is_file() for m in matches):
                raise RunError(f"--text {t}: no such file")
            files += matches
        ids = []
        for f in files:
            try:
                ids += tok.encode(Path(f).read_text(encoding="utf-8"))
            except UnicodeDecodeError:
                raise RunError(f"--text {f}: not UTF-8 text") from None
            if len(ids) >= max_tokens:
                break
        return np.asarray(ids[:max_tokens], dtype=np.int64), f"{len(files)} --text file(s)"
    from archlab.data import prepare_data

    data = prepare_data(run.recipe)
    return np.asarray(data.val[:max_tokens], dtype=np.int64), "the run's validation split"


def to_windows(ids: np.ndarray, seq_len: int) -> torch.Tensor:
    """Non-overlapping (B, S) windows of the ids (a shorter tail is dropped)."""
    B = len(ids) // seq_len
    if B == 0:
        raise RunError(f"held-out text too short: {len(ids)} tokens, fewer than one window of seq_len={seq_len}")
    return torch.from_numpy(ids[: B * seq_len].reshape(B, seq_len).copy())


def checkpoint_step(path: Path) -> int:
    m = re.search(r"step_(\d+)", Path(path).name)
    return int(m.group(1)) if m else -1


# --------------------------------------------------------------------------------------------
# plots
# --------------------------------------------------------------------------------------------


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
        ax.legend(fontsize=8, title="MoE layer", title_fontsize=8, loc="upper right", framealpha=0.7)
    note = "\nno token-slot dropped in any record (dropless routing or ample capacity)" if none_dropped else ""
    fig.suptitle(f"{run_name}: load balance over training{note}")
    fig.tight_layout()
    return save_figure(fig, path)


def expert_telemetry(s: dict) -> dict[str, np.ndarray]:
    """One layer's per-record tokens-per-expert numbers: ``min``, ``max``, ``std`` (population),
    ``mean``, ``dead`` (experts with zero tokens) and ``starved`` (under ``STARVED_FRACTION`` of the
    mean), each (T,) and counted over each record's window; as logged where the records have them,
    else from the logged ``tokens_per_expert`` lists (runs from before they were logged). Also
    ``dropped_tokens`` where logged."""
    out: dict[str, np.ndarray] = {}
    c_TE = s.get("tokens_per_expert")
    if c_TE is not None and c_TE.ndim == 2:
        out.update({"min": c_TE.min(axis=1), "max": c_TE.max(axis=1), "std": c_TE.std(axis=1),
                    "mean": c_TE.mean(axis=1), "dead": (c_TE == 0).sum(axis=1).astype(float),
                    "starved": ((c_TE > 0) & (c_TE < STARVED_FRACTION * c_TE.mean(axis=1, keepdims=True)))
                    .sum(axis=1).astype(float)})
    for key, name in (("tokens_per_expert_min", "min"), ("tokens_per_expert_max", "max"),
                      ("tokens_per_expert_std", "std"), ("dead_experts", "dead"), ("starved_experts", "starved"),
                      ("dropped_tokens", "dropped_tokens")):
        if key in s and s[key].ndim == 1:
            out[name] = s[key]
    return out


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


# --------------------------------------------------------------------------------------------
# the program
# --------------------------------------------------------------------------------------------


def _resolve_ckpt(run: Run, spec: Optional[str]) -> Path:
    from archlab.train.checkpoint import CheckpointError, resolve_checkpoint

    try:
        return resolve_checkpoint(spec if spec else run.path)
    except CheckpointError as e:
        raise RunError(str(e)) from None


def inspect_checkpoint(run: Run, ckpt: Path, compare: Sequence[Path], text: Sequence[str], max_tokens: int,
                       min_count: int) -> dict:
    """Specialisation, top tokens, co-activation and saturation from a checkpoint."""
    from archlab.train.checkpoint import CheckpointError, load_model

    try:
        model, cfg = load_model(ckpt)
    except CheckpointError as e:
        raise RunError(str(e)) from None
    ids, source = held_out_tokens(run, text, max_tokens)
    windows = to_windows(ids, int(cfg.train.seq_len))
    tokens_N = windows.reshape(-1).numpy()
    topk = capture_topk(model, windows)
    E = int(cfg.model.moe.num_experts)
    decode = _decoder(run)
    spec = {layer: specialisation(tokens_N, e_NK, E, min_count) for layer, e_NK in topk.items()}
    coact = {layer: coactivation(e_NK, E) for layer, e_NK in topk.items()}
    sat = {}
    for other in compare:
        try:
            m2, _ = load_model(other)
        except CheckpointError as e:
            raise RunError(str(e)) from None
        t2 = capture_topk(m2, windows)
        sat[checkpoint_step(other)] = {layer: saturation(t2[layer], topk[layer]) for layer in topk}
    return {"checkpoint": str(ckpt), "step": checkpoint_step(ckpt), "tokens": int(len(tokens_N)), "source": source,
            "spec": spec, "coact": coact, "saturation": sat,
            "top_tokens": {layer: top_tokens(spec[layer], decode, min_count=min_count) for layer in spec}}


def _decoder(run: Run):
    tok_path = run.path / "tokenizer.json"
    if tok_path.is_file():
        from archlab.data import Tokenizer

        tok = Tokenizer.load(tok_path)
        return lambda i: tok.decode([i])
    return lambda i: f"<{i}>"


def training_summary(series: dict[str, dict]) -> dict:
    out = {}
    for layer, s in series.items():
        d = {"records": int(len(s["step"])), "first_step": float(s["step"][0]), "last_step": float(s["step"][-1])}
        for k in ("maxvio", "router_entropy", "dropped_fraction", "cv", "dead_experts", "dropped_tokens"):
            if k in s and s[k].ndim == 1:
                d[f"{k}_first"], d[f"{k}_last"] = float(s[k][0]), float(s[k][-1])
        load = load_matrix(s)
        if load is not None:
            d["final_load"] = load[-1].tolist()
        if "bias" in s and s["bias"].ndim == 2:
            d["final_bias"] = s["bias"][-1].tolist()
        out[layer] = d
    return out


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
        lines += ["", f"## Checkpoint step {ck['step']} over {ck['tokens']} tokens of {ck['source']}", "",
                  "| layer | specialisation (mean over ids) | weighted | token ids | random ~ K/E |",
                  "|---|---|---|---|---|"]
        for layer, s in ck["spec"].items():
            lines.append(f"| {layer} | {s['mean']:.3f} | {s['weighted_mean']:.3f} | {s['n_token_ids']} "
                         f"| {s['uniform_baseline']:.3f} |")
        if ck["saturation"]:
            lines += ["", "Router saturation against this checkpoint:", ""]
            for step, per in sorted(ck["saturation"].items()):
                lines.append(f"- step {step}: " + ", ".join(f"{layer} {v:.3f}" for layer, v in per.items()))
        lines += ["", "Top tokens per expert (first MoE layer):", ""]
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
    steps (:func:`analysis.routing_health.expert_health`)."""
    run = open_run(run_dir)
    if not run.is_moe:
        raise RunError(f"{run.path}: a dense run (recipe has no model.moe); routing inspection needs an MoE run")
    if run.status == "incomplete" and not allow_incomplete:
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
            from archlab.train.checkpoint import checkpoints

            others = [c for c in checkpoints(run.path) if c.resolve() != ckpt.resolve()]
        ck = inspect_checkpoint(run, ckpt, others, text, max_tokens, min_count)
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
            "saturation": {str(s): v for s, v in ck["saturation"].items()},
            "top_tokens": ck["top_tokens"],
        }
    write_json_atomic(out / "summary.json", summary)
    write_text_atomic(out / "summary.md", _markdown(run, train, ck, files + ["summary.json"], health))
    return summary


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.routing", description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", help="an MoE run folder (written by python -m archlab.train)")
    ap.add_argument("--out", type=Path, required=True, help="folder for the PNGs and summary.json / summary.md")
    ap.add_argument("--checkpoint", help="checkpoint folder to analyse (default: the run's newest complete one)")
    ap.add_argument("--compare", nargs="+", default=(), metavar="CKPT",
                    help="checkpoints for router saturation (default: the run's other checkpoints)")
    ap.add_argument("--text", nargs="+", default=(), metavar="FILE",
                    help="held-out UTF-8 text files or globs (default: the run's validation split)")
    ap.add_argument("--max-tokens", type=int, default=32768, help="held-out tokens to route (default 32768)")
    ap.add_argument("--min-count", type=int, default=5,
                    help="token ids seen fewer times are left out of specialisation")
    ap.add_argument("--no-checkpoint", action="store_true", help="only the over-training plots")
    ap.add_argument("--starved-fraction", type=float, default=STARVED_FRACTION,
                    help=f"an expert under this fraction of the uniform load is starved (default {STARVED_FRACTION:g})")
    ap.add_argument("--starved-window", type=float, metavar="STEPS",
                    help="dead and starved experts over the last STEPS training steps (default: the last fifth)")
    ap.add_argument("--allow-incomplete", action="store_true", help="inspect a run that has not finished")
    args = ap.parse_args(argv)
    try:
        if args.max_tokens <= 0 or args.min_count <= 0:
            raise ValueError("--max-tokens and --min-count must be positive")
        if not 0 < args.starved_fraction < 1:
            raise ValueError(f"--starved-fraction {args.starved_fraction:g}: must lie in (0, 1) (of the uniform load)")
        if args.starved_window is not None and not args.starved_window > 0:
            raise ValueError(f"--starved-window {args.starved_window:g}: must be > 0 (training steps)")
        analyse(args.run, args.out, args.checkpoint, args.compare, args.text, args.max_tokens,
                args.min_count, not args.no_checkpoint, args.allow_incomplete, args.starved_fraction,
                args.starved_window)
    except (RunError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print((args.out / "summary.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
