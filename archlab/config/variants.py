"""A component node's dataclass is chosen by its ``type:`` key before the recipe is merged onto the schema.

``model.ffn.type: swiglu`` makes ``model.ffn`` a ``SwiGLUConfig`` (``archlab.nn.ffn``), so ``ffn.approximate``
(a GELU key) is unknown there, and the loader refuses it naming the key, the chosen type, the keys it accepts
and the types that read it. A kind takes part when its base config names its registry (``variants``:
``archlab.nn.component``). A key of another variant written at that variant's default is dropped, not
refused: it has no effect, and resolved recipes saved before each variant had its own config write every
variant's defaults.
"""

from __future__ import annotations

import typing
from dataclasses import fields, is_dataclass
from typing import Any, Iterator

from omegaconf import DictConfig, OmegaConf

from archlab.nn.component import field_default, foreign_key, kind_base, readers, variant_class


def dataclass_of(tp) -> type | None:
    """The dataclass a field holds (``Optional[MoEConfig]`` -> ``MoEConfig``), else None."""
    if is_dataclass(tp):
        return tp
    for arg in typing.get_args(tp):
        if is_dataclass(arg):
            return arg
    return None


def variant_nodes(cls: type, path: str = "") -> Iterator[tuple[str, type]]:
    """(dotted path under ``cls``, kind base) of every node whose dataclass a ``type:`` key chooses."""
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        sub = dataclass_of(hints[f.name])
        if sub is None:
            continue
        key = f"{path}.{f.name}" if path else f.name
        base = kind_base(sub)
        if base is not None:
            yield key, base
        else:
            yield from variant_nodes(sub, key)


def _get(node: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(node, (DictConfig, dict)) or part not in node:
            return None
        node = node[part]
    return node


def chosen(written_model: Any, path: str, base: type) -> list[str]:
    """The variant names the node at ``path`` serves: a layer pattern's (attention), else its written type,
    else its default's."""
    if hasattr(base, "chosen"):  # attention: a layer pattern's variants
        names = base.chosen(OmegaConf.create({"layers": {"pattern": _get(written_model, "layers.pattern") or []}}))
        if names:
            return names
    node = _get(written_model, path)
    written = node.get("type") if isinstance(node, (DictConfig, dict)) else None
    return [str(written) if written is not None else base.type]


def select(schema_model: DictConfig, written_model: Any, model_class: type, prefix: str = "model") -> None:
    """Give each component node of ``schema_model`` the dataclass its written type chooses, and refuse (or drop,
    at a default) a key of ``written_model`` that dataclass lacks. Both nodes are changed in place."""
    if not isinstance(written_model, (DictConfig, dict)):
        return
    for path, base in variant_nodes(model_class):
        parent_path, _, leaf = path.rpartition(".")
        parent = _get(schema_model, parent_path) if parent_path else schema_model
        node = _get(written_model, path)
        if parent is None or not isinstance(node, (DictConfig, dict)):
            if parent is not None and parent.get(leaf) is not None:
                setattr(parent, leaf, OmegaConf.structured(variant_class(base, chosen(written_model, path, base))))
            continue
        names = chosen(written_model, path, base)
        target = variant_class(base, names)
        own = {f.name for f in fields(target)}
        for key in list(node.keys()):
            if key in own:
                continue
            value = node[key]
            users = readers(base, key)
            if users and all(value == field_default(base.variants.get(u).Config, key) for u in users):
                del node[key]  # at the default of the variants that read it: no effect
                continue
            foreign_key(f"{prefix}.{path}", key, value, target, names)
        if parent.get(leaf) is not None or _get(written_model, path) is not None:
            setattr(parent, leaf, OmegaConf.structured(target))
