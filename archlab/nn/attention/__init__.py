"""Attention variants, by ``attention.type``: one module each, registered in ``ATTENTIONS``.

- ``mha``: MHA / GQA / MQA by ``n_kv_heads`` (``mha.py``)
- ``sliding_window``: Mistral's window, Gemma's local/global layer pattern (``sliding.py``)
- ``mla``: DeepSeek's multi-head latent attention (``mla.py``)
- ``gated_deltanet``: Gated DeltaNet, linear attention with a fixed-size state (``gated_deltanet.py``)

The protocol every variant follows is in ``base.py``. A new variant is a module here, its import
below (which registers it) and its options dataclass added to ``AttentionConfig``.
"""

from dataclasses import dataclass

from archlab.nn.attention.base import (
    ATTENTIONS,
    Attention,
    AttentionOptions,
    KVCache,
    LayerKVCache,
    attention_class,
    attention_classes,
    build_attention,
    layer_pattern,
    layer_type,
    validate_pattern,
)
from archlab.nn.attention.gated_deltanet import GatedDeltaNet, GatedDeltaNetOptions, LayerStateCache
from archlab.nn.attention.mha import CausalSelfAttention
from archlab.nn.attention.mla import MLAOptions, MultiHeadLatentAttention  # noqa: F401  (registers mla)
from archlab.nn.attention.sliding import SlidingWindowAttention, SlidingWindowOptions


@dataclass
class AttentionConfig(GatedDeltaNetOptions, MLAOptions, SlidingWindowOptions, AttentionOptions):
    """``model.attention``: the options every variant reads, then each variant's own."""


__all__ = [
    "ATTENTIONS", "Attention", "AttentionConfig", "AttentionOptions", "CausalSelfAttention", "GatedDeltaNet", "KVCache",
    "LayerKVCache", "LayerStateCache", "SlidingWindowAttention", "attention_class", "attention_classes",
    "build_attention", "layer_pattern", "layer_type", "validate_pattern",
]
