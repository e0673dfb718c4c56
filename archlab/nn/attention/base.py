"""The attention protocol: what every ``attention.type`` variant provides, and the KV cache.

Shape legend: B batch, S query length, T key length (cache + S), D model dim, H query heads,
G key/value heads, Dh head dim.

A variant is one class in one module of this package, registered in ``ATTENTIONS``; its
config (``Config``) is a dataclass in the same module subclassing :class:`AttentionConfig`, and
``attention.type`` chooses it (a layer pattern: one dataclass with the keys of each of its variants).
``model.layers.pattern`` may give layers different variants (a hybrid: :func:`layer_type`).
Besides ``forward(x_BSD, ctx, cache)`` it states (site arguments: ``layer``, since a recipe may give layers
different windows or variants, and ``causal``, whether a query sees only the keys at or
before its position (a decoder) or every key (an encoder); the model type decides, the variant says
whether it can):

- ``supports_bidirectional``: whether it runs without the causal mask (``causal=False``); a variant
  that cannot is refused for an encoder (``archlab.model.encoder``);
- ``validate(m, prefix)``: its rules on the ``model`` node;
- ``Config`` and ``options``: its dataclass and the keys of ``model.attention`` it reads (``archlab.nn.component``);
- ``rotary_dim(cfg)``: the channels RoPE rotates per head;
- ``num_params(cfg, layer=)``; ``forward_flops(cfg, seq_len, layer=)``: matmul FLOPs per token as
  ``{"qkv_proj", "out_proj", "attn_scores", "attn_values"}`` (``archlab.costs.flops``: input
  projections, output projection, Q K^T, P V, in FlopCounterMode's conventions); ``training_flops``: the
  same with backward (three forwards unless the variant says otherwise);
- ``saved_bytes(s, layer=)`` and ``selective_saved_bytes(s, layer=)``: what one layer keeps for
  backward without checkpointing and under selective checkpointing (``archlab.costs.memory``);
- ``kv_cache_bytes(cfg, context, layer=, dtype_bytes=)``: one sequence's inference cache;
- ``new_cache(layer)``: the cache it fills in generation (:class:`LayerKVCache`; a linear-attention layer's
  fixed-size state: ``archlab.nn.attention.gated_deltanet.LayerStateCache``), with ``length`` positions seen;
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Optional

import torch
from torch import Tensor, nn

from archlab.errors import fail
from archlab.nn.attention.capture import Capturable
from archlab.nn.component import ActShape, option_names
from archlab.registry import Registry

if TYPE_CHECKING:
    from archlab.config.schema import ModelConfig

ATTENTIONS: Registry = Registry("attention")


@dataclass
class AttentionConfig:
    """``model.attention``: the keys every variant reads; a variant's own keys are in its ``Config``."""

    variants: ClassVar[Registry] = ATTENTIONS  # attention.type chooses the dataclass
    # mha: MHA / GQA / MQA by n_kv_heads; sliding_window: Mistral, Gemma's local/global layers; mla: DeepSeek;
    # gated_deltanet: linear attention with a fixed-size state (hybrids with mha: model.layers.pattern)
    type: str = "mha"  # mha | sliding_window | mla | gated_deltanet
    bias: bool = True  # bias on the input and output projections (GPT-2 yes, LLaMA no)
    scale: Optional[float] = None  # score scale; None = 1/sqrt(q/k head dim) (muP: archlab.nn.mup). Ablation switch

    @staticmethod
    def chosen(model) -> list[str]:
        """The variants a model node's layers choose besides ``type``: a layer pattern's ([] = none)."""
        return list(dict.fromkeys(layer_pattern(model)))


class LayerKVCache:
    """What one layer keeps of the positions seen so far, grown along the sequence dim.

    ``k`` and ``v`` are whatever the variant caches (MHA: keys and values (B, G, T, Dh); MLA: the
    compressed latent and the shared RoPE key). ``window``: keep only the last ``window - 1``
    positions (a rolling buffer: a sliding-window layer never reads further back), so the cache
    stays bounded however long generation goes on. ``length`` counts every position seen.
    """

    def __init__(self, window: Optional[int] = None, seq_dim: int = 2):
        self.k: Optional[Tensor] = None
        self.v: Optional[Tensor] = None
        self.window, self.seq_dim = window, seq_dim
        self.length = 0

    @property
    def stored(self) -> int:
        """Positions held now (== length without a window)."""
        return 0 if self.k is None else self.k.shape[self.seq_dim]

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append the new positions; return everything held before the trim (past + new)."""
        d = self.seq_dim
        if self.k is not None:
            k, v = torch.cat([self.k, k], dim=d), torch.cat([self.v, v], dim=d)
        self.length += k.shape[d] - self.stored
        keep = k.shape[d] if self.window is None else min(k.shape[d], self.window - 1)
        self.k, self.v = k.narrow(d, k.shape[d] - keep, keep), v.narrow(d, v.shape[d] - keep, keep)
        return k, v


class KVCache:
    """One :class:`LayerKVCache` per layer; ``length`` is the number of positions seen."""

    def __init__(self, layers):
        self.layers = [LayerKVCache() for _ in range(layers)] if isinstance(layers, int) else list(layers)

    @property
    def length(self) -> int:
        return self.layers[0].length


class Attention(Capturable, nn.Module):
    """Base of every variant; see the module docstring for the protocol."""

    Config: ClassVar[type[AttentionConfig]] = AttentionConfig
    options: ClassVar[frozenset[str]] = option_names(AttentionConfig)  # every variant reads these
    supports_bidirectional: ClassVar[bool] = False  # runs with causal=False (an encoder's attention)
    bidirectional_unsupported: ClassVar[str] = "this attention variant has only a causal form"

    def __init__(self, cfg: "ModelConfig", *, layer: int, causal: bool = True):
        super().__init__()
        if not causal and not self.supports_bidirectional:
            raise ValueError(f"{type(self).__name__}: causal=False: {self.bidirectional_unsupported}")
        self.causal = causal  # False: every query sees every key (no mask)

    def new_cache(self) -> LayerKVCache:
        return LayerKVCache()

    @staticmethod
    def rotary_dim(cfg: "ModelConfig") -> int:
        raise NotImplementedError

    @classmethod
    def validate(cls, m, prefix: str = "model") -> None:
        a = m.attention
        if not 0.0 <= getattr(a, "dropout", 0.0) < 1.0:
            fail(f"{prefix}.attention.dropout", a.dropout, "must lie in [0, 1)")
        if a.scale is not None and a.scale <= 0:
            fail(f"{prefix}.attention.scale", a.scale, "must be positive (or null for 1/sqrt(head dim))")

    @classmethod
    def num_params(cls, cfg: "ModelConfig", *, layer: int) -> int:
        raise NotImplementedError

    @classmethod
    def forward_flops(cls, cfg: "ModelConfig", seq_len: int, *, layer: int) -> dict[str, float]:
        raise NotImplementedError

    @classmethod
    def training_flops(cls, cfg: "ModelConfig", seq_len: int, *, layer: int) -> dict[str, float]:
        """Forward + backward per token, by the keys of :meth:`forward_flops`: three forwards (each matmul's
        backward is two of its size); a variant whose backward differs says so."""
        return {k: 3.0 * v for k, v in cls.forward_flops(cfg, seq_len, layer=layer).items()}

    @classmethod
    def saved_bytes(cls, s: ActShape, *, layer: int) -> float:
        raise NotImplementedError(f"{cls.__name__} has no activation-memory model")

    @classmethod
    def selective_saved_bytes(cls, s: ActShape, *, layer: int) -> float:
        raise NotImplementedError(f"{cls.__name__} has no selective-checkpointing memory model")

    @classmethod
    def kv_cache_bytes(cls, cfg: "ModelConfig", context: int, *, layer: int, dtype_bytes: int) -> float:
        raise NotImplementedError


def layer_pattern(cfg) -> list[str]:
    """``model.layers.pattern``: the ``attention.type`` names repeated over the depth ([] = none)."""
    layers = getattr(cfg, "layers", None)
    return list(layers.pattern) if layers is not None and layers.pattern else []


def layer_type(cfg, layer: int) -> str:
    """The ``attention.type`` of ``layer``: layer i has ``pattern[i % len(pattern)]``, else every layer
    ``attention.type``."""
    pattern = layer_pattern(cfg)
    return pattern[layer % len(pattern)] if pattern else cfg.attention.type


def attention_class(cfg, layer: Optional[int] = None) -> type[Attention]:
    """The variant of ``layer``. Without ``layer`` (a question about the stack as a whole): ``attention.type``,
    or a layer pattern's first entry; facts that differ by layer are asked per layer."""
    return ATTENTIONS.get(layer_type(cfg, 0 if layer is None else layer))


def attention_classes(cfg) -> list[type[Attention]]:
    """Every variant the stack uses, once each, in layer order."""
    return [ATTENTIONS.get(t) for t in dict.fromkeys(layer_pattern(cfg) or [cfg.attention.type])]


def validate_pattern(m, prefix: str = "model") -> None:
    """``model.layers.pattern`` names registered variants, divides the depth and replaces ``attention.type``."""
    pattern = layer_pattern(m)
    if not pattern:
        return
    for i, name in enumerate(pattern):
        if name not in ATTENTIONS.names():
            fail(f"{prefix}.layers.pattern[{i}]", name, f"must be one of {', '.join(ATTENTIONS.names())}")
    if m.n_layers % len(pattern):
        fail(f"{prefix}.n_layers", m.n_layers, f"must be a multiple of the layer pattern's length ({len(pattern)}): "
             "layer i uses pattern[i % len(pattern)]")
    if m.attention.type != AttentionConfig.type:
        fail(f"{prefix}.attention.type", m.attention.type,
             "model.layers.pattern places the mixers by layer: name this type in the pattern instead")


def build_attention(cfg: "ModelConfig", *, layer: int, causal: bool = True) -> Attention:
    """The mixer of ``layer``; ``type_name`` on the module says which (``block.attn.type_name``)."""
    module = attention_class(cfg, layer)(cfg, layer=layer, causal=causal)
    module.type_name = layer_type(cfg, layer)
    return module
