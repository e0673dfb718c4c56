"""Recipe validation: every rule a recipe must satisfy, checked before anything is built.

Each failure names the key, the value and the rule, so that a user can fix the recipe without
reading a traceback. Once a section's choices (``type`` names, ``train.schedule``,
``train.optimizer``, ``data.source``) are known to be valid, a key that the chosen variants do
not read is refused (``archlab.config.options``), before the values of the keys that are read are
checked (a schedule's and an optimizer's by their classes in ``archlab.optim``).
"""

from __future__ import annotations

from types import SimpleNamespace

from archlab.config.options import check_data_options, check_train_options
from archlab.data.shards import SHARD_FORMATS
from archlab.errors import RecipeError, fail
from archlab.errors import one_of as _one_of
from archlab.errors import positive as _positive
from archlab.model.validate import validate_model, validate_moe, validate_parametrization  # noqa: F401  (re-exported)
from archlab.nn.positions import position_class
from archlab.objectives import OBJECTIVES
from archlab.optim import OPTIMIZERS, SCHEDULES
from archlab.trackers import TRACKERS

__all__ = ["RecipeError", "validate", "validate_data", "validate_model", "validate_train"]


def validate_data(d, model, reserved: int = 0) -> None:
    """Data rules; ``reserved``: ids at the top of the vocabulary the training objective uses itself (masked
    LM: its mask id), which the tokenizer must leave free."""
    _one_of("data.source", d.source, ["stdlib", "shakespeare", "text", "hf", "tokens"])
    check_data_options(d)  # a key of another source
    if d.source == "text" and not d.paths:
        fail("data.paths", list(d.paths), "data.source=text needs at least one file, folder or glob")
    if d.source == "hf" and not d.hf_dataset:
        fail("data.hf_dataset", d.hf_dataset, "data.source=hf needs a dataset name")
    if d.source == "tokens":
        if not d.train_shards:
            fail("data.train_shards", d.train_shards, "data.source=tokens needs a glob of token shards "
                  "(e.g. 'data/fineweb10B/fineweb_train_*.bin') or a folder holding train.bin and val.bin")
        _one_of("data.shard_format", d.shard_format, SHARD_FORMATS)
    # bpe | byte | a tokenizer file (its existence is checked when the data is read: recipes travel)
    if d.tokenizer not in ("bpe", "byte") and not str(d.tokenizer).endswith(".json"):
        fail("data.tokenizer", d.tokenizer,
              "must be bpe, byte or the path of a Hugging Face tokenizers file (*.json, e.g. gpt2's tokenizer.json)")
    also = f", + {reserved} id(s) the objective reserves" if reserved else ""
    if d.tokenizer == "byte" and model.vocab_size < 257 + reserved:
        fail("model.vocab_size", model.vocab_size,
              f"the byte tokenizer needs 256 byte ids + 1 end-of-text id{also} (>= {257 + reserved})")
    if d.tokenizer == "bpe" and d.source != "tokens" and model.vocab_size < 260 + reserved:
        fail("model.vocab_size", model.vocab_size,
              f"a byte-level BPE needs at least 256 byte ids + special tokens{also} (>= {260 + reserved})")
    if d.eot_id is not None and not 0 <= d.eot_id < model.vocab_size:
        fail("data.eot_id", d.eot_id, f"must lie in [0, model.vocab_size={model.vocab_size}) (or null)")
    if not 0.0 < d.val_fraction < 0.5:
        fail("data.val_fraction", d.val_fraction, "must lie in (0, 0.5)")
    if d.max_bytes is not None and d.max_bytes <= 0:
        fail("data.max_bytes", d.max_bytes, "must be positive (or null for the whole corpus)")


def validate_train(t, model) -> None:
    _positive(t, "train", "seq_len", "micro_batch_size", "grad_accum", "max_steps", "lr",
              "log_every", "eval_every", "eval_batches", "ckpt_every", "keep_last")
    limit = position_class(model).max_length(model)
    if limit is not None and t.seq_len > limit:
        fail("train.seq_len", t.seq_len,
              f"{model.position.type} positions exist only up to {limit} (model.max_seq_len={model.max_seq_len}); "
              "raise model.max_seq_len or lower train.seq_len")
    _one_of("train.schedule", t.schedule, SCHEDULES.names())
    _one_of("train.optimizer", t.optimizer, OPTIMIZERS.names())
    _one_of("train.objective", t.objective.type, OBJECTIVES.names())
    check_train_options(t, model)  # a key of another schedule, optimizer or objective, or of an MoE model
    if not 0 <= t.warmup_steps <= t.max_steps:
        fail("train.warmup_steps", t.warmup_steps, f"must lie in [0, max_steps={t.max_steps}]")
    SCHEDULES.get(t.schedule).validate(t)  # the schedule's own keys (min_lr_ratio, decay_*)
    OPTIMIZERS.get(t.optimizer).validate(t)  # weight_decay, betas, eps; the optimizer's own node
    OBJECTIVES.get(t.objective.type).validate(SimpleNamespace(model=model, train=t))  # e.g. mtp needs model.mtp_depth
    if any(not 1 <= s <= t.max_steps for s in t.ckpt_steps):
        fail("train.ckpt_steps", list(t.ckpt_steps), f"steps must lie in [1, max_steps={t.max_steps}]")
    if t.branch_from is not None and t.resume not in ("none", "auto"):
        fail("train.resume", t.resume, f"contradicts train.branch_from={t.branch_from!r}: a branch starts from "
              "branch_from (resume=none) or continues its own run folder (resume=auto)")
    if t.branch_from is not None and not str(t.branch_from).strip():
        fail("train.branch_from", t.branch_from, "must be a checkpoint folder (or null)")
    if t.grad_clip < 0:
        fail("train.grad_clip", t.grad_clip, "must be >= 0 (0 = no clipping)")
    _one_of("train.precision", t.precision, ["auto", "fp32", "bf16"])
    _one_of("train.on_nonfinite", t.on_nonfinite, ["stop", "skip"])
    _one_of("train.activation_checkpointing", t.activation_checkpointing, ["none", "full", "selective"])
    if any(mult <= 0 for mult in t.eval_context_multipliers):
        fail("train.eval_context_multipliers", list(t.eval_context_multipliers), "must be positive integers")
    if t.peak_flops is not None and t.peak_flops <= 0:
        fail("train.peak_flops", t.peak_flops, "must be positive (or null for the device default)")
    if t.routing_every < 0:
        fail("train.routing_every", t.routing_every, "must be >= 0")
    if t.router_trace_every < 0:
        fail("train.router_trace_every", t.router_trace_every, "must be >= 0 (0 = off)")
    validate_trackers(t)
    validate_upcycle(t, model)


UPCYCLE_METHODS = ("copy", "drop")  # archlab/train/upcycle.py


def validate_upcycle(t, model) -> None:
    """``train.upcycle``: an MoE model started from a dense run (``train.init_from``) by a known method. What
    the dense run holds is checked when the weights are read (``archlab.train.upcycle``)."""
    u = t.upcycle
    if u is None:
        return
    if t.init_from is None:
        fail("train.upcycle", u, "upcycles a dense run's weights: set train.init_from=<dense run folder>")
    if model.moe is None:
        fail("train.upcycle", u, "turns a dense FFN into experts: the recipe's model needs model.moe "
             "(an MoE recipe, e.g. recipes/mixtral/tiny-upcycled.yaml)")
    _one_of("train.upcycle.method", u.method, list(UPCYCLE_METHODS))
    if u.method == "drop" and not 0.0 < u.drop_ratio <= 1.0:
        fail("train.upcycle.drop_ratio", u.drop_ratio, "must lie in (0, 1]: the share of each expert's hidden "
             "units re-initialised")


def validate_trackers(t) -> None:
    """Known tracker names, each once, and a project name. Whether their packages are installed is
    the trainer's question (at start): the recipe stays valid for the tools that only read it."""
    names = [str(n) for n in t.trackers]
    if names:
        for name in names:
            _one_of("train.trackers", name, list(TRACKERS))
        if len(set(names)) < len(names):
            fail("train.trackers", names, "names a tracker twice")
    if not str(t.tracker_project).strip():
        fail("train.tracker_project", t.tracker_project, "must be a name (the wandb project, MLflow experiment)")


def validate(cfg) -> None:
    """Check a whole recipe; raise :class:`RecipeError` on the first broken rule."""
    validate_model(cfg.model)
    validate_train(cfg.train, cfg.model)  # first: the objective's reserved ids read its train keys
    validate_data(cfg.data, cfg.model, OBJECTIVES.get(cfg.train.objective.type).reserved_ids(cfg))
