"""Causal multi-head attention with grouped key/value heads (MHA, GQA, MQA) and a KV cache.

Shape legend: B batch, S query length, T key length (cache + S), D model dim,
H query heads, G key/value heads (H % G == 0), Dh head dim.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from archlab.config.schema import ModelConfig
from archlab.nn.mup import attention_scale
from archlab.nn.norms import build_norm, norm_params
from archlab.nn.positions import PosContext, apply_rotary


class LayerKVCache:
    """Keys and values seen so far by one layer, grown along the sequence dim."""

    def __init__(self):
        self.k: Optional[Tensor] = None  # (B, G, T, Dh)
        self.v: Optional[Tensor] = None

    def update(self, k_BGSD: Tensor, v_BGSD: Tensor) -> tuple[Tensor, Tensor]:
        if self.k is None:
            self.k, self.v = k_BGSD, v_BGSD
        else:
            self.k = torch.cat([self.k, k_BGSD], dim=2)
            self.v = torch.cat([self.v, v_BGSD], dim=2)
        return self.k, self.v

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]


class KVCache:
    """One :class:`LayerKVCache` per layer; ``length`` is the number of cached positions."""

    def __init__(self, n_layers: int):
        self.layers = [LayerKVCache() for _ in range(n_layers)]

    @property
    def length(self) -> int:
        return self.layers[0].length


class CausalSelfAttention(nn.Module):
    """softmax(q k^T * scale + bias + causal mask) v, then the output projection.

    Q, K and V come from one fused projection (one GEMM); torch's SDPA does the attention, with
    an additive float mask when ALiBi or a partly filled KV cache needs one.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.d_head = cfg.n_heads, cfg.kv_heads, cfg.d_head
        a = cfg.attention
        self.wqkv = nn.Linear(cfg.d_model, (self.n_heads + 2 * self.n_kv_heads) * self.d_head, bias=a.bias)
        self.wo = nn.Linear(self.n_heads * self.d_head, cfg.d_model, bias=a.bias)
        self.wo.is_residual_proj = True  # GPT-2 scaled init
        self.q_norm = build_norm(self.d_head, cfg.norm) if a.qk_norm else None
        self.k_norm = build_norm(self.d_head, cfg.norm) if a.qk_norm else None
        self.dropout = a.dropout
        self.scale = a.scale if a.scale is not None else attention_scale(cfg)  # 1/sqrt(Dh); muP: archlab.nn.mup

    @staticmethod
    def num_params(cfg: ModelConfig) -> int:
        d, dh, h, g = cfg.d_model, cfg.d_head, cfg.n_heads, cfg.kv_heads
        n = d * (h + 2 * g) * dh + h * dh * d
        if cfg.attention.bias:
            n += (h + 2 * g) * dh + d
        if cfg.attention.qk_norm:
            n += 2 * norm_params(dh, cfg.norm)
        return n

    def forward(self, x_BSD: Tensor, ctx: PosContext, cache: Optional[LayerKVCache] = None) -> Tensor:
        B, S, _ = x_BSD.shape
        H, G, Dh = self.n_heads, self.n_kv_heads, self.d_head
        qkv = self.wqkv(x_BSD).view(B, S, H + 2 * G, Dh).transpose(1, 2)  # (B, H+2G, S, Dh)
        q, k, v = qkv.split([H, G, G], dim=1)  # (B, H, S, Dh), (B, G, S, Dh) x2
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if ctx.cos is not None:
            q, k = apply_rotary(q, ctx.cos, ctx.sin), apply_rotary(k, ctx.cos, ctx.sin)
        past = 0
        if cache is not None:
            past = cache.length
            k, v = cache.update(k, v)  # (B, G, T, Dh)
        mask = self._mask(S, past, ctx, x_BSD)
        # enable_gqa: query head h reads K/V head h // (H/G) without materialising repeated K/V.
        # is_causal reads no S: one query on one key is causal either way, and under dynamic
        # shapes torch.compile would pass S > 1 as a symbolic bool, which SDPA refuses
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None and past == 0,
            dropout_p=self.dropout if self.training else 0.0, scale=self.scale, enable_gqa=G != H)  # (B, H, S, Dh)
        return self.wo(y.transpose(1, 2).reshape(B, S, H * Dh))

    @staticmethod
    def _mask(S: int, past: int, ctx: PosContext, x: Tensor) -> Optional[Tensor]:
        """None when SDPA's own causal flag suffices; else an additive (H|1, S, T) float mask."""
        if ctx.bias is None and (past == 0 or S == 1):
            return None
        T = past + S
        q_pos = torch.arange(past, T, device=x.device)
        k_pos = torch.arange(T, device=x.device)
        blocked = k_pos[None, :] > q_pos[:, None]  # (S, T)
        mask = torch.zeros(S, T, device=x.device, dtype=x.dtype).masked_fill(blocked, float("-inf"))
        if ctx.bias is not None:
            mask = ctx.bias.to(x.dtype) + mask  # (H, S, T)
        return mask
