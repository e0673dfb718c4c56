"""Options belong to their variant: a recipe key that has no effect in its recipe is refused.

A *choice* is a key whose value selects a variant: ``model.type`` an entry of ``MODELS`` (decoder,
encoder: ``archlab.model``), ``model.attention.type`` an entry of ``ATTENTIONS``, ``train.schedule`` one
of the learning-rate schedules (``SCHEDULES``). Each variant states the keys of the choice's node that it
reads: a model type's and a component's ``options`` (``archlab.model.decoder``, ``archlab.nn.component``), a
data source's ``options`` (``archlab.data.sources``), a schedule's and an optimizer's ``options``
(``archlab.optim``: ``train.schedule``, ``train.optimizer``), an objective's ``options``
(``archlab.objectives``: ``train.objective``) and ``PARAMETRIZATION_OPTIONS``
(``archlab.nn.mup``). A key that other variants read and the
selected one does not has no effect, and a recipe that gives it any value but the schema default
is refused before anything is built, in the form of every rule (``key=value: rule``):

    model.attention.window=16: only used by attention.type sliding_window; this recipe's attention is mha

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

from dataclasses import dataclass, fields, is_dataclass
from typing import Any, Callable, Iterator

from omegaconf import ListConfig

from archlab.config.schema import (
    AttentionConfig,
    BlockConfig,
    DataConfig,
    FFNConfig,
    ModelConfig,
    MoEConfig,
    NormConfig,
    PositionConfig,
    RopeScalingConfig,
    RouterConfig,
    TrainConfig,
)
from archlab.errors import fail
from archlab.nn.attention import ATTENTIONS
from archlab.nn.ffn import FFNS
from archlab.nn.moe.router import ROUTERS
from archlab.nn.mup import PARAMETRIZATION_OPTIONS
from archlab.nn.norms import NORMS
from archlab.nn.positions import POSITIONS, ROPE_SCALINGS
from archlab.objectives import OBJECTIVES
from archlab.optim import OPTIMIZERS, SCHEDULES
from archlab.registry import Registry

__all__ = ["CHOICES", "CONDITIONS", "Choice", "Condition", "MOE_SWITCH", "SCHEDULE_OPTIONS", "check_data_options",
           "check_model_options", "check_moe_switch", "check_train_options"]

def registry_options(registry: Registry) -> dict[str, frozenset[str]]:
    """Variant name -> the keys it reads, from each entry's ``options``."""
    out = {}
    for name in registry.names():
        entry = registry.get(name)
        if not hasattr(entry, "options"):
            raise TypeError(f"{registry.kind} type {name!r} ({entry!r}) states no options: give it an `options` "
                            "attribute, the keys of its config node it reads")
        out[name] = frozenset(entry.options)
    return out


# The train keys each schedule reads besides the shared ones (lr, warmup_steps, max_steps): its class's
# ``options`` (archlab.optim.schedules). constant: lr after the warmup, nothing else.
SCHEDULE_OPTIONS: dict[str, frozenset[str]] = registry_options(SCHEDULES)


def _data_sources() -> dict[str, frozenset[str]]:
    from archlab.data.sources import SOURCES  # archlab.data imports the config package: resolved here

    return registry_options(SOURCES)


def _model_types() -> dict[str, frozenset[str]]:
    from archlab.model.build import MODELS  # archlab.model imports the config package: resolved here

    return registry_options(MODELS)


def _block_types() -> dict[str, frozenset[str]]:
    from archlab.model.decoder import BLOCKS  # archlab.model imports the config package: resolved here

    return registry_options(BLOCKS)


@dataclass(frozen=True)
class Choice:
    """A key whose value selects which keys of a node take effect."""

    node: str  # the node holding the variants' keys, relative to the section ("attention"; "" = the section)
    selector: str  # the key naming the variant, relative to the section
    label: str  # how the message names the selector ("attention.type" for the example)
    subject: str  # "this recipe's {subject} is {variant}"
    schema: type  # the node's dataclass: its keys and their defaults
    variants: Callable[[], dict[str, frozenset[str]]]  # variant name -> the keys of the node it reads

    def governed(self) -> Iterator[tuple[str, list[str]]]:
        """(key relative to the node, the variants that read it) for every key some variant reads."""
        variants = self.variants()
        for key in leaf_keys(self.schema()):
            users = sorted(v for v, reads in variants.items() if _covers(reads, key))
            if users:
                yield key, users


@dataclass(frozen=True)
class Condition:
    """A key the selected variant reads only when ``holds(section, model)``."""

    key: str  # relative to the section
    schema: type  # the dataclass holding the key's default (``leaf`` within it)
    leaf: str
    when: str  # the setting it needs, as the message says it
    holds: Callable[[Any, Any], bool]  # (section node, model node) -> the key is read
    has: Callable[[Any, Any], str]  # what this recipe has instead


CHOICES: dict[str, list[Choice]] = {
    "model": [
        # the model type first: a key of another type is refused before its components are asked
        Choice("", "type", "model.type", "model type", ModelConfig, _model_types),
        Choice("attention", "attention.type", "attention.type", "attention", AttentionConfig,
               lambda: registry_options(ATTENTIONS)),
        Choice("norm", "norm.type", "norm.type", "norm", NormConfig, lambda: registry_options(NORMS)),
        # position first: on a position without RoPE every rope_scaling key is foreign
        Choice("position", "position.type", "position.type", "position", PositionConfig,
               lambda: registry_options(POSITIONS)),
        Choice("position.rope_scaling", "position.rope_scaling.type", "position.rope_scaling.type", "rope scaling",
               RopeScalingConfig, lambda: registry_options(ROPE_SCALINGS)),
        Choice("ffn", "ffn.type", "ffn.type", "ffn", FFNConfig, lambda: registry_options(FFNS)),
        Choice("block", "block.type", "block.type", "block", BlockConfig, _block_types),
        Choice("moe.router", "moe.router.type", "moe.router.type", "router", RouterConfig,
               lambda: registry_options(ROUTERS)),
        Choice("", "parametrization", "parametrization", "parametrization", ModelConfig,
               lambda: dict(PARAMETRIZATION_OPTIONS)),
    ],
    "data": [Choice("", "source", "data.source", "data source", DataConfig, _data_sources)],
    "train": [Choice("", "schedule", "train.schedule", "schedule", TrainConfig, lambda: registry_options(SCHEDULES)),
              Choice("", "optimizer", "train.optimizer", "optimizer", TrainConfig,
                     lambda: registry_options(OPTIMIZERS)),
              Choice("", "objective", "train.objective", "objective", TrainConfig,
                     lambda: registry_options(OBJECTIVES))],
}

CONDITIONS: dict[str, list[Condition]] = {
    "model": [
        Condition("ffn.multiple_of", FFNConfig, "multiple_of", "ffn.hidden is null (it rounds the default width)",
                  lambda m, _: m.ffn.hidden is None, lambda m, _: f"ffn.hidden={m.ffn.hidden}"),
        Condition("moe.shared_hidden", MoEConfig, "shared_hidden", "moe.n_shared_experts > 0",
                  lambda m, _: m.moe is None or m.moe.n_shared_experts > 0,
                  lambda m, _: f"moe.n_shared_experts={m.moe.n_shared_experts}"),
        Condition("moe.min_capacity", MoEConfig, "min_capacity",
                  "moe.capacity_factor is set (dropless routing has no capacity)",
                  lambda m, _: m.moe is None or m.moe.capacity_factor is not None,
                  lambda m, _: "moe.capacity_factor=None (dropless)"),
    ],
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


def leaf_keys(obj: Any, prefix: str = "") -> Iterator[str]:
    """Dotted paths of the non-dataclass fields of a dataclass instance, nested ones included."""
    for f in fields(obj):
        value = getattr(obj, f.name)
        if is_dataclass(value):
            yield from leaf_keys(value, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}"


def _covers(reads: frozenset[str], key: str) -> bool:
    return any(key == r or key.startswith(r + ".") for r in reads)


def _get(node: Any, path: str) -> Any:
    for part in filter(None, path.split(".")):
        if node is None:
            return None
        node = getattr(node, part)
    return node


def _plain(value: Any) -> Any:
    if isinstance(value, (ListConfig, list, tuple)):
        return [_plain(v) for v in value]
    return value


def _join(*parts: str) -> str:
    return ".".join(p for p in parts if p)


def _check(section: Any, model: Any, prefix: str, name: str) -> None:
    for c in CHOICES[name]:
        node = _get(section, c.node)
        if node is None:  # a dense model has no moe node: none of its keys is set
            continue
        selected = _get(section, c.selector)
        variants = c.variants()
        if selected not in variants:  # an unknown type name: its own rule says so
            continue
        default = c.schema()
        for key, users in c.governed():
            if selected in users:
                continue
            value = _plain(_get(node, key))
            if value != _plain(_get(default, key)):
                fail(_join(prefix, c.node, key), value,
                     f"only used by {c.label} {', '.join(users)}; this recipe's {c.subject} is {selected}")
    for k in CONDITIONS[name]:
        owner = _get(section, k.key.rpartition(".")[0])
        if owner is None or k.holds(section, model):
            continue
        value = _plain(_get(section, k.key))
        if value != _plain(_get(k.schema(), k.leaf)):
            fail(_join(prefix, k.key), value, f"only used when {k.when}; this recipe has {k.has(section, model)}")


def check_model_options(m, prefix: str = "model") -> None:
    """Refuse a key of the ``model`` node ``m`` that the selected variants do not read."""
    _check(m, m, prefix, "model")


def check_data_options(d) -> None:
    """Refuse a ``data`` key that the selected source does not read."""
    _check(d, None, "data", "data")


def check_train_options(t, model) -> None:
    """Refuse a ``train`` key that the selected schedule, optimizer, objective (or the model) does not use."""
    _check(t, model, "train", "train")


# the key that makes a model an MoE (relative to model.moe); every other moe key only tunes one
MOE_SWITCH = "num_experts"


def _written_leaves(node: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every leaf a raw (schema-less) recipe node writes."""
    from omegaconf import DictConfig

    if isinstance(node, (DictConfig, dict)):
        for k in node:
            yield from _written_leaves(node[k], f"{prefix}.{k}")
    else:
        yield prefix, _plain(node)


def check_moe_switch(written_model: Any, prefix: str = "model") -> None:
    """Refuse a ``model.moe`` key on a recipe that does not switch MoE on. ``written_model``: the
    ``model`` node as the recipe file (its ``base:`` chain merged) and the overrides write it, before
    the schema's defaults are merged in (there every moe node has a num_experts). A moe node that
    writes keys but not ``num_experts`` is refused by its first key, the others named after it."""
    from omegaconf import DictConfig

    if not isinstance(written_model, (DictConfig, dict)) or written_model.get("moe") is None:
        return
    moe = written_model["moe"]
    if isinstance(moe, (DictConfig, dict)) and moe.get(MOE_SWITCH) is not None:
        return
    switch = f"{prefix}.moe.{MOE_SWITCH}"
    leaves = list(_written_leaves(moe, f"{prefix}.moe"))
    key, value = leaves[0] if leaves else (f"{prefix}.moe", _plain(moe))
    also = f" (also set: {', '.join(k for k, _ in leaves[1:])})" if len(leaves) > 1 else ""
    fail(key, value, f"only used by an MoE model{also}; this recipe's model is dense ({switch} is not set): "
                     f"set {switch} to replace its FFNs by routed experts, or leave the moe keys out")
