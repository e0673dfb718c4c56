"""What every component states about itself, so that the rest of archlab asks it instead of
switching on its ``type:`` name.

A component kind (attention, position, rope scaling, norm, FFN, router, balancing term) is one
:class:`archlab.registry.Registry`; a variant is one class registered there by name. Each class
carries, next to its forward:

- its config: ``Config``, a dataclass in the same module that subclasses its kind's base config
  (the keys every variant of the kind reads; the base names the kind's registry in ``variants``).
  The recipe's ``type:`` key chooses the dataclass (:func:`variant_config`), so a key the chosen
  variant lacks is unknown by construction; ``archlab.config.schema`` composes the kinds' nodes;
- ``validate(m, prefix)``: its rules on the ``model`` node, raising ``archlab.errors.RecipeError``
  through ``archlab.errors.fail(key, value, rule)``;
- ``options``: the keys of its kind's config node that it reads (besides ``type``; a nested node
  such as RoPE's ``rope_scaling`` counts as one key): its ``Config``'s fields where it has one, else
  (kinds still on one shared node) ``archlab.config.options`` refuses a key only other variants read;
- ``num_params(...)``, its matmul FLOPs per token and its saved-for-backward bytes, in the
  conventions of ``archlab.costs`` (FLOPs: the ones ``FlopCounterMode`` counts; bytes: what
  autograd keeps, for a :class:`ActShape`);

Constructor convention: ``Variant(config, **site)`` with ``config`` its own node and keyword-only
facts of its site: ``d_model=`` and ``hidden=`` for an FFN, ``dim=`` for a norm, the width, heads,
``max_seq_len`` and rotary width for a position encoding, ``d_model=`` and the MoE layer's config for a
router; kinds not yet on their own config take the ``ModelConfig`` (``layer=`` for attention, a
balancing term). The static facts take the same arguments.
"""

from __future__ import annotations

import sys
from dataclasses import MISSING, dataclass, field, fields, make_dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Iterable, Optional, Sequence

from archlab.errors import fail

if TYPE_CHECKING:
    from archlab.config.schema import ModelConfig

STATS_BYTES = 4  # norm statistics, log-sum-exp, router math: fp32
ID_BYTES = 8  # int64 ids


def option_names(*configs: type, exclude: Iterable[str] = ("type",)) -> frozenset[str]:
    """The field names of option dataclasses, less ``exclude``: what a variant's ``options`` are
    when it reads every field of them."""
    skip = set(exclude)
    return frozenset(f.name for c in configs for f in fields(c) if f.name not in skip)


@dataclass(frozen=True)
class ActShape:
    """What the saved-bytes formulas need: the config and one micro-batch's shape and dtypes."""

    cfg: "ModelConfig"
    batch: int
    seq_len: int
    act: int  # bytes per activation element
    mask: int  # bytes per dropout-mask element
    device: str  # cpu | cuda: kernels differ

    @property
    def n(self) -> int:
        return self.batch * self.seq_len



# ----------------------------------------------------------------------------- a variant's own config


def kind_base(config_class: type) -> Optional[type]:
    """The base config of the kind ``config_class`` belongs to (the class that names the registry in
    ``variants``), or None for a node with no variants."""
    for cls in config_class.__mro__:
        if "variants" in vars(cls):
            return cls
    return None


def field_default(config_class: type, name: str) -> Any:
    f = {f.name: f for f in fields(config_class)}[name]
    return f.default_factory() if f.default is MISSING else f.default


def variant_class(base: type, names: Sequence[str]) -> type:
    """The config dataclass of the variants ``names`` of ``base``'s kind: the one variant's ``Config``, or
    for several (a hybrid's layer pattern) one dataclass with the keys of each. An unknown name: ``base``
    (the validator names the valid ones)."""
    if any(n not in base.variants for n in names):
        return base
    return _union(tuple(dict.fromkeys(base.variants.get(n).Config for n in names)))


@lru_cache(maxsize=None)
def _union(configs: tuple[type, ...]) -> type:
    configs = tuple(c for c in configs if not any(o is not c and issubclass(o, c) for o in configs))
    if len(configs) == 1:
        return configs[0]
    name = "And".join(c.__name__.removesuffix("Config") for c in configs) + "Config"
    base = kind_base(configs[0])
    cls = make_dataclass(name, [("type", str, field(default=base.type))], bases=configs,  # the kind's default
                         namespace={"__reduce__": lambda self: (_rebuild, (configs, _values(self)))})
    cls.__module__ = __name__
    setattr(sys.modules[__name__], name, cls)
    return cls


def _values(config: Any) -> dict[str, Any]:
    return {f.name: getattr(config, f.name) for f in fields(config)}


def _rebuild(configs: tuple[type, ...], values: dict[str, Any]) -> Any:
    """Unpickle a union config in a process that has not built its class yet (a spawned worker)."""
    return _union(configs)(**values)


def readers(base: type, key: str) -> list[str]:
    """The variants of ``base``'s kind whose config has ``key``."""
    return [n for n in base.variants.names() if key in {f.name for f in fields(base.variants.get(n).Config)}]


def foreign_key(prefix: str, key: str, value: Any, target: type, names: Sequence[str]) -> None:
    """Refuse ``prefix.key=value``, a key the chosen variants' config ``target`` lacks: name the chosen
    type, the keys it accepts and the variants that read the key."""
    base = kind_base(target)
    users = readers(base, key)
    where = f"{key} is read by {prefix.rsplit('.', 1)[-1]}.type {', '.join(users)}" if users else \
        f"no {base.variants.kind} type reads {key}"
    accepted = ", ".join(f.name for f in fields(target))
    fail(f"{prefix}.{key}", value, f"not a key of {prefix.rsplit('.', 1)[-1]}.type {', '.join(names)} "
         f"(its keys: {accepted}); {where}")


def variant_config(config: Any, names: Optional[Sequence[str]] = None, prefix: str = "") -> Any:
    """``config`` as the dataclass of the variant its ``type`` (or ``names``, a layer pattern's) chooses,
    its shared keys carried over. A key the target lacks is refused unless at its default (it has no
    effect there)."""
    base = kind_base(type(config))
    if base is None:
        return config
    names = list(names) if names else [config.type]
    target = variant_class(base, names)
    if type(config) is target or target is base:  # an unknown type name: the validator names the valid ones
        return config
    own = {f.name for f in fields(target)}
    values = _values(config)
    for key, value in values.items():
        if key not in own and value != field_default(type(config), key):
            foreign_key(prefix or base.variants.kind, key, value, target, names)
    return target(**{k: v for k, v in values.items() if k in own})
