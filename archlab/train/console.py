"""What a run says on the console (rank 0, stderr): the block at start, the progress bar's fields and
the closing lines. The numbers are the ones the run records (env.json, metrics.jsonl, summary.json)."""

from __future__ import annotations

import math
from typing import Any, Optional

from archlab.config.load import warmup_note
from archlab.config.schema import model_config
from archlab.costs import param_counts
from archlab.costs.plan import Launch, memory_plan
from archlab.train.parallel import resolve_precision


def _si(x: float, unit: str = "") -> str:
    """1.23e7 -> '12.3 M' (for FLOPs)."""
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


def duration(seconds: float) -> str:
    """83.4 -> '1m23s'; 4000 -> '1h06m40s'."""
    s = int(round(seconds))
    h, m, s = s // 3600, s // 60 % 60, s % 60
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{seconds:.1f}s"


def start_block(trainer, origin: Optional[str] = None) -> list[str]:
    """The lines printed once before the first step: what runs, how big, how fast it can go, where it writes."""
    cfg, t, info = trainer.cfg, trainer.cfg.train, trainer.info
    counts = param_counts(model_config(cfg))
    params = f"parameters {counts.total:,} total, {counts.active:,} active, {counts.embedding:,} embedding"
    if counts.lm_head:
        params += f" (+ {counts.lm_head:,} untied LM head)"
    if counts.mtp:
        params += f"; {counts.mtp:,} in multi-token-prediction modules (trained, not exported)"
    precision = resolve_precision(t.precision)
    lines = [
        f"recipe {origin or cfg.name} ({cfg.name})",
        params,
        f"FLOPs per token {_si(trainer.flops_per_token)} ({trainer.flops_source}); tokens per step "
        f"{trainer.tokens_per_step:,} ({t.micro_batch_size} x {t.grad_accum} accumulation x {info.world_size} "
        f"process{'es' if info.world_size > 1 else ''} x {t.seq_len} tokens)",
        f"backend {trainer.backend.describe()['backend']} on {trainer.device}, precision "
        f"{'fp32' if precision == 'no' else precision} (train.precision={t.precision}); MFU against "
        f"{_si(trainer.peak_flops, 'FLOP/s')} ({trainer.peak_source})",
        memory_line(trainer, precision),
        f"steps {trainer.step} -> {t.max_steps}, lr {t.lr:g} ({t.schedule}, {t.warmup_steps} warmup steps)",
        f"run folder {trainer.run_dir}",
    ]
    note = warmup_note(t)
    if note is not None:
        lines.append(f"warmup: {note}")
    return lines


def memory_line(trainer, precision: str) -> str:
    """The plan's per-process memory (archlab.costs.plan) for this run's world size, backend, precision, device."""
    launch = trainer.backend.launch
    plan = Launch(world=trainer.info.world_size, backend="deepspeed" if launch.deepspeed else "plain",
                  zero_stage=launch.zero_stage, source="this run")
    device = "cuda" if trainer.device.type == "cuda" else "cpu"
    try:
        mem = memory_plan(trainer.cfg, plan, precision="fp32" if precision == "no" else "bf16", device=device)
    except (NotImplementedError, ValueError) as e:
        return f"memory plan: not modelled ({e})"
    return "memory plan: " + mem.summary("GPU" if device == "cuda" else "process")


def data_line(data) -> str:
    """The corpus the run trains on, once it is ready (a labelled task: its examples per split)."""
    if hasattr(data, "examples"):
        sizes = ", ".join(f"{len(e.y):,} {split}" for split, e in data.examples.items())
        return f"data {sizes} examples, tokenizer of {data.tokenizer.vocab_size:,} ids"
    return (f"data {len(data.train):,} training and {len(data.val):,} validation tokens, tokenizer of "
            f"{data.tokenizer.vocab_size:,} ids ({data.cache_path})")


def routing_fields(row: dict[str, Any]) -> dict[str, str]:
    """An MoE row's routing health for the bar: ``aux`` (the row's auxiliary loss), ``maxvio p90`` (the row's
    ``moe/maxvio_p90`` over the MoE layers) and ``dropped`` (dropped slots / tokens * top_k, summed over the
    layers' ``moe/<layer>/...``; 0 when dropless). Empty for a row without routing statistics (dense)."""
    if "moe/maxvio_p90" not in row:
        return {}
    dropped = slots = 0.0
    for key, value in row.items():
        if key.startswith("moe/") and key.endswith("/dropped_slots"):
            layer = key[:-len("dropped_slots")]
            dropped += value
            slots += row[layer + "tokens"] * row[layer + "top_k"]
    frac = dropped / slots if slots else 0.0
    return {"aux": f"{row['aux_loss']:.3g}", "maxvio p90": f"{row['moe/maxvio_p90']:.3f}",
            "dropped": f"{100 * frac:.2f}%" if frac else "0%"}


class BarFields:
    """The progress bar's fields: loss, lr, tokens/s and MFU of the latest metrics row, the latest validation loss;
    on an MoE run the row's routing health (:func:`routing_fields`)."""

    def __init__(self, val_key: str = "loss") -> None:
        self.val_key = val_key  # the objective's validation loss (causal LM: loss; masked LM: mlm_loss)
        self.val: Optional[float] = None

    def saw(self, row: dict[str, Any]) -> None:
        """Keep a validation row's loss at the training context for the bar."""
        if row.get("kind") == "val" and row.get("context_multiplier", 1) == 1 and self.val_key in row:
            self.val = float(row[self.val_key])

    def postfix(self, row: dict[str, Any]) -> dict[str, str]:
        out = {"loss": f"{row['loss']:.3f}", "lr": f"{row['lr']:.2e}", "tok/s": f"{row['tokens_per_s']:,.0f}",
               "mfu": f"{100 * row['mfu']:.2f}%" if math.isfinite(row["mfu"]) else "-"}
        if self.val is not None:
            out["val"] = f"{self.val:.3f}"
        out.update(routing_fields(row))
        return out


def closing_lines(summary: dict) -> str:
    """What a user wants at the end: where the run is, how good it got, how long and how fast, where the plot is."""
    run = summary["run_dir"]
    lines = [f"[archlab] {summary['status']}: step {summary['step']}, run folder {run}"]
    key = summary.get("val_loss_key") or "loss"  # masked LM: mlm_loss; span corruption: span_loss
    val = summary.get("final_val_loss" if key == "loss" else f"final_val_{key}") or {}
    if val:
        by_len = ", ".join(f"{loss:.3f} at {ctx} tokens" for ctx, loss in val.items())
        what = "loss" if key == "loss" else key
        lines.append(f"[archlab] final validation {what} (nats/token): {by_len}")
    if summary.get("unigram_entropy_train") is not None:
        lines.append(f"[archlab] unigram entropy of the training split: {summary['unigram_entropy_train']:.3f}")
    if summary.get("elapsed_s") is not None:
        speed = ""
        if summary.get("mean_tokens_per_s") is not None:
            speed = f", {summary['mean_tokens_per_s']:,.0f} tokens/s (training steps)"
        if summary.get("mean_mfu") is not None:
            speed += f", MFU {100 * summary['mean_mfu']:.2f}%"
        lines.append(f"[archlab] wall time {duration(summary['elapsed_s'])}, {summary['tokens']:,} tokens{speed}")
    lines.append(f"[archlab] loss curve: {run}/loss.png")
    return "\n".join(lines)
