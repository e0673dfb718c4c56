"""Cross-attention: an encoder-decoder's decoder layers attend to the encoder's output (T5; the 2017
Transformer's "encoder-decoder attention").

Shape legend: B batch, S decoder (query) positions, M encoder (memory) positions, D model dim,
H query heads, G key/value heads, Dh head dim.

Queries come from the decoder's stream, keys and values from the encoder's final hidden states (the
memory). No mask: every decoder position may read every encoder position, and no position encoding
(T5 adds none to cross-attention scores). In generation the memory is fixed for the whole sequence: its
keys and values are projected once, at the first decoder step, and kept in the layer's cache
(:class:`archlab.nn.attention.LayerKVCache`, filled once, never grown).

Its facts, as every component's (``archlab.nn.component``): ``num_params``, ``forward_flops`` (per decoder
token, with the memory's K/V projection stated per encoder token), ``saved_bytes`` and
``kv_cache_bytes`` (per encoder position). It reads the same options as self-attention
(``attention.bias``, ``dropout``, ``scale``; ``n_kv_heads``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from archlab.nn.attention.base import LayerKVCache
from archlab.nn.attention.capture import Capturable
from archlab.nn.component import STATS_BYTES, ActShape
from archlab.nn.mup import attention_scale

if TYPE_CHECKING:
    from archlab.config.schema import ModelConfig


class CrossAttention(Capturable, nn.Module):
    """softmax(q(x) k(memory)^T * scale) v(memory), then the output projection."""


    def __init__(self, cfg: "ModelConfig"):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.d_head = cfg.n_heads, cfg.kv_heads, cfg.d_head
        a = cfg.attention
        self.wq = nn.Linear(cfg.d_model, self.n_heads * self.d_head, bias=a.bias)
        self.wkv = nn.Linear(cfg.d_model, 2 * self.n_kv_heads * self.d_head, bias=a.bias)  # [k; v] rows
        self.wo = nn.Linear(self.n_heads * self.d_head, cfg.d_model, bias=a.bias)
        self.wo.is_residual_proj = True
        self.dropout = a.dropout
        self.scale = a.scale if a.scale is not None else attention_scale(cfg)

    # ------------------------------------------------------------------ facts

    @staticmethod
    def num_params(cfg: "ModelConfig") -> int:
        d, dh, h, g = cfg.d_model, cfg.d_head, cfg.n_heads, cfg.kv_heads
        n = d * (h + 2 * g) * dh + h * dh * d
        return n + ((h + 2 * g) * dh + d if cfg.attention.bias else 0)

    @staticmethod
    def forward_flops(cfg: "ModelConfig", memory_len: int) -> dict[str, float]:
        """Per decoder token: the query and output projections, Q K^T and P V over the ``memory_len`` keys
        (``q_proj``, ``out_proj``, ``scores``, ``values``); ``kv_proj`` is per ENCODER token (the memory's K and V
        are projected once per encoder position, whatever the decoder length)."""
        d, h, g, dh = cfg.d_model, cfg.n_heads, cfg.kv_heads, cfg.d_head
        core = 2.0 * memory_len * h * dh
        return {"q_proj": 2.0 * d * h * dh, "out_proj": 2.0 * h * dh * d, "scores": core, "values": core,
                "kv_proj": 2.0 * d * 2 * g * dh}

    @staticmethod
    def kv_cache_bytes(cfg: "ModelConfig", memory_len: int, *, dtype_bytes: int) -> float:
        """K and V of every encoder position: 2 * G * Dh each, computed once per sequence."""
        return 2.0 * cfg.kv_heads * cfg.d_head * memory_len * dtype_bytes

    @staticmethod
    def saved_bytes(s: ActShape, memory_len: int) -> float:
        """One layer, for the S decoder tokens of ``s`` and ``memory_len`` encoder positions (measured on CPU):
        the query projection's input, q, k and v (the memory's: 2 * G * Dh per encoder position), the fused
        kernel's output (the output projection reads a view of it) and log-sum-exp (fp32 per head and token).
        The memory itself (the K/V projection's input) is one tensor for all layers: ``archlab.costs.memory``
        counts it once. Attention dropout (the CPU math kernel) is not modelled."""
        cfg, a, n = s.cfg, s.act, s.n
        if cfg.attention.dropout > 0:
            raise NotImplementedError("CrossAttention.saved_bytes: attention dropout (the math kernel) is not modelled")
        H, G, Dh = cfg.n_heads, cfg.kv_heads, cfg.d_head
        memory_kv = s.batch * memory_len * 2 * G * Dh * a
        return n * cfg.d_model * a + 2 * n * H * Dh * a + n * H * STATS_BYTES + memory_kv

    @staticmethod
    def selective_saved_bytes(s: ActShape, memory_len: int) -> float:
        """Under selective checkpointing: the outputs of its projections (q; k and v of the memory; the
        output projection's) and the fused kernel's output and log-sum-exp."""
        cfg, a, n = s.cfg, s.act, s.n
        H, G, Dh = cfg.n_heads, cfg.kv_heads, cfg.d_head
        return n * H * Dh * a + s.batch * memory_len * 2 * G * Dh * a + n * H * Dh * a + n * H * STATS_BYTES \
            + n * cfg.d_model * a

    # ------------------------------------------------------------------ forward

    def memory_kv(self, memory_BMD: Tensor) -> tuple[Tensor, Tensor]:
        """k, v (B, G, M, Dh) of the encoder's output."""
        B, M, _ = memory_BMD.shape
        kv = self.wkv(memory_BMD).view(B, M, 2 * self.n_kv_heads, self.d_head).transpose(1, 2)
        k, v = kv.split([self.n_kv_heads, self.n_kv_heads], dim=1)
        return k, v

    def forward(self, x_BSD: Tensor, memory_BMD: Tensor, cache: Optional[LayerKVCache] = None) -> Tensor:
        B, S, _ = x_BSD.shape
        q = self.wq(x_BSD).view(B, S, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, S, Dh)
        if cache is not None and cache.k is not None:
            k, v = cache.k, cache.v  # projected at the first decoder step
        else:
            k, v = self.memory_kv(memory_BMD)
            if cache is not None:
                cache.k, cache.v, cache.length = k, v, k.shape[2]
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0,
                                           scale=self.scale, enable_gqa=self.n_kv_heads != self.n_heads)
        if self.capture is not None:  # every query sees every memory position
            self.capture.record(q, k, v, scale=self.scale, allowed=q.new_ones(S, k.shape[2], dtype=torch.bool))
        return self.wo(y.transpose(1, 2).reshape(B, S, self.n_heads * self.d_head))
