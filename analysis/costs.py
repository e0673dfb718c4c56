"""Compare what recipes cost, from their configs alone: parameters, FLOPs per token, memory.

    python -m analysis.costs recipes/dense/tiny.yaml recipes/llama/tiny.yaml --seq-len 1024
    python -m analysis.costs recipes/mixtral --format csv --out docs/costs
    python -m analysis.costs plan recipes/dense/350m.yaml --launch recipes/launch/zero1.yaml --gpus 8 --gpu h100
    python -m analysis.costs plan recipes/mixtral/1b.yaml model.moe.ep_size=8 --launch recipes/launch/zero2.yaml

``plan RECIPE``: one recipe before a GPU is rented (archlab.costs.plan): per-GPU bytes of its training step
under a launch config (accelerate YAML or DeepSpeed JSON: processes, DeepSpeed, ZeRO stage; --gpus overrides
the processes) and its precision regime, whether that fits the GPU, tokens/s at --mfu and the hours and
GPU-hours to its token budget.

One row per recipe: parameters (total, embedding, non-embedding, active per token), forward and
training matmul FLOPs per token at the context length, KV-cache bytes per token of context, and
the per-rank memory of a training step (weights + gradients + AdamW states + activations of one
micro-batch of train.micro_batch_size sequences). Conventions (archlab.costs): attention FLOPs
count the full S x S square (the causally useful part is reported beside it); training = 3 x
forward; activations are what autograd keeps for backward on the chosen device.

``--out DIR`` writes flops_breakdown.png (training FLOPs per token by component, stacked, and as
shares), memory_breakdown.png (training memory per rank by part, and its activations by component) and
costs.<format>. The charts draw every component the cost model counts. A recipe whose memory has a
reason to state (a sliding window's banded attention kernel) is marked [a], with the note below the
table and the chart (csv: the ``memory_notes`` column; json: ``memory_notes``).
A folder argument stands for the recipes (*.yaml) in it.

A cell that a component cannot model (it raises NotImplementedError rather than guess, e.g. a
component without an activation-memory model on the chosen device) is shown as ``not modelled
[n]`` with footnote n giving the reason; every other cell and recipe is printed (csv: an empty
cell and the reason in the ``not_modelled`` column; json: null and ``"not_modelled": {column:
reason}``; the charts leave such a recipe out). Exit status: 0 when anything was computed, 1 when
nothing could be (every cell not modelled), 2 for invalid input (a missing or invalid recipe, a
--seq-len beyond a recipe's positions, sizes that do not divide).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from pathlib import Path
from typing import Optional, Sequence

from omegaconf import OmegaConf

import archlab
from analysis.plotting import COLORS, pyplot, save_figure, stacked_bars, style_axes, unit_scale
from archlab.config import RecipeError
from archlab.costs import activation_memory, kv_cache_bytes, param_counts, training_flops, training_memory
from archlab.costs.flops import forward_flops
from archlab.costs.plan import GPUS, format_plan, read_launch, training_plan
from archlab.io import write_text_atomic
from archlab.nn.attention.base import ATTENTIONS, attention_class
from archlab.nn.component import ActShape
from archlab.nn.positions import position_class

FLOPS_LABELS = {
    "qkv_proj": "QKV projection", "out_proj": "attention output projection",
    "attn_scores": "attention scores (Q K^T)", "attn_values": "attention-weighted V",
    "mlp": "dense MLP", "experts": "MoE experts (K routed + shared)", "router": "MoE router",
    "lm_head": "LM head (logits)", "mtp": "MTP modules", "head_transform": "MLM head transform (dense D x D)",
    "cross_attention": "cross-attention (decoder; K/V of the encoder output)",
}
MEMORY_LABELS = {"weights": "weights", "grads": "gradients", "optimizer": "AdamW states",
                 "activations": "activations (1 micro-batch)"}
ACTIVATION_LABELS = {"embedding": "token ids, embedding", "positions": "RoPE tables", "norms": "norms",
                     "attention": "self-attention", "ffn": "dense MLP", "moe": "MoE (router + experts)",
                     "dropout": "dropout masks", "checkpoint": "checkpointed layer inputs",
                     "cross_attention": "cross-attention (decoder)",
                     "memory": "encoder output (cross-attention K/V input)", "head": "final norm(s)",
                     "embed_norm": "embedding norm", "head_transform": "MLM head transform", "mtp": "MTP modules",
                     "loss": "LM head + loss (fused: grads of h, W; logits: h, log-softmax)",
                     "recompute_peak": "one block recomputed (backward peak)"}
# an encoder-decoder's per-stack parts, drawn with the component they are (the cost model's names -> a label's key)
ACTIVATION_GROUPS = {"cross_norm": "norms", "cross_dropout": "dropout"}
FLOP_UNITS = [(1.0, "FLOP"), (1e3, "kFLOP"), (1e6, "MFLOP"), (1e9, "GFLOP"), (1e12, "TFLOP")]
BYTE_UNITS = [(1.0, "B"), (2.0**10, "KiB"), (2.0**20, "MiB"), (2.0**30, "GiB"), (2.0**40, "TiB")]


LAUNCH_KEYS = ("compute_environment", "distributed_type")  # accelerate config files (recipes/launch/)


def _launch_config(path: Path) -> bool:
    """An accelerate launch config (``accelerate launch --config_file``), not a recipe."""
    try:
        node = OmegaConf.to_container(OmegaConf.load(path))
    except Exception:  # unreadable or not YAML: the recipe loader says what is wrong with it
        return False
    return isinstance(node, dict) and any(k in node for k in LAUNCH_KEYS)


def expand(inputs: Sequence[str], note=lambda msg: print(f"note: {msg}", file=sys.stderr)) -> list[Path]:
    """Recipe paths; a folder stands for the *.yaml files under it, searched recursively. Launch configs
    (accelerate's, e.g. recipes/launch/*.yaml) are skipped with a note. Fails on a missing path and when
    no recipe is left."""
    out: list[Path] = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            found = sorted(p.rglob("*.yaml"))
            if not found:
                raise RecipeError(f"{p}: folder holds no recipe (*.yaml)")
        elif p.exists():
            found = [p]
        else:
            raise RecipeError(f"{p}: no such recipe file or folder")
        for f in found:
            if _launch_config(f):
                note(f"skipped {f}: an accelerate launch config (accelerate launch --config_file), not a recipe")
            else:
                out.append(f)
    if not out:
        raise RecipeError(f"{' '.join(inputs)}: no recipe left (launch configs are not recipes)")
    return out


# the cells of a row, by what computes them: a component that cannot model one (NotImplementedError)
# leaves that group "not modelled", never the row or the table
CELL_GROUPS = {
    "params": ("params_total", "params_embedding", "params_non_embedding", "params_active"),
    "flops": ("fwd_flops_per_token", "train_flops_per_token", "attention_causal_useful_fwd", "flops_breakdown"),
    "kv_cache": ("kv_cache_bytes_per_token", "state_bytes_per_sequence"),
    "memory": ("train_memory_bytes", "memory_breakdown", "activation_breakdown"),
}


BANDED_KERNELS = {  # why a sliding window's banded blocks keep more than full causal attention, by SDPA kernel
    "math": "its banded blocks need an explicit band mask{why}, so SDPA's math kernel runs them: fp32 copies of "
            "q, k and v over all {H} heads and the fp32 probabilities of each 2W-key block are kept",
    "efficient": "memory-efficient attention runs its banded blocks with an additive band mask: the padded "
                 "blocks, the mask tiles and the padded log-sum-exp are kept",
    "flash": "SDPA's flash kernel runs its padded banded blocks with an explicit band mask (one per block), "
             "kept with the blocks and a copy of the output",
}


def attention_notes(cfg, batch: int, seq_len: int, precision: str, device: str) -> list[str]:
    """Why a recipe's attention keeps more activation memory than full causal attention (``mha``) at the
    same shape, when it does: a sliding window's banded path (``banded_kernel``) and the SDPA kernel that
    runs it on ``device``. Empty otherwise."""
    attention = attention_class(cfg)
    band_shape, kernel = getattr(attention, "_band_shape", None), getattr(attention, "banded_kernel", None)
    act = 2 if precision == "bf16" else 4
    s = ActShape(cfg, batch, seq_len, act, act if device == "cpu" else 1, device)
    if band_shape is None or kernel is None or all(band_shape(s, i) is None for i in range(cfg.n_layers)):
        return []
    own = sum(attention.saved_bytes(s, layer=i) for i in range(cfg.n_layers))
    full = sum(ATTENTIONS.get("mha").saved_bytes(s, layer=i) for i in range(cfg.n_layers))
    if own <= full:
        return []
    name, H, G = kernel(s), cfg.n_heads, cfg.kv_heads
    why = ""
    if name == "math" and device == "cuda":
        why = (" (CUDA's flash kernel takes no mask" + (f"; memory-efficient attention takes no grouped K/V heads, "
                                                         f"{H} query / {G} KV heads)" if G != H else ")"))
    reason = BANDED_KERNELS[name].format(why=why, H=H)
    return [f"its attention keeps {_human(own, BYTE_UNITS)} for backward (no checkpointing), full causal "
            f"attention {_human(full, BYTE_UNITS)} at batch {batch}, seq {seq_len}: the sliding window "
            f"({cfg.attention.window} < seq {seq_len}) runs banded; on {device} {reason}"
            + (" (derived from torch's SDPA dispatch, not measured on a GPU)" if device == "cuda" else "")]


def recipe_costs(path: Path, seq_len: Optional[int], batch: Optional[int], precision: str, zero_stage: int,
                 dp: int, device: str, checkpointing="none", ep: Optional[int] = None, loss: str = "fused") -> dict:
    """All the numbers of one recipe (raw units: parameters, FLOPs, bytes).

    ``not_modelled`` maps each key a component could not model to the reason (its value is None);
    RecipeError / ValueError for invalid input."""
    try:
        recipe = archlab.load_recipe(path)
    except RecipeError as e:
        raise RecipeError(e if str(path) in str(e) else f"{path}: not a valid recipe: {e}") from None
    cfg = archlab.model_config(recipe)
    S = seq_len or recipe.train.seq_len
    B = batch or recipe.train.micro_batch_size
    limit = position_class(cfg).max_length(cfg)
    if limit is not None and S > limit:
        raise RecipeError(f"{path}: --seq-len {S} is beyond its {cfg.position.type} positions (up to {limit}, "
                          f"model.max_seq_len={cfg.max_seq_len}); pass a smaller --seq-len")
    ep = ep if cfg.moe is not None else None  # dense recipes have no experts to shard

    def params() -> dict:
        p = param_counts(cfg)
        return {"params_total": p.total, "params_embedding": p.embedding, "params_non_embedding": p.non_embedding,
                "params_active": p.active}

    def flops() -> dict:
        fwd, train = forward_flops(cfg, S), training_flops(cfg, S)
        return {"fwd_flops_per_token": fwd.total, "train_flops_per_token": train.total,
                "attention_causal_useful_fwd": fwd.attention_causal_useful, "flops_breakdown": train.components()}

    def kv_cache() -> dict:
        # what grows with the context (attention's K/V) and what does not (a linear-attention layer's state)
        one, two = (kv_cache_bytes(cfg, batch=1, context=c, dtype="bf16") for c in (1, 2))
        return {"kv_cache_bytes_per_token": two - one, "state_bytes_per_sequence": 2 * one - two}

    def memory() -> dict:
        mem = training_memory(cfg, B, S, precision=precision, zero_stage=zero_stage, dp=dp, ep=ep, device=device,
                              checkpointing=checkpointing, loss=loss)
        acts = activation_memory(cfg, B, S, dtype=precision, device=device, checkpointing=checkpointing, loss=loss)
        return {"train_memory_bytes": mem["total"], "memory_breakdown": {k: mem[k] for k in MEMORY_LABELS},
                "activation_breakdown": {**acts.by_component(), "recompute_peak": acts.recompute_peak},
                "memory_notes": attention_notes(cfg, B, S, precision, device)}

    row: dict = {"recipe": recipe.name, "path": str(path), "family": recipe.family, "seq_len": S, "batch": B}
    not_modelled: dict[str, str] = {}
    for group, compute in (("params", params), ("flops", flops), ("kv_cache", kv_cache), ("memory", memory)):
        try:
            row.update(compute())
        except ValueError as e:  # sizes that do not fit the recipe (e.g. --ep): invalid input
            raise ValueError(f"{path}: {e}") from None
        except NotImplementedError as e:  # a component without a model for these settings: never a guess
            what = f"no activation-memory model for --device {device}" if group == "memory" else f"no {group} model"
            for key in CELL_GROUPS[group]:
                row[key] = None
                not_modelled[key] = f"{what}: {e}" if str(e) else what
    row["not_modelled"] = not_modelled
    return row


def modelled(rows: list[dict], key: str) -> list[dict]:
    """The rows whose ``key`` was computed."""
    return [r for r in rows if r.get(key) is not None]


def footnotes(rows: list[dict]) -> tuple[dict[tuple[int, str], int], list[str]]:
    """({(row index, column): footnote number}, footnote lines) for the table's cells not
    modelled: one footnote per set of columns and reason, naming the recipes it applies to."""
    headers = dict(zip(COLUMNS, HEADERS))
    notes: dict[tuple[str, str], list[str]] = {}  # (columns, reason) -> recipes
    cells: dict[tuple[int, str], tuple[str, str]] = {}
    for i, r in enumerate(rows):
        by_reason: dict[str, list[str]] = {}
        for key, reason in r.get("not_modelled", {}).items():
            if key in headers:
                by_reason.setdefault(reason, []).append(key)
        for reason, keys in by_reason.items():
            note = (", ".join(headers[k] for k in keys), reason)
            notes.setdefault(note, []).append(r["recipe"])
            cells.update({(i, k): note for k in keys})
    number = {note: n for n, note in enumerate(notes, 1)}
    lines = [f"[{number[note]}] {', '.join(recipes)}: {note[0]} not modelled: {note[1]}"
             for note, recipes in notes.items()]
    return {cell: number[note] for cell, note in cells.items()}, lines


def _human(x: float, units) -> str:
    factor, unit = unit_scale([x], units)
    return f"{x / factor:.3g} {unit}"


def _count(n: float) -> str:
    for factor, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= factor:
            return f"{n / factor:.3g}{suffix}"
    return f"{n:.0f}"


COLUMNS = ["recipe", "params_total", "params_embedding", "params_non_embedding", "params_active",
           "fwd_flops_per_token", "train_flops_per_token", "kv_cache_bytes_per_token", "state_bytes_per_sequence",
           "train_memory_bytes"]
HEADERS = ["recipe", "params", "embedding", "non-emb.", "active", "fwd FLOP/tok", "train FLOP/tok",
           "KV cache/tok (bf16)", "state/seq", "train mem/rank"]


def memory_notes(rows: list[dict]) -> tuple[dict[int, str], list[str]]:
    """({row index: mark}, note lines) for the rows whose memory has a note (:func:`attention_notes`): marks
    [a], [b], ... so that they differ from the numbered not-modelled footnotes."""
    marks: dict[int, str] = {}
    lines: list[str] = []
    for i, r in enumerate(rows):
        if r.get("memory_notes"):
            marks[i] = f"[{chr(ord('a') + len(marks) % 26)}]"
            lines += [f"{marks[i]} {r['recipe']}: train mem/rank: {note}" for note in r["memory_notes"]]
    return marks, lines


def format_table(rows: list[dict]) -> str:
    """An aligned text table with readable units; a cell not modelled reads ``not modelled [n]``,
    footnote n below the table says why; a memory cell marked [a] has a note below saying why it is large."""
    numbers, notes = footnotes(rows)
    marks, mem_notes = memory_notes(rows)
    formats = [_count] * 4 + [lambda x: _human(x, FLOP_UNITS)] * 2 + [lambda x: _human(x, BYTE_UNITS)] * 3

    def cell(i: int, key: str, fmt) -> str:
        value = rows[i].get(key)
        if value is None:
            return f"not modelled [{numbers[(i, key)]}]"
        return fmt(value) + (f" {marks[i]}" if key == "train_memory_bytes" and i in marks else "")

    header = HEADERS[:1] + ["seq_len"] + HEADERS[1:]  # each row's own context length
    cells = [header] + [[r["recipe"], str(r["seq_len"])] + [cell(i, k, f) for k, f in zip(COLUMNS[1:], formats)]
                        for i, r in enumerate(rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    batches = sorted({r["batch"] for r in rows})
    lines.append("\nseq_len: each recipe's train.seq_len unless --seq-len; memory: batch "
                 f"{', '.join(map(str, batches))} per rank (each recipe's train.micro_batch_size unless --batch); "
                 "full attention counts the S x S square, a sliding window its band.")
    return "\n".join(lines + notes + mem_notes)


def format_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    flops_keys = list(FLOPS_LABELS)
    writer.writerow(COLUMNS + ["seq_len", "batch"] + [f"train_flops_{k}" for k in flops_keys]
                    + [f"memory_{k}" for k in MEMORY_LABELS] + ["not_modelled", "memory_notes"])
    for r in rows:  # a cell not modelled is empty; not_modelled says why ("column: reason; ...")
        flops, memory = r.get("flops_breakdown") or {}, r.get("memory_breakdown") or {}
        writer.writerow([r.get(c) for c in COLUMNS] + [r["seq_len"], r["batch"]]
                        + [flops.get(k) for k in flops_keys] + [memory.get(k) for k in MEMORY_LABELS]
                        + ["; ".join(f"{k}: {why}" for k, why in r.get("not_modelled", {}).items()),
                           "; ".join(r.get("memory_notes") or [])])
    return buf.getvalue()


def format_rows(rows: list[dict], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(rows, indent=2) + "\n"
    if fmt == "csv":
        return format_csv(rows)
    return format_table(rows) + "\n"


def flops_parts(rows: list[dict]) -> dict[str, list[float]]:
    """The FLOPs charts' data: label -> training FLOPs per token of each row, one series per component of the
    cost model's breakdown (``FlopsBreakdown.components()``; a component without a label is drawn under its
    own name), so that the series of a row sum to its total."""
    keys = list(FLOPS_LABELS) + [k for r in rows for k in r["flops_breakdown"] if k not in FLOPS_LABELS]
    return {FLOPS_LABELS.get(k, k.replace("_", " ")): [r["flops_breakdown"].get(k, 0.0) for r in rows]
            for k in dict.fromkeys(keys)}


def flops_shares(rows: list[dict]) -> dict[str, list[float]]:
    """The share chart's data: :func:`flops_parts` as % of each row's training FLOPs per token (sum: 100)."""
    return {k: [100 * v / r["train_flops_per_token"] for v, r in zip(values, rows)]
            for k, values in flops_parts(rows).items()}


def activation_parts(rows: list[dict]) -> dict[str, list[float]]:
    """The activation panel's data: label -> bytes of each row. Every key of the cost model's
    ``activation_breakdown`` is drawn: an encoder-decoder's ``encoder_X`` and ``decoder_X`` under X (both
    stacks), its cross-attention norm and dropout with the norms and dropout, a key without a label under its
    own name; so each row's series sum to the memory panel's activations."""
    def group(key: str) -> str:
        for prefix in ("encoder_", "decoder_"):
            if key.startswith(prefix) and key[len(prefix):] in ACTIVATION_LABELS:
                return key[len(prefix):]
        return ACTIVATION_GROUPS.get(key, key)

    keys = list(ACTIVATION_LABELS) + [group(k) for r in rows for k in r["activation_breakdown"]]
    parts = {k: [0.0] * len(rows) for k in dict.fromkeys(keys)}
    for i, r in enumerate(rows):
        for k, v in r["activation_breakdown"].items():
            parts[group(k)][i] += v
    return {ACTIVATION_LABELS.get(k, k.replace("_", " ")): v for k, v in parts.items()}


def _stack(ax, labels: list[str], parts: dict[str, list[float]], headroom: float = 1.0) -> None:
    """:func:`stacked_bars` of the series that are not zero everywhere, each in its own colour (tab20 when
    there are more series than the palette)."""
    parts = {k: v for k, v in parts.items() if any(v)}
    stacked_bars(ax, labels, parts, headroom=headroom)
    if len(parts) > len(COLORS):
        cmap = pyplot().get_cmap("tab20")
        for i, bars in enumerate(ax.containers):
            for patch in bars:
                patch.set_facecolor(cmap(i % 20))


def _labels(rows: list[dict], keys: Sequence[str]) -> tuple[list[str], str]:
    """Bar labels and a title suffix: shared run shapes (seq_len, batch) go in the title, shapes
    that differ between recipes under each bar."""
    names = {"seq_len": "seq", "batch": "batch"}
    shared = [k for k in keys if len({r[k] for r in rows}) == 1]
    labels = [r["recipe"] + "".join(f"\n{names[k]} {r[k]}" for k in keys if k not in shared) for r in rows]
    return labels, ", ".join(f"{names[k]} {rows[0][k]}" for k in shared)


MANY = 8  # more recipes than this: one horizontal bar per recipe (names readable), totals on a log scale


def _many(rows: list[dict], labels: list[str], panels: list[tuple], title: str, path: Path,
          notes: Sequence[str] = ()) -> Path:
    """A chart of many recipes: one row per recipe, each panel ``(kind, title, xlabel, data)``: kind "log", data
    the totals (a log scale, so that recipes 1000x apart are all readable), or "share", data {component: % per
    recipe} stacked to 100%."""
    from matplotlib.ticker import LogLocator

    plt = pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels) + 1.5, 0.3 * len(rows) + 1.8), sharey=True,
                             squeeze=False)
    y = list(range(len(rows)))
    for ax, (kind, sub, xlabel, data) in zip(axes[0], panels):
        if kind == "log":
            ax.barh(y, data, color=COLORS[0], height=0.65)
            ax.set_xscale("log")
            ax.xaxis.set_major_locator(LogLocator(base=10, numticks=8))
            ax.set_xlim(min(v for v in data if v > 0) / 2, max(data) * 2)
        else:
            left = [0.0] * len(rows)
            for i, (name, values) in enumerate(data.items()):
                if any(values):
                    ax.barh(y, values, left=left, height=0.65, label=name, color=COLORS[i % len(COLORS)])
                    left = [a + b for a, b in zip(left, values)]
            ax.set_xlim(0, 100)
        style_axes(ax, sub, xlabel, "recipe" if ax is axes[0][0] else "", grid="x", legend=kind != "log",
                   legend_title="component", legend_outside=True)
    axes[0][0].set_yticks(y, [label.replace("\n", ", ") for label in labels], fontsize=8)
    axes[0][0].set_ylim(len(rows) - 0.5, -0.5)
    fig.suptitle(title)
    fig.tight_layout(rect=_footer(fig, list(notes), fig.get_figheight()))
    return save_figure(fig, path)


def plot_flops(rows: list[dict], path: Path) -> Path:
    """Stacked training FLOPs per token by component: absolute, and as shares of the total (with more than
    :data:`MANY` recipes: one row each, the totals on a log scale beside the shares)."""
    if len(rows) > MANY:
        labels, shape = _labels(rows, ["seq_len"])
        factor, unit = unit_scale([r["train_flops_per_token"] for r in rows], FLOP_UNITS)
        return _many(rows, labels, [
            ("log", "Training FLOPs per token (log scale)", f"training FLOPs per token ({unit})",
             [r["train_flops_per_token"] / factor for r in rows]),
            ("share", "Share of each component", "share of training FLOPs (%)", flops_shares(rows))],
            f"Training FLOPs per token of {len(rows)} recipes"
            + (f" ({shape})" if shape else ""), path)
    plt = pyplot()
    labels, shape = _labels(rows, ["seq_len"])
    factor, unit = unit_scale([r["train_flops_per_token"] for r in rows], FLOP_UNITS)
    fig, (ax, ax_share) = plt.subplots(1, 2, figsize=(max(9.0, 1.6 * len(rows) + 6), 4.8))
    _stack(ax, labels, {k: [v / factor for v in values] for k, values in flops_parts(rows).items()})
    style_axes(ax, "Training FLOPs per token" + (f" ({shape})" if shape else ""), "recipe",
               f"training FLOPs per token ({unit})", legend=False)
    _stack(ax_share, labels, flops_shares(rows))
    style_axes(ax_share, "Share of each component", "recipe", "share of training FLOPs (%)",
               legend_title="component", legend_outside=True, legend_reversed=True)
    fig.tight_layout()
    return save_figure(fig, path)


def _footer(fig, notes: list[str], height: float) -> tuple[float, float, float, float]:
    """Write ``notes`` under the axes of ``fig`` (wrapped to its width); the ``tight_layout`` rect that leaves
    them room (``height``: the figure's height in inches before the notes)."""
    import textwrap

    if not notes:
        return (0, 0, 1, 1)
    width = int(fig.get_figwidth() * 14)  # characters of 8 pt text per line
    text = "\n".join(line for note in notes for line in textwrap.wrap(note, width, subsequent_indent="    "))
    lines = text.count("\n") + 1
    fig.set_figheight(height + 0.17 * lines + 0.2)
    fig.text(0.01, 0.01, text, fontsize=8, ha="left", va="bottom")
    return (0, (0.17 * lines + 0.2) / fig.get_figheight(), 1, 1)


def plot_memory(rows: list[dict], path: Path, precision: str, zero_stage: int, dp: int,
                device: Optional[str] = None) -> Path:
    """Training memory per rank by part (weights, gradients, AdamW states, activations), and the
    activations of one micro-batch by component, every component of the cost model drawn (with more than
    :data:`MANY` recipes: one row each, the totals on a log scale beside the shares of the parts). A recipe
    with a memory note (:func:`memory_notes`) is marked [a] and the note is written under the chart."""
    marks, notes = memory_notes(rows)
    on = f", {device} kernels" if device else ""
    if len(rows) > MANY:
        labels, shape = _labels(rows, ["batch", "seq_len"])
        labels = [r["recipe"] + (f" {marks[i]}" if i in marks else "") + label[len(r["recipe"]):]
                  for i, (r, label) in enumerate(zip(rows, labels))]
        factor, unit = unit_scale([r["train_memory_bytes"] for r in rows], BYTE_UNITS)
        a_factor, a_unit = unit_scale([sum(r["activation_breakdown"].values()) for r in rows], BYTE_UNITS)
        return _many(rows, labels, [
            ("log", "Training memory per rank (log scale)", f"memory per rank ({unit})",
             [r["train_memory_bytes"] / factor for r in rows]),
            ("share", "Share of each part", "share of the memory per rank (%)",
             {MEMORY_LABELS[k]: [100 * r["memory_breakdown"][k] / r["train_memory_bytes"] for r in rows]
              for k in MEMORY_LABELS}),
            ("log", "Activations kept for backward\n(one micro-batch, all layers; log scale)",
             f"activation memory ({a_unit})", [sum(r["activation_breakdown"].values()) / a_factor for r in rows])],
            f"Training memory of {len(rows)} recipes ({precision} AdamW, ZeRO-{zero_stage}, dp {dp}{on}"
            + (f", {shape})" if shape else ")"), path, notes)
    plt = pyplot()
    labels, shape = _labels(rows, ["batch", "seq_len"])
    labels = [r["recipe"] + (f" {marks[i]}" if i in marks else "") + label[len(r["recipe"]):]
              for i, (r, label) in enumerate(zip(rows, labels))]
    height = 4.8
    fig, (ax, ax_act) = plt.subplots(1, 2, figsize=(max(11.0, 2.0 * len(rows) + 7), height))
    factor, unit = unit_scale([r["train_memory_bytes"] for r in rows], BYTE_UNITS)
    _stack(ax, labels, {MEMORY_LABELS[k]: [r["memory_breakdown"][k] / factor for r in rows]
                        for k in MEMORY_LABELS}, headroom=1.45)
    style_axes(ax, f"Training memory per rank\n({precision} AdamW, ZeRO-{zero_stage}, dp {dp}{on}"
               + (f", {shape})" if shape else ")"), "recipe", f"memory per rank ({unit})",
               legend_title="part", legend_reversed=True)
    # the same unit as the left panel, so that each bar here reads as the red part of the bar there
    _stack(ax_act, labels, {k: [v / factor for v in values] for k, values in activation_parts(rows).items()})
    style_axes(ax_act, "Activations kept for backward, by component\n(the left panel's activations: one "
               "micro-batch, all layers)", "recipe", f"activation memory ({unit})", legend_title="component",
               legend_outside=True, legend_reversed=True)
    fig.tight_layout(rect=_footer(fig, notes, height))
    return save_figure(fig, path)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be a positive integer")
    return value


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m analysis.costs", description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("recipes", nargs="+", help="recipe YAML files, or folders of them")
    ap.add_argument("--seq-len", type=_positive_int, help="context length (default: each recipe's train.seq_len)")
    ap.add_argument("--batch", type=_positive_int,
                    help="micro-batch per rank for memory (default: train.micro_batch_size)")
    ap.add_argument("--format", choices=["table", "csv", "json"], default="table",
                    help="output format (default table)")
    ap.add_argument("--precision", choices=["bf16", "fp32"], default="bf16",
                    help="bf16 mixed precision or fp32 training (default bf16)")
    ap.add_argument("--zero-stage", type=int, choices=[0, 1, 2, 3], default=0, help="DeepSpeed ZeRO stage (default 0)")
    ap.add_argument("--dp", type=_positive_int, default=1, help="data-parallel ranks (default 1)")
    ap.add_argument("--ep", type=_positive_int,
                    help="expert-parallel ranks for MoE recipes (default: the recipe's moe.ep_size); must divide --dp")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="device the activation estimate is for (kernels differ; default cuda)")
    ap.add_argument("--checkpointing", nargs="?", const="full", default="none", choices=["none", "full", "selective"],
                    help="activation checkpointing of the blocks, as train.activation_checkpointing (bare: full)")
    ap.add_argument("--loss", choices=["fused", "logits"], default="fused",
                    help="LM head + loss: the trainer's fused one (default) or cross-entropy on fp32 logits")
    ap.add_argument("--out", type=Path, help="folder for flops_breakdown.png, memory_breakdown.png, costs.<format>")
    return ap


def _fraction(text: str) -> float:
    try:
        value = float(text.rstrip("%")) / (100 if text.endswith("%") else 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text} must be a fraction in (0, 1] (or a percentage, e.g. 40%)")
    return value


def build_plan_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m analysis.costs plan",
                                 description="Per-GPU memory, fit, throughput and hours of one recipe's training.")
    ap.add_argument("recipe", help="recipe YAML file")
    ap.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                    help="recipe overrides as archlab.train takes them, e.g. model.moe.ep_size=8")
    ap.add_argument("--launch", type=Path,
                    help="accelerate config (recipes/launch/*.yaml) or DeepSpeed config (zero*.json); default: "
                         "one process, DDP with --gpus > 1")
    ap.add_argument("--gpus", type=_positive_int, help="number of GPUs (default: the launch config's num_processes)")
    ap.add_argument("--gpu", choices=sorted(GPUS), default="h100", help="GPU model (default h100)")
    ap.add_argument("--mfu", type=_fraction, default=0.4, help="model FLOPs utilisation assumed (default 0.4)")
    ap.add_argument("--headroom", type=float, default=0.1,
                    help="share of GPU memory kept free for CUDA context, NCCL, fragmentation (default 0.1)")
    ap.add_argument("--tokens", type=float, help="token budget (default: the recipe's max_steps x global batch)")
    ap.add_argument("--precision", choices=["bf16", "fp32"], help="default: the recipe's train.precision (auto: bf16)")
    ap.add_argument("--checkpointing", choices=["none", "full", "selective"],
                    help="default: the recipe's train.activation_checkpointing")
    ap.add_argument("--batch", type=_positive_int, help="micro-batch per GPU (default train.micro_batch_size)")
    ap.add_argument("--seq-len", type=_positive_int, help="context length (default train.seq_len)")
    ap.add_argument("--format", choices=["table", "json"], default="table", help="output format (default table)")
    return ap


def plan_main(argv: Sequence[str]) -> int:
    """``python -m analysis.costs plan RECIPE ...``: the plan of one recipe (exit 2 on invalid input)."""
    args = build_plan_parser().parse_args(argv)
    try:
        path = Path(args.recipe)
        if not path.is_file():
            raise RecipeError(f"{path}: no such recipe file")
        if _launch_config(path):
            raise RecipeError(f"{path}: an accelerate launch config, not a recipe; pass it as --launch {path}")
        recipe = archlab.load_recipe(path, args.overrides)
        launch = read_launch(args.launch, args.gpus)
        plan = training_plan(recipe, launch, gpu=args.gpu, mfu=args.mfu, headroom=args.headroom, tokens=args.tokens,
                             precision=args.precision, checkpointing=args.checkpointing, batch=args.batch,
                             seq_len=args.seq_len)
    except (RecipeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(json.dumps(plan.as_dict(), indent=2) + "\n" if args.format == "json" else format_plan(plan) + "\n")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["plan"]:
        return plan_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        rows = [recipe_costs(p, args.seq_len, args.batch, args.precision, args.zero_stage, args.dp,
                             args.device, args.checkpointing, args.ep, args.loss) for p in expand(args.recipes)]
    except (RecipeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text = format_rows(rows, args.format)
    sys.stdout.write(text)
    _, notes = footnotes(rows)
    if notes and args.format != "table":  # the table carries its footnotes; csv and json say why in a field
        print("\n".join(f"note: {line}" for line in notes), file=sys.stderr)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        written = []
        for key, what, draw in (
                ("train_flops_per_token", "flops_breakdown.png", lambda rs, p: plot_flops(rs, p)),
                ("train_memory_bytes", "memory_breakdown.png",
                 lambda rs, p: plot_memory(rs, p, args.precision, args.zero_stage, args.dp, args.device))):
            drawn = modelled(rows, key)
            left_out = [r["recipe"] for r in rows if r not in drawn]
            if drawn:
                written.append(draw(drawn, args.out / what))
            if left_out:
                print(f"note: {what}: {'without' if drawn else 'not drawn: nothing modelled for'} "
                      f"{', '.join(left_out)} (not modelled)", file=sys.stderr)
        written.append(write_text_atomic(args.out / f"costs.{'txt' if args.format == 'table' else args.format}", text))
        print("wrote " + ", ".join(str(p) for p in written), file=sys.stderr)
    if not any(r.get(k) is not None for r in rows for k in COLUMNS[1:]):
        print("error: nothing could be computed (see the footnotes)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
