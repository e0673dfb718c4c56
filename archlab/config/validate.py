"""Recipe validation: every rule a recipe must satisfy, checked before anything is built.

Each failure names the key, the value and the rule, so that a user can fix the recipe without
reading a traceback. Once a section's choices (``type`` names, ``train.schedule``,
``train.optimizer``, ``data.source``) are known to be valid, a key that the chosen variants do
not read is refused (``archlab.config.options``), before the values of the keys that are read are
checked (a schedule's and an optimizer's by their classes in ``archlab.optim``).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from archlab.config.options import check_data_options, check_model_options, check_train_options
from archlab.errors import RecipeError, fail
from archlab.nn.attention import ATTENTIONS, attention_class
from archlab.nn.ffn import FFNS, ffn_class
from archlab.nn.moe.balance import validate_balance
from archlab.nn.moe.router import ROUTERS, router_class
from archlab.nn.mup import PARAMETRIZATIONS
from archlab.nn.norms import NORMS, norm_class
from archlab.nn.positions import POSITIONS, ROPE_SCALINGS, position_class
from archlab.objectives import OBJECTIVES
from archlab.optim import OPTIMIZERS, SCHEDULES

__all__ = ["RecipeError", "validate", "validate_data", "validate_model", "validate_train"]
_fail = fail


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
    """Model rules. ``m`` is the ``model`` node of a recipe (DictConfig or ModelConfig): the
    shared sizes here, then each component's own rules, asked of the component itself."""
    from archlab.model.build import MODELS, model_class  # archlab.model imports this package: resolved here
    from archlab.model.decoder import BLOCKS, block_type

    _positive(m, prefix, "vocab_size", "max_seq_len", "d_model", "n_layers", "n_heads")
    # every type name first, so that a component's rules may ask another component
    _one_of(f"{prefix}.type", m.type, MODELS.names())
    _one_of(f"{prefix}.attention.type", m.attention.type, ATTENTIONS.names())
    _one_of(f"{prefix}.norm.type", m.norm.type, NORMS.names())
    _one_of(f"{prefix}.position.type", m.position.type, POSITIONS.names())
    _one_of(f"{prefix}.position.rope_scaling.type", m.position.rope_scaling.type, ROPE_SCALINGS.names())
    _one_of(f"{prefix}.ffn.type", m.ffn.type, FFNS.names())
    _one_of(f"{prefix}.block.type", m.block.type, BLOCKS.names())
    _one_of(f"{prefix}.parametrization", m.parametrization, PARAMETRIZATIONS)
    if getattr(m, "mtp_depth", 0) < 0:
        _fail(f"{prefix}.mtp_depth", m.mtp_depth, "must be >= 0 (0 = no multi-token-prediction modules)")
    if m.moe is not None:
        _one_of(f"{prefix}.moe.router.type", m.moe.router.type, ROUTERS.names())
    check_model_options(m, prefix)  # a key that no chosen variant reads
    attention_class(m).validate(m, prefix)
    norm_class(m).validate(m, prefix)
    position_class(m).validate(m, prefix)
    ffn_class(m).validate(m, prefix)
    block_type(m).validate(m, prefix)  # e.g. the parallel block is pre-LN only
    model_class(m).validate(m, prefix)  # e.g. an encoder's components must run without the causal mask
    _fraction(f"{prefix}.dropout", m.dropout)
    _positive(m, prefix, "init_std")
    validate_parametrization(m, prefix)

    if m.moe is not None:
        validate_moe(m.moe, m.n_layers, f"{prefix}.moe", ROUTERS)


class _ModelView:
    """The ``model``-node view the MoE components' rules read (``m.moe``, ``m.n_layers``)."""

    def __init__(self, moe, n_layers: int):
        self.moe, self.n_layers = moe, n_layers


def validate_parametrization(m, prefix: str = "model") -> None:
    """standard or mup; a muP base width, when given, is a positive d_model."""
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
    _one_of(f"{prefix}.router.type", e.router.type, routers.names())
    model_prefix = prefix.rsplit(".", 1)[0]
    m = _ModelView(e, n_layers)
    router_class(m).validate(m, model_prefix)  # groups, route scale, jitter: the router's own rules
    validate_balance(m, model_prefix)  # each balancing term's rules
    if e.capacity_factor is not None and e.capacity_factor <= 0:
        _fail(f"{prefix}.capacity_factor", e.capacity_factor, "must be positive (or null for dropless routing)")
    if e.num_experts % e.ep_size:
        _fail(f"{prefix}.ep_size", e.ep_size, f"must divide num_experts ({e.num_experts})")


# data.shard_format values (archlab.data.tokens.SHARD_FORMATS; archlab.data imports this package)
SHARD_FORMATS = ["auto", "llmc", "nanogpt", "archlab"]


def validate_data(d, model, reserved: int = 0) -> None:
    """Data rules; ``reserved``: ids at the top of the vocabulary the training objective uses itself (masked
    LM: its mask id), which the tokenizer must leave free."""
    _one_of("data.source", d.source, ["stdlib", "shakespeare", "text", "hf", "tokens"])
    check_data_options(d)  # a key of another source
    if d.source == "text" and not d.paths:
        _fail("data.paths", list(d.paths), "data.source=text needs at least one file, folder or glob")
    if d.source == "hf" and not d.hf_dataset:
        _fail("data.hf_dataset", d.hf_dataset, "data.source=hf needs a dataset name")
    if d.source == "tokens":
        if not d.train_shards:
            _fail("data.train_shards", d.train_shards, "data.source=tokens needs a glob of token shards "
                  "(e.g. 'data/fineweb10B/fineweb_train_*.bin') or a folder holding train.bin and val.bin")
        _one_of("data.shard_format", d.shard_format, SHARD_FORMATS)
    # bpe | byte | a tokenizer file (its existence is checked when the data is read: recipes travel)
    if d.tokenizer not in ("bpe", "byte") and not str(d.tokenizer).endswith(".json"):
        _fail("data.tokenizer", d.tokenizer,
              "must be bpe, byte or the path of a Hugging Face tokenizers file (*.json, e.g. gpt2's tokenizer.json)")
    also = f", + {reserved} id(s) the objective reserves" if reserved else ""
    if d.tokenizer == "byte" and model.vocab_size < 257 + reserved:
        _fail("model.vocab_size", model.vocab_size,
              f"the byte tokenizer needs 256 byte ids + 1 end-of-text id{also} (>= {257 + reserved})")
    if d.tokenizer == "bpe" and d.source != "tokens" and model.vocab_size < 260 + reserved:
        _fail("model.vocab_size", model.vocab_size,
              f"a byte-level BPE needs at least 256 byte ids + special tokens{also} (>= {260 + reserved})")
    if d.eot_id is not None and not 0 <= d.eot_id < model.vocab_size:
        _fail("data.eot_id", d.eot_id, f"must lie in [0, model.vocab_size={model.vocab_size}) (or null)")
    if not 0.0 < d.val_fraction < 0.5:
        _fail("data.val_fraction", d.val_fraction, "must lie in (0, 0.5)")
    if d.max_bytes is not None and d.max_bytes <= 0:
        _fail("data.max_bytes", d.max_bytes, "must be positive (or null for the whole corpus)")


def validate_train(t, model) -> None:
    _positive(t, "train", "seq_len", "micro_batch_size", "grad_accum", "max_steps", "lr",
              "log_every", "eval_every", "eval_batches", "ckpt_every", "keep_last")
    limit = position_class(model).max_length(model)
    if limit is not None and t.seq_len > limit:
        _fail("train.seq_len", t.seq_len,
              f"{model.position.type} positions exist only up to {limit} (model.max_seq_len={model.max_seq_len}); "
              "raise model.max_seq_len or lower train.seq_len")
    _one_of("train.schedule", t.schedule, SCHEDULES.names())
    _one_of("train.optimizer", t.optimizer, OPTIMIZERS.names())
    _one_of("train.objective", t.objective, OBJECTIVES.names())
    check_train_options(t, model)  # a key of another schedule, optimizer or objective, or of an MoE model
    if not 0 <= t.warmup_steps <= t.max_steps:
        _fail("train.warmup_steps", t.warmup_steps, f"must lie in [0, max_steps={t.max_steps}]")
    SCHEDULES.get(t.schedule).validate(t)  # the schedule's own keys (min_lr_ratio, decay_*)
    OPTIMIZERS.get(t.optimizer).validate(t)  # weight_decay, betas, eps; the optimizer's own node
    OBJECTIVES.get(t.objective).validate(SimpleNamespace(model=model, train=t))  # e.g. mtp needs model.mtp_depth
    if any(not 1 <= s <= t.max_steps for s in t.ckpt_steps):
        _fail("train.ckpt_steps", list(t.ckpt_steps), f"steps must lie in [1, max_steps={t.max_steps}]")
    if t.branch_from is not None and t.resume not in ("none", "auto"):
        _fail("train.resume", t.resume, f"contradicts train.branch_from={t.branch_from!r}: a branch starts from "
              "branch_from (resume=none) or continues its own run folder (resume=auto)")
    if t.branch_from is not None and not str(t.branch_from).strip():
        _fail("train.branch_from", t.branch_from, "must be a checkpoint folder (or null)")
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
    if t.router_trace_every < 0:
        _fail("train.router_trace_every", t.router_trace_every, "must be >= 0 (0 = off)")
    validate_trackers(t)


def validate_trackers(t) -> None:
    """Known tracker names, each once, and a project name. Whether their packages are installed is
    the trainer's question (at start): the recipe stays valid for the tools that only read it."""
    names = [str(n) for n in t.trackers]
    if names:
        from archlab.train.trackers import TRACKERS  # archlab.train imports the config package: resolved here

        for name in names:
            _one_of("train.trackers", name, list(TRACKERS))
        if len(set(names)) < len(names):
            _fail("train.trackers", names, "names a tracker twice")
    if not str(t.tracker_project).strip():
        _fail("train.tracker_project", t.tracker_project, "must be a name (the wandb project, MLflow experiment)")


def validate(cfg) -> None:
    """Check a whole recipe; raise :class:`RecipeError` on the first broken rule."""
    validate_model(cfg.model)
    validate_train(cfg.train, cfg.model)  # first: the objective's reserved ids read its train keys
    validate_data(cfg.data, cfg.model, OBJECTIVES.get(cfg.train.objective).reserved_ids(cfg))
