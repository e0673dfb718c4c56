"""Options belong to their variant: the machinery that refuses a recipe key with no effect.

A *choice* is a key whose value selects a variant (``model.norm.type`` an entry of ``NORMS``); each
variant states the keys of the choice's node it reads (its ``options``). A key that other variants read and the
selected one does not is refused when it differs from the schema default, in the form of every rule
(``key=value: rule``). A *condition* is a key the selected variant reads only under a setting of another key.
The tables live with what they govern: the model's in ``archlab.model.options``, the data's and training's in
``archlab.config.options`` (docs: ``archlab/config/options.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass
from typing import Any, Callable, Iterator

from omegaconf import ListConfig

from archlab.errors import fail
from archlab.registry import Registry


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


def plain(value: Any) -> Any:
    if isinstance(value, (ListConfig, list, tuple)):
        return [plain(v) for v in value]
    return value


def _join(*parts: str) -> str:
    return ".".join(p for p in parts if p)


def check(section: Any, model: Any, prefix: str, choices: list[Choice], conditions: list[Condition]) -> None:
    """Refuse a key of ``section`` that the selected variants (``choices``) or settings (``conditions``) do not
    read; ``model``: the model node a condition may ask."""
    for c in choices:
        node = _get(section, c.node)
        if node is None:  # a dense model has no moe node: none of its keys is set
            continue
        selected = [_get(section, c.selector)]
        variants = c.variants()
        if any(s not in variants for s in selected):  # an unknown type name: its own rule says so
            continue
        default = c.schema()
        for key, users in c.governed():
            if any(s in users for s in selected):
                continue
            value = plain(_get(node, key))
            if value != plain(_get(default, key)):
                fail(_join(prefix, c.node, key), value,
                     f"only used by {c.label} {', '.join(users)}; this recipe's {c.subject} is {', '.join(selected)}")
    for k in conditions:
        owner = _get(section, k.key.rpartition(".")[0])
        if owner is None or k.holds(section, model):
            continue
        value = plain(_get(section, k.key))
        if value != plain(_get(k.schema(), k.leaf)):
            fail(_join(prefix, k.key), value, f"only used when {k.when}; this recipe has {k.has(section, model)}")
