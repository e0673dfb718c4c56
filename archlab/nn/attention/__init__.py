"""Attention variants, by ``attention.type``: one module each, registered in ``ATTENTIONS``.

- ``mha``: MHA / GQA / MQA by ``n_kv_heads`` (``mha.py``)
- ``sliding_window``: Mistral's window, Gemma's local/global layer pattern (``sliding.py``)
- ``mla``: DeepSeek's multi-head latent attention (``mla.py``)
- ``gated_deltanet``: Gated DeltaNet, linear attention with a fixed-size state (``gated_deltanet.py``)

The protocol every variant follows is in ``base.py``. A new variant is a module here with its class and
its ``Config`` (a subclass of ``AttentionConfig``, chosen by ``attention.type``), and its import below,
which registers it.
"""

from archlab.nn.attention.base import (
    ATTENTIONS,
    Attention,
    AttentionConfig,
    KVCache,
    LayerKVCache,
    attention_class,
    attention_classes,
    build_attention,
    layer_pattern,
    layer_type,
    validate_pattern,
)
from archlab.nn.attention.gated_deltanet import GatedDeltaNet, GatedDeltaNetConfig, LayerStateCache
from archlab.nn.attention.mha import CausalSelfAttention, MHAConfig
from archlab.nn.attention.mla import MLAConfig, MultiHeadLatentAttention
from archlab.nn.attention.sliding import SlidingWindowAttention, SlidingWindowConfig

__all__ = [
    "ATTENTIONS", "Attention", "AttentionConfig", "CausalSelfAttention", "GatedDeltaNet", "GatedDeltaNetConfig",
    "KVCache", "LayerKVCache", "LayerStateCache", "MHAConfig", "MLAConfig", "MultiHeadLatentAttention",
    "SlidingWindowAttention", "SlidingWindowConfig", "attention_class", "attention_classes", "build_attention",
    "layer_pattern", "layer_type", "validate_pattern",
]
