"""What every component states about itself, so that the rest of archlab asks it instead of
switching on its ``type:`` name.

A component kind (attention, position, rope scaling, norm, FFN, router, balancing term) is one
:class:`archlab.registry.Registry`; a variant is one class registered there by name. Each class
carries, next to its forward:

- its config: a dataclass in the same module, composed into the recipe schema by
  ``archlab.config.schema`` (which only composes; nothing in ``archlab.nn`` imports the config
  package at run time);
- ``validate(m, prefix)``: its rules on the ``model`` node, raising ``archlab.errors.RecipeError``
  through ``archlab.errors.fail(key, value, rule)``;
- ``options``: the keys of its kind's config node that it reads (besides ``type``; a nested node
  such as RoPE's ``rope_scaling`` counts as one key). A key that only other variants of its kind
  read has no effect on it: ``archlab.config.options`` refuses a recipe that sets one to anything
  but its default, naming the key, the selected variant and the variants that read it;
- ``num_params(...)``, its matmul FLOPs per token and its saved-for-backward bytes, in the
  conventions of ``archlab.costs`` (FLOPs: the ones ``FlopCounterMode`` counts; bytes: what
  autograd keeps, for a :class:`ActShape`);

Constructor convention, every kind: ``Variant(cfg, **site)`` with ``cfg`` the ``ModelConfig``
and keyword-only site arguments where one recipe builds the component in several places
(``dim=`` for a norm, ``hidden=`` for an FFN, ``layer=`` for attention). The static facts take
the same arguments.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Iterable

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

