"""The recipe's keys, read off the schema: the groups ``--help`` lists and the nearest valid keys that an
unknown key's message names ("did you mean train.max_steps?")."""

from __future__ import annotations

import difflib
import typing
from dataclasses import fields
from typing import Iterator

from archlab.config.options import CHOICES
from archlab.config.schema import ModelConfig, Recipe
from archlab.config.variants import dataclass_of, variant_nodes
from archlab.nn.component import kind_base

__all__ = ["GROUPS", "choices", "key_groups", "nearest_keys", "schema_keys"]

# one line per group of keys: what the group sets (the keys themselves are read off the schema)
GROUPS: dict[str, str] = {
    "": "the recipe itself: its name, family, base recipe and notes",
    "model": "the network's sizes and switches",
    "model.block": "how a layer composes attention and feed-forward (sequential | parallel)",
    "model.layers": "which attention type each layer has (a hybrid: a pattern repeated over the depth)",
    "model.norm": "normalisation and where it sits (pre | post)",
    "model.position": "how positions enter",
    "model.position.rope_scaling": "RoPE context extension",
    "model.attention": "the attention variant and its options",
    "model.ffn": "the feed-forward variant and its hidden width",
    "model.moe": "routed experts (switched on by model.moe.num_experts), shared experts, capacity",
    "model.moe.router": "how the MoE router scores and picks experts",
    "model.moe.balance": "MoE load balancing: auxiliary losses, the aux-loss-free bias update",
    "data": "the corpus, its split and the tokenizer; the cache folder",
    "train": "the run: steps, batch, lr schedule, optimizer, objective, logs, checkpoints",
    "train.objective": "what the run trains on (objective.type) and that objective's own options",
    "train.muon": "the Muon optimizer's settings (train.optimizer=muon)",
    "train.upcycle": "sparse upcycling: a dense run (train.init_from) turned into this MoE (copy | drop)",
}


def _fields(cls) -> list:
    """The fields of ``cls``; of a component node whose ``type`` chooses the dataclass, those of every variant."""
    base = kind_base(cls)
    if base is None:
        return list(fields(cls))
    out = {}
    for name in base.variants.names():
        out.update({f.name: f for f in fields(base.variants.get(name).Config) if f.name not in out})
    return list(out.values())


def _walk(cls, prefix: str) -> Iterator[tuple[str, str]]:
    """(group, key) for every leaf key under the dataclass ``cls`` (a component node: any variant's key)."""
    hints = typing.get_type_hints(cls)
    for f in _fields(cls):
        key = f"{prefix}.{f.name}" if prefix else f.name
        sub = dataclass_of(hints.get(f.name) or f.type)
        if sub is not None:
            yield from _walk(sub, key)
        else:
            yield prefix, key


def schema_keys() -> list[str]:
    """Every leaf key of a recipe, dotted (``model.moe.router.type``)."""
    return [key for _, key in _walk(Recipe, "")]


def key_groups() -> dict[str, list[str]]:
    """Group (``model.attention``; "" for the top level) -> its leaf keys, in schema order."""
    out: dict[str, list[str]] = {}
    for group, key in _walk(Recipe, ""):
        out.setdefault(group, []).append(key.rsplit(".", 1)[-1])
    return out


def nearest_keys(key: str, n: int = 3) -> list[str]:
    """The valid keys (leaves and groups) closest to ``key``, closest first (difflib's ratio)."""
    candidates = schema_keys() + [g for g in key_groups() if g]
    return difflib.get_close_matches(key, candidates, n=n, cutoff=0.6)


def choices() -> dict[str, list[str]]:
    """Each key that selects a variant (``model.attention.type``) -> the registered variant names."""
    out = {f"model.{path}.type": base.variants.names() for path, base in variant_nodes(ModelConfig)}
    for section, section_choices in CHOICES.items():
        for c in section_choices:
            out[f"{section}.{c.selector}"] = sorted(c.variants())
    return out


def keys_help(width: int = 33) -> str:
    """The key groups (one line each) and the variant names of each choice, as ``--help`` prints them."""
    lines = ["recipe key groups (key=value overrides; RECIPE --print-config shows every key with its value):"]
    for group, keys in key_groups().items():
        name = f"{group}.*" if group else "name, family, ..."
        lines.append(f"  {name:<{width}} {GROUPS[group]} ({len(keys)} keys)")
    lines.append("choices (the value selects a variant; a key only another variant reads is refused):")
    for key, names in choices().items():
        lines.append(f"  {key:<{width}} {' | '.join(names)}")
    return "\n".join(lines)
