"""``attention.type: mha``: multi-head attention with grouped key/value heads (MHA, GQA, MQA by
``n_kv_heads``): causal with a KV cache (a decoder), or bidirectional (``causal=False``: an encoder,
BERT; every query sees every key, no mask).

Shape legend: B batch, S query length, T key length (cache + S), D model dim,
H query heads, G key/value heads (H % G == 0), Dh head dim, N = B*S tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from archlab.errors import fail
from archlab.nn.attention.base import ATTENTIONS, Attention, AttentionConfig, LayerKVCache
from archlab.nn.attention.capture import causal_allowed
from archlab.nn.component import STATS_BYTES, ActShape, option_names
from archlab.nn.mup import attention_scale
from archlab.nn.norms import build_norm, norm_class, norm_params
from archlab.nn.positions import PosContext, apply_rotary, position_class

if TYPE_CHECKING:
    from archlab.config.schema import ModelConfig


def uses_math_sdpa(s: ActShape) -> bool:
    """CPU SDPA runs the math kernel when an additive mask (ALiBi) or attention dropout is on."""
    return s.device == "cpu" and (position_class(s.cfg).score_bias or s.cfg.attention.dropout > 0)


QK_NORM_OVER = ("head", "projection")


@dataclass
class MHAConfig(AttentionConfig):
    """``attention.type: mha``."""

    dropout: float = 0.0  # on attention probabilities (training only)
    qk_norm: bool = False  # normalise q and k before RoPE (Qwen3, OLMo-2, OLMoE); over what: qk_norm_over
    # head: each head, Dh-wide gains (Qwen3) | projection: all of q (H*Dh) and all of k (G*Dh) before the heads
    # are split (OLMo-2, OLMoE)
    qk_norm_over: str = "head"
    # multiply the attention output by sigmoid(x W_g), one gate per channel of each head, before the output
    # projection (gated attention: Qwen3-Next's full-attention layers); W_g is its own (D, H*Dh) projection
    output_gate: bool = False
    # the share of each head's channels RoPE rotates, the first ones (GPT-NeoX's 0.25, Qwen3-Next's 0.25); the rest
    # pass unrotated. Only read when the position rotates q and k
    rotary_fraction: float = 1.0


def qk_norm_dims(cfg: "ModelConfig") -> tuple[int, int]:
    """The widths the q and k norms act over: Dh each per head; H*Dh and G*Dh over the whole projections."""
    if cfg.attention.qk_norm_over == "projection":
        return cfg.n_heads * cfg.d_head, cfg.kv_heads * cfg.d_head
    return cfg.d_head, cfg.d_head


def qk_norm_saved(s: ActShape) -> tuple[bool, float]:
    """Per token, the q and k norms': (whether they keep their input, a view of the qkv output; bytes of
    everything else): H + G rows of Dh per head, one row of H*Dh and one of G*Dh over the projections."""
    cfg = s.cfg
    q_dim, k_dim = qk_norm_dims(cfg)
    norm = norm_class(cfg)
    keeps_input, q_extra = norm.saved(s, dim=q_dim)
    _, k_extra = norm.saved(s, dim=k_dim)
    if cfg.attention.qk_norm_over == "projection":
        return keeps_input, q_extra + k_extra
    return keeps_input, cfg.n_heads * q_extra + cfg.kv_heads * k_extra


def rotate(x_BHSD: Tensor, ctx: PosContext) -> Tensor:
    """RoPE on the first R channels of each head (R: the angles' width, ``rotary_dim``), the rest unrotated."""
    R = ctx.cos.shape[-1]
    if R == x_BHSD.shape[-1]:
        return apply_rotary(x_BHSD, ctx.cos, ctx.sin)
    return torch.cat([apply_rotary(x_BHSD[..., :R], ctx.cos, ctx.sin), x_BHSD[..., R:]], dim=-1)


def gate_saved_bytes(s: ActShape) -> float:
    """The output gate keeps sigmoid(x W_g) and its product with the heads (the output projection's input)."""
    cfg = s.cfg
    return 2.0 * s.n * cfg.n_heads * cfg.d_head * s.act if cfg.attention.output_gate else 0.0


@ATTENTIONS.register("mha")
class CausalSelfAttention(Attention):
    """softmax(q k^T * scale + bias + causal mask) v, then the output projection; without the causal
    mask when built with ``causal=False``.

    Q, K and V come from one fused projection (one GEMM); torch's SDPA does the attention, with
    an additive float mask when ALiBi or a partly filled KV cache needs one.
    """

    Config = MHAConfig
    options = option_names(MHAConfig)
    supports_bidirectional = True

    def __init__(self, cfg: "ModelConfig", *, layer: int, causal: bool = True):
        super().__init__(cfg, layer=layer, causal=causal)
        self.n_heads, self.n_kv_heads, self.d_head = cfg.n_heads, cfg.kv_heads, cfg.d_head
        a = cfg.attention
        self.wqkv = nn.Linear(cfg.d_model, (self.n_heads + 2 * self.n_kv_heads) * self.d_head, bias=a.bias)
        self.wo = nn.Linear(self.n_heads * self.d_head, cfg.d_model, bias=a.bias)
        self.wo.is_residual_proj = True  # GPT-2 scaled init
        self.qk_norm_over = a.qk_norm_over  # head: per head (Dh-wide); projection: all of q (H*Dh), all of k (G*Dh)
        q_dim, k_dim = qk_norm_dims(cfg)
        self.q_norm = build_norm(cfg, dim=q_dim) if a.qk_norm else None
        self.k_norm = build_norm(cfg, dim=k_dim) if a.qk_norm else None
        self.wgate = nn.Linear(cfg.d_model, self.n_heads * self.d_head, bias=a.bias) if a.output_gate else None
        self.dropout = a.dropout
        self.scale = a.scale if a.scale is not None else attention_scale(cfg)  # 1/sqrt(Dh); muP: archlab.nn.mup

    # ------------------------------------------------------------------ facts

    @staticmethod
    def rotary_dim(cfg) -> int:
        """The first ``rotary_fraction`` of the head dim (all of it by default)."""
        return round(cfg.d_model // cfg.n_heads * getattr(cfg.attention, "rotary_fraction", 1.0))

    @classmethod
    def validate(cls, m, prefix: str = "model") -> None:
        super().validate(m, prefix)
        if m.d_model % m.n_heads:
            fail(f"{prefix}.n_heads", m.n_heads, f"d_model ({m.d_model}) must be divisible by n_heads")
        kv = m.n_kv_heads if m.n_kv_heads is not None else m.n_heads
        if kv <= 0:
            fail(f"{prefix}.n_kv_heads", kv, "must be a positive number (1 = MQA, n_heads = MHA)")
        if m.n_heads % kv:
            fail(f"{prefix}.n_kv_heads", kv, f"n_heads ({m.n_heads}) must be divisible by n_kv_heads")
        if m.attention.qk_norm_over not in QK_NORM_OVER:
            fail(f"{prefix}.attention.qk_norm_over", m.attention.qk_norm_over,
                 f"must be one of {', '.join(QK_NORM_OVER)}")
        fraction, d_head = m.attention.rotary_fraction, m.d_model // m.n_heads
        if not 0.0 < fraction <= 1.0 or d_head * fraction != round(d_head * fraction):
            fail(f"{prefix}.attention.rotary_fraction", fraction,
                 f"must lie in (0, 1] and rotate whole channels of the head dim ({d_head}): a multiple of 1/{d_head}")
        rot = cls.rotary_dim(m)
        if position_class(m).rotates_qk and rot % 2 and fraction != 1.0:
            fail(f"{prefix}.attention.rotary_fraction", fraction,
                 f"rope rotates pairs of channels: the rotated part of the head dim ({d_head}) = {rot} must be even")
        if position_class(m).rotates_qk and rot % 2:  # RoPE's rule on this attention's head dim
            fail(f"{prefix}.n_heads", m.n_heads,
                 f"rope rotates pairs of channels: the rotated head dim = {rot} must be even")

    @classmethod
    def num_params(cls, cfg: "ModelConfig", *, layer: int) -> int:
        d, dh, h, g = cfg.d_model, cfg.d_head, cfg.n_heads, cfg.kv_heads
        n = d * (h + 2 * g) * dh + h * dh * d
        if cfg.attention.bias:
            n += (h + 2 * g) * dh + d
        if cfg.attention.qk_norm:
            n += sum(norm_params(cfg, dim=dim) for dim in qk_norm_dims(cfg))
        if cfg.attention.output_gate:  # W_g (D, H*Dh) and its bias
            n += d * h * dh + (h * dh if cfg.attention.bias else 0)
        return n

    @classmethod
    def core_keys(cls, cfg: "ModelConfig", seq_len: int, *, layer: int) -> float:
        """Keys each query is multiplied with, on average: the full causal square counts S."""
        return float(seq_len)

    @classmethod
    def forward_flops(cls, cfg: "ModelConfig", seq_len: int, *, layer: int) -> dict[str, float]:
        """2*D*(H+2G)*Dh (and 2*D*H*Dh for the output gate's projection) and 2*H*Dh*D for the projections;
        Q K^T and P V each 2 * keys * H * Dh (K/V heads shared by GQA are read by every query head, so H, not G,
        counts). The gate's sigmoid and product are elementwise (not counted)."""
        d, h, g, dh = cfg.d_model, cfg.n_heads, cfg.kv_heads, cfg.d_head
        core = 2.0 * cls.core_keys(cfg, seq_len, layer=layer) * h * dh
        gate = 2.0 * d * h * dh if cfg.attention.output_gate else 0.0
        return {"qkv_proj": 2.0 * d * (h + 2 * g) * dh + gate, "out_proj": 2.0 * h * dh * d,
                "attn_scores": core, "attn_values": core}

    @classmethod
    def kv_cache_bytes(cls, cfg: "ModelConfig", context: int, *, layer: int, dtype_bytes: int) -> float:
        """K and V: 2 * G * Dh per position."""
        return 2.0 * cfg.kv_heads * cfg.d_head * context * dtype_bytes

    @classmethod
    def saved_bytes(cls, s: ActShape, *, layer: int) -> float:
        """All N tokens of one layer: the QKV input, q/k norms, what SDPA keeps, an output copy.

        The fused kernels (CPU flash; CUDA flash / memory-efficient) keep q, k, v (after RoPE; G
        key/value heads, read through SDPA's ``enable_gqa`` without copies), the output and the
        log-sum-exp (fp32 per head and token); CUDA also keeps an additive mask (ALiBi: one
        (H, S, S) tensor per layer). CPU runs the math kernel, in fp32, for a mask (ALiBi) or
        attention dropout: copies of q, k, v, the (B, H, S, S) probabilities (+ mask and dropped
        probabilities with dropout) and a copy of the output for the projection.
        """
        cfg, n, a = s.cfg, s.n, s.act
        H, G, Dh, S = cfg.n_heads, cfg.kv_heads, cfg.d_head, s.seq_len
        rope, qk_norm = position_class(cfg).rotates_qk, cfg.attention.qk_norm
        total = n * cfg.d_model * a  # input of wqkv
        qkv_kept = not uses_math_sdpa(s)  # the fused kernels keep v, a view of the qkv output
        if qk_norm:  # per head (or projection) and token; the norms read views of the qkv output
            keeps_input, extra = qk_norm_saved(s)
            total += n * extra
            qkv_kept = qkv_kept or keeps_input
        if qkv_kept:
            total += n * (H + 2 * G) * Dh * a
        if uses_math_sdpa(s):  # the CPU math kernel computes in fp32 whatever the input dtype
            f = STATS_BYTES
            total += 3 * n * H * Dh * f  # q (scaled), k^T, v copies
            total += n * H * S * f  # softmax probabilities
            if cfg.attention.dropout > 0:
                total += 2 * n * H * S * f  # mask and dropped probabilities
            return total + n * H * Dh * a + gate_saved_bytes(s)  # output, copied to (B, S, H*Dh) for wo
        # q and k handed to SDPA are new tensors after RoPE or the q/k norms
        if rope or qk_norm:
            total += n * (H + G) * Dh * a
        total += n * H * Dh * a + n * H * STATS_BYTES  # output + log-sum-exp
        partial = rope and cls.rotary_dim(cfg) < Dh
        if (partial or qk_norm and cfg.attention.qk_norm_over == "head") and s.device == "cpu":
            # normed q per head, or q rotated in part (a concatenation), is (B, H, S, Dh)-contiguous: wo's input
            # is a copy (normed over the projection, or rotated whole, it stays (B, S, H, Dh) underneath)
            total += n * H * Dh * a
        if s.device == "cuda" and position_class(cfg).score_bias:
            total += H * S * S * a  # the additive bias, one per layer
        return total + gate_saved_bytes(s)

    @classmethod
    def selective_saved_bytes(cls, s: ActShape, *, layer: int) -> float:
        """The QKV and output projections' outputs and SDPA's: the fused kernel's output and
        log-sum-exp, or the CPU math kernel's two bmm outputs (the (B*H, S, S) scores and the
        weighted values, fp32)."""
        cfg, n, a, f = s.cfg, s.n, s.act, STATS_BYTES
        H, G, Dh, D = cfg.n_heads, cfg.kv_heads, cfg.d_head, cfg.d_model
        total = n * (H + 2 * G) * Dh * a + n * D * a
        if cfg.attention.output_gate:
            total += n * H * Dh * a  # the gate projection's output
        if uses_math_sdpa(s):
            return total + n * H * s.seq_len * f + n * H * Dh * f
        return total + n * H * Dh * a + n * H * f

    # ------------------------------------------------------------------ forward

    def qkv(self, x_BSD: Tensor, ctx: PosContext) -> tuple[Tensor, Tensor, Tensor]:
        """q (B, H, S, Dh), k and v (B, G, S, Dh): projected, q/k-normed, rotated."""
        B, S, _ = x_BSD.shape
        H, G, Dh = self.n_heads, self.n_kv_heads, self.d_head
        if self.q_norm is not None and self.qk_norm_over == "projection":  # norms over (B, S, H*Dh), (B, S, G*Dh)
            q, k, v = self.wqkv(x_BSD).split([H * Dh, G * Dh, G * Dh], dim=-1)
            q, k = self.q_norm(q), self.k_norm(k)
            q, k, v = (t.view(B, S, -1, Dh).transpose(1, 2) for t in (q, k, v))
        else:
            qkv = self.wqkv(x_BSD).view(B, S, H + 2 * G, Dh).transpose(1, 2)  # (B, H+2G, S, Dh)
            q, k, v = qkv.split([H, G, G], dim=1)
            if self.q_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)
        if ctx.cos is not None:
            q, k = rotate(q, ctx), rotate(k, ctx)
        return q, k, v

    def out(self, y_BHSD: Tensor, x_BSD: Optional[Tensor] = None) -> Tensor:
        """The output projection of the heads (B, H, S, Dh), gated by sigmoid(x W_g) with ``output_gate`` (the
        layer's input ``x_BSD`` is then needed)."""
        B, H, S, Dh = y_BHSD.shape
        y = y_BHSD.transpose(1, 2).reshape(B, S, H * Dh)
        if self.wgate is not None:
            y = y * torch.sigmoid(self.wgate(x_BSD))
        return self.wo(y)

    def forward(self, x_BSD: Tensor, ctx: PosContext, cache: Optional[LayerKVCache] = None) -> Tensor:
        S = x_BSD.shape[1]
        q, k, v = self.qkv(x_BSD, ctx)
        past = 0
        if cache is not None:
            past = cache.length
            k, v = cache.update(k, v)  # (B, G, T, Dh)
        mask = self._mask(S, past, ctx, x_BSD, self.causal)
        # enable_gqa: query head h reads K/V head h // (H/G) without materialising repeated K/V.
        # is_causal reads no S: one query on one key is causal either way, and under dynamic
        # shapes torch.compile would pass S > 1 as a symbolic bool, which SDPA refuses
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=self.causal and mask is None and past == 0,
            dropout_p=self.dropout if self.training else 0.0, scale=self.scale,
            enable_gqa=self.n_kv_heads != self.n_heads)  # (B, H, S, Dh)
        if self.capture is not None and cache is None:
            T = k.shape[2]
            allowed = causal_allowed(S, T, x_BSD.device) if self.causal else x_BSD.new_ones(S, T, dtype=torch.bool)
            self.capture.record(q, k, v, scale=self.scale, allowed=allowed, bias=ctx.bias)
        return self.out(y, x_BSD)

    @staticmethod
    def _mask(S: int, past: int, ctx: PosContext, x: Tensor, causal: bool = True) -> Optional[Tensor]:
        """None when SDPA's own causal flag suffices (or, without causality, nothing is masked); else an
        additive (H|1, S, T) float mask."""
        if not causal:
            return None if ctx.bias is None else ctx.bias.to(x.dtype)
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
