"""Options belong to their variant: a recipe key that has no effect in its recipe is refused.

A *choice* is a key whose value selects a variant: ``model.type`` an entry of ``MODELS`` (decoder,
encoder: ``archlab.model``), ``model.norm.type`` an entry of ``NORMS``, ``train.schedule`` one
of the learning-rate schedules (``SCHEDULES``). (Where the ``type`` key chooses the node's dataclass,
``model.attention`` and ``model.ffn``, a key of another variant is unknown: ``archlab.config.variants``.)
Each variant states the keys of the choice's node that it
reads: a model type's and a component's ``options`` (``archlab.model.decoder``, ``archlab.nn.component``), a
data source's ``options`` (``archlab.data.sources``), a schedule's and an optimizer's ``options``
(``archlab.optim``: ``train.schedule``, ``train.optimizer``), an objective's ``options``
(``archlab.objectives``: ``train.objective``) and ``PARAMETRIZATION_OPTIONS``
(``archlab.nn.mup``). A key that other variants read and the
selected one does not has no effect, and a recipe that gives it any value but the schema default
is refused before anything is built, in the form of every rule (``key=value: rule``):

    model.norm.bias=False: only used by norm.type layernorm; this recipe's norm is rmsnorm

"Differs from the default", not "was written": every recipe inherits the full defaults (and its
base recipe's values), and a key left at its default changes nothing where it is not read. A
nested node named in ``options`` (RoPE's ``rope_scaling``) stands for all its keys.

A *condition* is a key that the selected variant reads only under a setting of another key
(``model.moe.shared_hidden`` only with shared experts): refused the same way, naming the setting.

MoE itself is switched on by its own key, ``model.moe.num_experts`` (:func:`check_moe_switch`): a
router or balancing key (``model.moe.balance.aux_loss_coeff=0.01``) on a recipe without experts is
refused by name instead of making the model an MoE with every other key at its default. The switch
is read from what the recipe and its overrides write, before the schema fills the defaults in.

The validator (``archlab.config.validate``) asks this module once the type names are known to be
valid and before the components' own rules, so the message says that the key is not used rather
than what values it would take.
"""

from __future__ import annotations

from typing import Any, Iterator

from omegaconf import DictConfig

from archlab.config.schema import DataConfig, TrainConfig
from archlab.data.sources import SOURCES
from archlab.errors import fail
from archlab.model.options import MODEL_CHOICES, MODEL_CONDITIONS, check_model_options
from archlab.objectives import OBJECTIVES
from archlab.optim import OPTIMIZERS, SCHEDULES
from archlab.options import Choice, Condition, check, leaf_keys, plain, registry_options

__all__ = ["CHOICES", "CONDITIONS", "Choice", "Condition", "MOE_SWITCH", "SCHEDULE_OPTIONS", "check_data_options",
           "check_model_options", "check_moe_switch", "check_train_options", "leaf_keys"]

# The train keys each schedule reads besides the shared ones (lr, warmup_steps, max_steps): its class's
# ``options`` (archlab.optim.schedules). constant: lr after the warmup, nothing else.
SCHEDULE_OPTIONS: dict[str, frozenset[str]] = registry_options(SCHEDULES)

CHOICES: dict[str, list[Choice]] = {
    "model": MODEL_CHOICES,
    "data": [Choice("", "source", "data.source", "data source", DataConfig, lambda: registry_options(SOURCES))],
    "train": [Choice("", "schedule", "train.schedule", "schedule", TrainConfig, lambda: registry_options(SCHEDULES)),
              Choice("", "optimizer", "train.optimizer", "optimizer", TrainConfig,
                     lambda: registry_options(OPTIMIZERS)),
              Choice("", "objective.type", "train.objective", "objective", TrainConfig,
                     lambda: registry_options(OBJECTIVES))],
}

CONDITIONS: dict[str, list[Condition]] = {
    "model": MODEL_CONDITIONS,
    "data": [
        Condition("eot_id", DataConfig, "eot_id",
                  "data.source is tokens or data.tokenizer is a tokenizer file (bpe and byte fix their end-of-text id)",
                  lambda d, _: d.source == "tokens" or d.tokenizer not in ("bpe", "byte"),
                  lambda d, _: f"data.source={d.source}, data.tokenizer={d.tokenizer}"),
    ],
    "train": [
        Condition("decay_fraction", TrainConfig, "decay_fraction",
                  "train.decay_steps is 0 (decay_steps > 0 sets the decay's length)",
                  lambda t, _: t.decay_steps == 0, lambda t, _: f"train.decay_steps={t.decay_steps}"),
        Condition("routing_every", TrainConfig, "routing_every", "model.moe is set (routing records of an MoE)",
                  lambda _, model: model.moe is not None, lambda _, model: "model.moe=None (a dense model)"),
        Condition("router_trace_every", TrainConfig, "router_trace_every", "model.moe is set (a trace of MoE routers)",
                  lambda _, model: model.moe is not None, lambda _, model: "model.moe=None (a dense model)"),
        Condition("resume_allow_changes", TrainConfig, "resume_allow_changes",
                  "train.resume is auto or a checkpoint (it lets a resume change train settings)",
                  lambda t, _: t.resume != "none", lambda t, _: "train.resume=none"),
        Condition("tracker_project", TrainConfig, "tracker_project", "train.trackers names a tracker",
                  lambda t, _: len(t.trackers) > 0, lambda t, _: "train.trackers=[]"),
    ],
}


def check_data_options(d) -> None:
    """Refuse a ``data`` key that the selected source does not read."""
    check(d, None, "data", CHOICES["data"], CONDITIONS["data"])


def check_train_options(t, model) -> None:
    """Refuse a ``train`` key that the selected schedule, optimizer, objective (or the model) does not use."""
    check(t, model, "train", CHOICES["train"], CONDITIONS["train"])


# the key that makes a model an MoE (relative to model.moe); every other moe key only tunes one
MOE_SWITCH = "num_experts"


def _written_leaves(node: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every leaf a raw (schema-less) recipe node writes."""
    if isinstance(node, (DictConfig, dict)):
        for k in node:
            yield from _written_leaves(node[k], f"{prefix}.{k}")
    else:
        yield prefix, plain(node)


def check_moe_switch(written_model: Any, prefix: str = "model") -> None:
    """Refuse a ``model.moe`` key on a recipe that does not switch MoE on. ``written_model``: the
    ``model`` node as the recipe file (its ``base:`` chain merged) and the overrides write it, before
    the schema's defaults are merged in (there every moe node has a num_experts). A moe node that
    writes keys but not ``num_experts`` is refused by its first key, the others named after it."""
    if not isinstance(written_model, (DictConfig, dict)) or written_model.get("moe") is None:
        return
    moe = written_model["moe"]
    if isinstance(moe, (DictConfig, dict)) and moe.get(MOE_SWITCH) is not None:
        return
    switch = f"{prefix}.moe.{MOE_SWITCH}"
    leaves = list(_written_leaves(moe, f"{prefix}.moe"))
    key, value = leaves[0] if leaves else (f"{prefix}.moe", plain(moe))
    also = f" (also set: {', '.join(k for k, _ in leaves[1:])})" if len(leaves) > 1 else ""
    fail(key, value, f"only used by an MoE model{also}; this recipe's model is dense ({switch} is not set): "
                     f"set {switch} to replace its FFNs by routed experts, or leave the moe keys out")
