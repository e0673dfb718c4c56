"""Recipe validation: every rule a recipe must satisfy, checked before anything is built.

Each failure names the key, the value and the rule, so that a user can fix the recipe without
reading a traceback.
"""

from __future__ import annotations

from typing import Any


class RecipeError(ValueError):
    """A recipe (or override) is invalid. The message names key, value and rule."""


def _fail(key: str, value: Any, rule: str) -> None:
    raise RecipeError(f"{key}={value!r}: {rule}")


def _positive(cfg, prefix: str, *names: str) -> None:
    for n in names:
        v = getattr(cfg, n)
        if v is None or v <= 0:
            _fail(f"{prefix}.{n}", v, "must be a positive number")


def _one_of(key: str, value: Any, valid) -> None:
    if value not in valid:
        _fail(key, value, f"must be one of: {', '.join(map(str, valid))}")


def _fraction(key: str, value: float, hi_open: bool = True) -> None:
    if not (0.0 <= value < 1.0 if hi_open else 0.0 <= value <= 1.0):
        _fail(key, value, "must lie in [0, 1)")


def validate_model(m, prefix: str = "model") -> None:
    """Model rules. ``m`` is the ``model`` node of a recipe (DictConfig or ModelConfig)."""
    from archlab.nn.ffn import FFNS
    from archlab.nn.moe.router import ROUTERS
    from archlab.nn.norms import NORMS
    from archlab.nn.positions import POSITIONS, ROPE_SCALINGS

    _positive(m, prefix, "vocab_size", "max_seq_len", "d_model", "n_layers", "n_heads")
    if m.d_model % m.n_heads:
        _fail(f"{prefix}.n_heads", m.n_heads, f"d_model ({m.d_model}) must be divisible by n_heads")
    kv = m.n_kv_heads if m.n_kv_heads is not None else m.n_heads
    if kv <= 0:
        _fail(f"{prefix}.n_kv_heads", kv, "must be a positive number (1 = MQA, n_heads = MHA)")
    if m.n_heads % kv:
        _fail(f"{prefix}.n_kv_heads", kv, f"n_heads ({m.n_heads}) must be divisible by n_kv_heads")
    d_head = m.d_model // m.n_heads

    _one_of(f"{prefix}.norm.type", m.norm.type, NORMS.names())
    _one_of(f"{prefix}.norm.placement", m.norm.placement, ["pre", "post"])
    _positive(m.norm, f"{prefix}.norm", "eps")

    pos = m.position
    _one_of(f"{prefix}.position.type", pos.type, POSITIONS.names())
    if pos.type == "rope":
        if d_head % 2:
            _fail(f"{prefix}.n_heads", m.n_heads,
                  f"rope rotates pairs of channels: head dim d_model/n_heads = {d_head} must be even")
        _positive(pos, f"{prefix}.position", "rope_base")
    sc = pos.rope_scaling
    _one_of(f"{prefix}.position.rope_scaling.type", sc.type, ROPE_SCALINGS)
    if sc.type != "none":
        if pos.type != "rope":
            _fail(f"{prefix}.position.rope_scaling.type", sc.type,
                  f"rope scaling needs position.type=rope (got {pos.type})")
        if sc.factor < 1.0:
            _fail(f"{prefix}.position.rope_scaling.factor", sc.factor, "must be >= 1 (context extension factor)")
        if sc.original_max_seq_len is not None and sc.original_max_seq_len <= 0:
            _fail(f"{prefix}.position.rope_scaling.original_max_seq_len", sc.original_max_seq_len,
                  "must be a positive number")

    _fraction(f"{prefix}.attention.dropout", m.attention.dropout)
    if m.attention.scale is not None and m.attention.scale <= 0:
        _fail(f"{prefix}.attention.scale", m.attention.scale, "must be positive (or null for 1/sqrt(d_head))")

    _one_of(f"{prefix}.ffn.type", m.ffn.type, FFNS.names())
    if m.ffn.hidden is not None and m.ffn.hidden <= 0:
        _fail(f"{prefix}.ffn.hidden", m.ffn.hidden, "must be a positive number (or null for the default)")
    _positive(m.ffn, f"{prefix}.ffn", "multiple_of")
    _fraction(f"{prefix}.ffn.dropout", m.ffn.dropout)
    _fraction(f"{prefix}.dropout", m.dropout)
    _positive(m, prefix, "init_std")
    validate_parametrization(m, prefix)

    if m.moe is not None:
        validate_moe(m.moe, m.n_layers, f"{prefix}.moe", ROUTERS)


def validate_parametrization(m, prefix: str = "model") -> None:
    """standard or mup; a muP base width, when given, is a positive d_model."""
    from archlab.nn.mup import PARAMETRIZATIONS

    _one_of(f"{prefix}.parametrization", m.parametrization, PARAMETRIZATIONS)
    if m.mup_base_width is not None and m.mup_base_width <= 0:
        _fail(f"{prefix}.mup_base_width", m.mup_base_width,
              "must be a positive number (the base model's d_model; null = d_model, width multiplier 1)")


def validate_moe(e, n_layers: int, prefix: str, routers) -> None:
    _positive(e, prefix, "num_experts", "top_k", "expert_hidden", "every", "min_capacity", "ep_size")
    if e.top_k > e.num_experts:
        _fail(f"{prefix}.top_k", e.top_k, f"must be <= num_experts ({e.num_experts})")
    if e.n_shared_experts < 0:
        _fail(f"{prefix}.n_shared_experts", e.n_shared_experts, "must be >= 0")
    if e.shared_hidden is not None and e.shared_hidden <= 0:
        _fail(f"{prefix}.shared_hidden", e.shared_hidden, "must be a positive number (or null)")
    if not 0 <= e.first_k_dense < n_layers:
        _fail(f"{prefix}.first_k_dense", e.first_k_dense,
              f"must lie in [0, n_layers={n_layers}) so that at least one layer is MoE")
    r = e.router
    _one_of(f"{prefix}.router.type", r.type, routers.names())
    _positive(r, f"{prefix}.router", "n_groups", "topk_groups", "route_scale")
    if e.num_experts % r.n_groups:
        _fail(f"{prefix}.router.n_groups", r.n_groups, f"must divide num_experts ({e.num_experts})")
    if r.topk_groups > r.n_groups:
        _fail(f"{prefix}.router.topk_groups", r.topk_groups, f"must be <= n_groups ({r.n_groups})")
    if r.topk_groups * (e.num_experts // r.n_groups) < e.top_k:
        _fail(f"{prefix}.router.topk_groups", r.topk_groups,
              f"the kept groups hold {r.topk_groups * (e.num_experts // r.n_groups)} experts, "
              f"fewer than top_k={e.top_k}")
    _fraction(f"{prefix}.router.jitter", r.jitter)
    for n in ("aux_loss_coeff", "seq_aux_loss_coeff", "z_loss_coeff", "bias_update_rate"):
        if getattr(e.balance, n) < 0:
            _fail(f"{prefix}.balance.{n}", getattr(e.balance, n), "must be >= 0")
    if e.capacity_factor is not None and e.capacity_factor <= 0:
        _fail(f"{prefix}.capacity_factor", e.capacity_factor, "must be positive (or null for dropless routing)")
    if e.num_experts % e.ep_size:
        _fail(f"{prefix}.ep_size", e.ep_size, f"must divide num_experts ({e.num_experts})")


def validate_data(d, model) -> None:
    _one_of("data.source", d.source, ["stdlib", "text", "hf"])
    if d.source == "text" and not d.paths:
        _fail("data.paths", list(d.paths), "data.source=text needs at least one file, folder or glob")
    if d.source == "hf" and not d.hf_dataset:
        _fail("data.hf_dataset", d.hf_dataset, "data.source=hf needs a dataset name")
    _one_of("data.tokenizer", d.tokenizer, ["bpe", "byte"])
    if d.tokenizer == "byte" and model.vocab_size < 257:
        _fail("model.vocab_size", model.vocab_size, "the byte tokenizer needs 256 byte ids + 1 end-of-text id (>= 257)")
    if d.tokenizer == "bpe" and model.vocab_size < 260:
        _fail("model.vocab_size", model.vocab_size,
              "a byte-level BPE needs at least 256 byte ids + special tokens (>= 260)")
    if not 0.0 < d.val_fraction < 0.5:
        _fail("data.val_fraction", d.val_fraction, "must lie in (0, 0.5)")
    if d.max_bytes is not None and d.max_bytes <= 0:
        _fail("data.max_bytes", d.max_bytes, "must be positive (or null for the whole corpus)")


def validate_train(t, model) -> None:
    _positive(t, "train", "seq_len", "micro_batch_size", "grad_accum", "max_steps", "lr",
              "log_every", "eval_every", "eval_batches", "ckpt_every", "keep_last")
    if model.position.type == "learned" and t.seq_len > model.max_seq_len:
        _fail("train.seq_len", t.seq_len,
              f"learned positions exist only up to model.max_seq_len={model.max_seq_len}; "
              "raise model.max_seq_len or lower train.seq_len")
    _one_of("train.schedule", t.schedule, ["cosine", "wsd", "constant"])
    if not 0 <= t.warmup_steps <= t.max_steps:
        _fail("train.warmup_steps", t.warmup_steps, f"must lie in [0, max_steps={t.max_steps}]")
    if not 0.0 <= t.min_lr_ratio <= 1.0:
        _fail("train.min_lr_ratio", t.min_lr_ratio, "must lie in [0, 1]")
    if not 0.0 < t.decay_fraction <= 1.0:
        _fail("train.decay_fraction", t.decay_fraction, "must lie in (0, 1]")
    _one_of("train.decay_shape", t.decay_shape, ["linear", "sqrt"])
    if t.decay_steps < 0 or (t.schedule == "wsd" and t.decay_steps > t.max_steps - t.warmup_steps):
        _fail("train.decay_steps", t.decay_steps, f"must lie in [0, max_steps - warmup_steps = "
              f"{t.max_steps - t.warmup_steps}] (0 = train.decay_fraction of the steps)")
    if any(not 1 <= s <= t.max_steps for s in t.ckpt_steps):
        _fail("train.ckpt_steps", list(t.ckpt_steps), f"steps must lie in [1, max_steps={t.max_steps}]")
    if t.branch_from is not None and t.resume not in ("none", "auto"):
        _fail("train.resume", t.resume, f"contradicts train.branch_from={t.branch_from!r}: a branch starts from "
              "branch_from (resume=none) or continues its own run folder (resume=auto)")
    if t.branch_from is not None and not str(t.branch_from).strip():
        _fail("train.branch_from", t.branch_from, "must be a checkpoint folder (or null)")
    if t.weight_decay < 0:
        _fail("train.weight_decay", t.weight_decay, "must be >= 0")
    if len(t.betas) != 2 or not all(0.0 <= b < 1.0 for b in t.betas):
        _fail("train.betas", list(t.betas), "must be two numbers in [0, 1)")
    if t.grad_clip < 0:
        _fail("train.grad_clip", t.grad_clip, "must be >= 0 (0 = no clipping)")
    _one_of("train.precision", t.precision, ["auto", "fp32", "bf16"])
    _one_of("train.on_nonfinite", t.on_nonfinite, ["stop", "skip"])
    _one_of("train.activation_checkpointing", t.activation_checkpointing, ["none", "full", "selective"])
    if any(mult <= 0 for mult in t.eval_context_multipliers):
        _fail("train.eval_context_multipliers", list(t.eval_context_multipliers), "must be positive integers")
    if t.peak_flops is not None and t.peak_flops <= 0:
        _fail("train.peak_flops", t.peak_flops, "must be positive (or null for the device default)")
    if t.routing_every < 0:
        _fail("train.routing_every", t.routing_every, "must be >= 0")


def validate(cfg) -> None:
    """Check a whole recipe; raise :class:`RecipeError` on the first broken rule."""
    validate_model(cfg.model)
    validate_data(cfg.data, cfg.model)
    validate_train(cfg.train, cfg.model)
