"""``attention.type: mla``: multi-head latent attention (DeepSeek-V2, DeepSeek-AI 2024; DeepSeek-V3).

Shape legend: B batch, S query length, T key length (cache + S), D model dim, H heads,
Q q_lora_rank, C kv_lora_rank (the latent), P qk_nope_head_dim, R qk_rope_head_dim,
K = P + R query/key head dim, V v_head_dim, N = B*S tokens.

Keys and values of every head are up-projected from one small latent per token, and positions
enter through a separate RoPE key of R channels that all heads share:

    query    q = W_UQ norm(W_DQ x)  (or W_Q x: q_lora_rank null)   (B, S, H, P + R) = [q_P ; q_R]
    latent   [c ; k_R] = W_DKV x,  c <- norm(c)                    c (B, S, C), k_R (B, S, R)
    keys     k_h = [W_UK,h c ; RoPE(k_R)]                           (B, H, T, P + R)
    values   v_h = W_UV,h c                                         (B, H, T, V)
    output   W_O [softmax(q_h k_h^T * scale + causal) v_h]_h, q_R rotated by RoPE too

Training (no cache) computes k and v as written and runs SDPA. With a KV cache, the up-projections
are absorbed (DeepSeek-V2, section 2.1.2): q_P,h . W_UK,h c = (W_UK,h^T q_P,h) . c, so each head's
query becomes [W_UK,h^T q_P,h ; RoPE(q_R,h)] (C + R channels) and attends to the shared key
[c ; RoPE(k_R)] with the latent c as value (multi-query attention over the latent); W_UV,h then
W_O map the result out. The cache therefore holds only c and RoPE(k_R): C + R values per position
and layer (``LayerKVCache`` with seq_dim=1: (B, T, C) and (B, T, R)), against 2 * H * Dh for MHA.

Scale: 1/sqrt(P + R). Under YaRN, DeepSeek multiplies the whole score by the YaRN temperature
squared (its ``mscale**2``, with mscale = 0.1 ln s + 1), not only the rotated channels. archlab's
RoPE tables carry the temperature on the rotated channels (t^2 on their product), so the
position-free query channels q_P are multiplied by t^2: the same score as DeepSeek's.

Biases (``attention.bias``) sit where DeepSeek's code has them: on the down-projections W_DQ,
W_DKV and on W_O; a full-rank W_Q and the up-projections have none (which also keeps the
absorption exact).

The input projections live in one submodule named ``wqkv``, as every variant's do, so the
FLOP accounting (``archlab.costs.measure``) finds them under the same name.
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
from archlab.nn.attention.mha import CausalSelfAttention
from archlab.nn.component import STATS_BYTES, ActShape, option_names
from archlab.nn.mup import width_mult
from archlab.nn.norms import build_norm, norm_class, norm_params
from archlab.nn.positions import PosContext, apply_rotary, position_class, rope_inv_freq

if TYPE_CHECKING:
    from archlab.config.schema import ModelConfig


@dataclass
class MLAConfig(AttentionConfig):
    """``attention.type: mla``."""

    type: str = "mla"
    dropout: float = 0.0  # on attention probabilities (training only); no qk_norm: the latents are normalised
    # mla: rank Q of the query compression (DeepSeek-V3: 1536); null = a full-rank query projection (V2-Lite)
    q_lora_rank: Optional[int] = None
    kv_lora_rank: int = 512  # mla: width C of the joint key/value latent, what the KV cache keeps (V3: 512)
    qk_rope_head_dim: int = 64  # mla: RoPE channels R per head; the key's R channels are shared by all heads (V3: 64)
    qk_nope_head_dim: int = 128  # mla: position-free query/key channels P per head, keys from the latent (V3: 128)
    v_head_dim: int = 128  # mla: value channels V per head, from the latent (V3: 128)


def _dims(cfg) -> tuple[int, int, int, int, Optional[int]]:
    """(P, R, V, C, Q) of the recipe."""
    a = cfg.attention
    return a.qk_nope_head_dim, a.qk_rope_head_dim, a.v_head_dim, a.kv_lora_rank, a.q_lora_rank


def yarn_temperature(cfg) -> float:
    """The temperature t RoPE's tables carry (YaRN: 0.1 ln s + 1; every other scaling: 1)."""
    p = cfg.position
    return rope_inv_freq(cfg.rotary_dim, p.rope_base, p.rope_scaling, cfg.max_seq_len)[1]


class LatentProjections(nn.Module):
    """MLA's input projections: the query path (``q``, or ``q_down`` -> ``q_norm`` -> ``q_up``) and
    the key/value path (``kv_down`` -> ``kv_norm`` on the latent; ``kv_up`` expands it)."""

    def __init__(self, cfg: "ModelConfig"):
        super().__init__()
        P, R, V, C, Q = _dims(cfg)
        D, H, bias = cfg.d_model, cfg.n_heads, cfg.attention.bias
        self.n_heads, self.dims = H, (P, R, V, C)
        if Q is None:
            self.q = nn.Linear(D, H * (P + R), bias=False)
        else:
            self.q_down = nn.Linear(D, Q, bias=bias)
            self.q_norm = build_norm(cfg, dim=Q)
            self.q_up = nn.Linear(Q, H * (P + R), bias=False)
        self.kv_down = nn.Linear(D, C + R, bias=bias)  # [c ; k_R] rows
        self.kv_norm = build_norm(cfg, dim=C)
        self.kv_up = nn.Linear(C, H * (P + V), bias=False)  # per head [W_UK,h ; W_UV,h] rows

    def query(self, x_BSD: Tensor) -> Tensor:
        """q (B, H, S, P + R) before RoPE, per head [q_P ; q_R]."""
        B, S, _ = x_BSD.shape
        q = self.q(x_BSD) if hasattr(self, "q") else self.q_up(self.q_norm(self.q_down(x_BSD)))
        return q.view(B, S, self.n_heads, -1).transpose(1, 2)

    def latent(self, x_BSD: Tensor) -> tuple[Tensor, Tensor]:
        """The normed latent c (B, S, C) and the shared key k_R (B, S, R) before RoPE."""
        C = self.dims[3]
        c, k_rope = self.kv_down(x_BSD).split([C, self.dims[1]], dim=-1)
        return self.kv_norm(c), k_rope

    def up_weights(self) -> tuple[Tensor, Tensor]:
        """W_UK (H, P, C) and W_UV (H, V, C), views of ``kv_up``'s weight."""
        P, _, V, C = self.dims
        return self.kv_up.weight.view(self.n_heads, P + V, C).split([P, V], dim=1)

    def forward(self, x_BSD: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Training: q (B, H, S, P + R), k_P (B, H, S, P), v (B, H, S, V), k_R (B, S, R); q_R and
        k_R not yet rotated."""
        B, S, _ = x_BSD.shape
        P, _, V, _ = self.dims
        c, k_rope = self.latent(x_BSD)
        kv = self.kv_up(c).view(B, S, self.n_heads, P + V).transpose(1, 2)  # (B, H, S, P + V)
        k_nope, v = kv.split([P, V], dim=-1)
        return self.query(x_BSD), k_nope, v, k_rope


@ATTENTIONS.register("mla")
class MultiHeadLatentAttention(Attention):
    """Attention whose keys and values come from a compressed latent per token (see the module
    docstring); the KV cache keeps only that latent and the shared RoPE key."""

    Config = MLAConfig
    options = option_names(MLAConfig)

    bidirectional_unsupported = ("its absorbed decoding path and its DeepSeek-V3 export are causal; latent "
                                 "attention without the causal mask is not implemented: use mha")

    def __init__(self, cfg: "ModelConfig", *, layer: int, causal: bool = True):
        super().__init__(cfg, layer=layer, causal=causal)
        P, R, V, C, _ = _dims(cfg)
        self.n_heads, self.dims = cfg.n_heads, (P, R, V, C)
        self.wqkv = LatentProjections(cfg)
        self.wo = nn.Linear(cfg.n_heads * V, cfg.d_model, bias=cfg.attention.bias)
        self.wo.is_residual_proj = True  # GPT-2 scaled init
        self.dropout = cfg.attention.dropout
        self.scale = self.softmax_scale(cfg)
        self.nope_gain = yarn_temperature(cfg) ** 2  # q_P * t^2: DeepSeek's mscale^2 on the whole score

    def new_cache(self) -> LayerKVCache:
        return LayerKVCache(seq_dim=1)  # k: the latent c (B, T, C); v: RoPE(k_R) (B, T, R)

    # ------------------------------------------------------------------ facts

    @staticmethod
    def rotary_dim(cfg) -> int:
        return cfg.attention.qk_rope_head_dim

    @staticmethod
    def softmax_scale(cfg) -> float:
        """``attention.scale``, else 1/sqrt(P + R) (muP: also / sqrt(m), as ``archlab.nn.mup``)."""
        if cfg.attention.scale is not None:
            return cfg.attention.scale
        P, R = cfg.attention.qk_nope_head_dim, cfg.attention.qk_rope_head_dim
        return (P + R) ** -0.5 / width_mult(cfg) ** 0.5

    @classmethod
    def validate(cls, m, prefix: str = "model") -> None:
        super().validate(m, prefix)
        a, key = m.attention, f"{prefix}.attention"
        if a.kv_lora_rank is None or a.kv_lora_rank < 1:
            fail(f"{key}.kv_lora_rank", a.kv_lora_rank,
                 "mla compresses keys and values into a latent of at least 1 channel")
        if a.q_lora_rank is not None and a.q_lora_rank < 1:
            fail(f"{key}.q_lora_rank", a.q_lora_rank, "must be >= 1, or null for a full-rank query projection")
        for name in ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
            v = getattr(a, name)
            if v is None or v < 1:
                fail(f"{key}.{name}", v, "must be a positive number of channels per head")
        if a.qk_rope_head_dim % 2:
            fail(f"{key}.qk_rope_head_dim", a.qk_rope_head_dim, "RoPE rotates pairs of channels: must be even")
        if not position_class(m).rotates_qk:
            fail(f"{prefix}.position.type", m.position.type,
                 "mla carries positions in its decoupled RoPE key (qk_rope_head_dim): use position.type=rope")
        if m.n_kv_heads is not None and m.n_kv_heads != m.n_heads:
            fail(f"{prefix}.n_kv_heads", m.n_kv_heads,
                 "mla has no key/value head groups (every head's keys and values come from the shared "
                 "latent): leave it null")

    @classmethod
    def num_params(cls, cfg: "ModelConfig", *, layer: int) -> int:
        P, R, V, C, Q = _dims(cfg)
        D, H, bias = cfg.d_model, cfg.n_heads, cfg.attention.bias
        if Q is None:
            n = D * H * (P + R)
        else:
            n = D * Q + bias * Q + norm_params(cfg, dim=Q) + Q * H * (P + R)
        n += D * (C + R) + bias * (C + R) + norm_params(cfg, dim=C) + C * H * (P + V)
        return n + H * V * D + bias * D

    @classmethod
    def forward_flops(cls, cfg: "ModelConfig", seq_len: int, *, layer: int) -> dict[str, float]:
        """Training path: the query path, W_DKV and W_UK/W_UV (``qkv_proj``), W_O; Q K^T over
        P + R channels and P V over V channels per head, the full S x S square."""
        P, R, V, C, Q = _dims(cfg)
        D, H, S = cfg.d_model, cfg.n_heads, seq_len
        query = 2.0 * D * H * (P + R) if Q is None else 2.0 * D * Q + 2.0 * Q * H * (P + R)
        kv = 2.0 * D * (C + R) + 2.0 * C * H * (P + V)
        return {"qkv_proj": query + kv, "out_proj": 2.0 * H * V * D,
                "attn_scores": 2.0 * S * H * (P + R), "attn_values": 2.0 * S * H * V}

    @classmethod
    def kv_cache_bytes(cls, cfg: "ModelConfig", context: int, *, layer: int, dtype_bytes: int) -> float:
        """The latent c and the rotated shared key: C + R per position."""
        a = cfg.attention
        return float((a.kv_lora_rank + a.qk_rope_head_dim) * context * dtype_bytes)

    @staticmethod
    def uses_math_sdpa(s: ActShape) -> bool:
        """CPU SDPA runs the math kernel for attention dropout, and when the value head dim
        differs from the query/key one (its flash kernel needs equal head dims)."""
        a = s.cfg.attention
        return s.device == "cpu" and (a.dropout > 0 or a.v_head_dim != a.qk_nope_head_dim + a.qk_rope_head_dim)

    @classmethod
    def saved_bytes(cls, s: ActShape, *, layer: int) -> float:
        """All N tokens of one layer: the layer input (read by the query path and W_DKV), the
        latent norm (its input is a view of W_DKV's (N, C + R) output) and W_UK/W_UV's input, the
        query norm and W_UQ's input (q_lora_rank), what SDPA keeps, W_O's input (a copy of the
        (B, H, S, V)-contiguous attention output, except for one head or one position).

        Fused kernels (CPU flash, CUDA): q and k (new tensors, after the concatenations), v (a
        view of W_UK/W_UV's (N, H * (P + V)) output), the output and the fp32 log-sum-exp. CPU
        math kernel (dropout, or V != P + R), in fp32: copies of q (scaled), k^T and v, the
        (B, H, S, S) probabilities (+ mask and dropped probabilities with dropout).
        The RoPE tables are the model's (``RotaryPositions.saved_bytes``); CUDA is not measured.
        """
        cfg, n, a, f = s.cfg, s.n, s.act, STATS_BYTES
        P, R, V, C, Q = _dims(cfg)
        H, K, norm = cfg.n_heads, P + R, norm_class(cfg)
        total = n * cfg.d_model * a  # the layer input
        keeps_input, extra = norm.saved(s, dim=C)
        total += n * (keeps_input * (C + R) * a + extra) + n * C * a  # kv_norm; kv_up's input
        if Q is not None:
            keeps_input, extra = norm.saved(s, dim=Q)
            total += n * (keeps_input * Q * a + extra) + n * Q * a  # q_norm; q_up's input
        # (B, H, S, .) -> (B*H, S, .) or (B, S, H*.) is a view only for one head or one position
        copies = H > 1 and s.seq_len > 1
        if cls.uses_math_sdpa(s):
            total += n * H * (2 * K) * f + n * H * s.seq_len * f  # q (scaled), k^T; probabilities
            if copies or a != f:
                total += n * H * V * f  # v, copied (or upcast)
            else:
                total += n * H * (P + V) * a  # v: a view of kv_up's output
            if cfg.attention.dropout > 0:
                total += 2 * n * H * s.seq_len * f  # mask and dropped probabilities
            return total + n * H * V * a  # the output, copied to (B, S, H*V) for wo
        total += n * H * (2 * K + (P + V) + V) * a + n * H * f  # q, k, kv_up's output, output; lse
        return total + copies * n * H * V * a  # wo's input: a copy of the output

    @classmethod
    def selective_saved_bytes(cls, s: ActShape, *, layer: int) -> float:
        """The projections' outputs (W_DKV, W_UK/W_UV, the query path, W_O) and SDPA's: the fused
        kernel's output and log-sum-exp, or the CPU math kernel's two bmm outputs (the (B*H, S, S)
        scores and the weighted values, fp32)."""
        cfg, n, a, f = s.cfg, s.n, s.act, STATS_BYTES
        P, R, V, C, Q = _dims(cfg)
        H = cfg.n_heads
        total = n * (C + R) * a + n * H * (P + V) * a + n * H * (P + R) * a + n * cfg.d_model * a
        if Q is not None:
            total += n * Q * a  # q_down's output
        if cls.uses_math_sdpa(s):
            return total + n * H * s.seq_len * f + n * H * V * f
        return total + n * H * V * a + n * H * f

    # ------------------------------------------------------------------ forward

    def _rotate(self, q: Tensor, k_rope: Tensor, ctx: PosContext) -> tuple[Tensor, Tensor]:
        """q (B, H, S, P + R) -> [q_P * t^2 ; RoPE(q_R)], k_R (B, S, R) -> RoPE(k_R)."""
        q_nope, q_rope = q.split([self.dims[0], self.dims[1]], dim=-1)
        if self.nope_gain != 1.0:
            q_nope = q_nope * self.nope_gain
        q = torch.cat([q_nope, apply_rotary(q_rope, ctx.cos, ctx.sin)], dim=-1)
        return q, apply_rotary(k_rope, ctx.cos, ctx.sin)

    def forward(self, x_BSD: Tensor, ctx: PosContext, cache: Optional[LayerKVCache] = None) -> Tensor:
        if cache is not None:
            return self._absorbed(x_BSD, ctx, cache)
        B, S, _ = x_BSD.shape
        H, (_, R, V, _) = self.n_heads, self.dims
        q, k_nope, v, k_rope = self.wqkv(x_BSD)
        q, k_rope = self._rotate(q, k_rope, ctx)  # (B, H, S, P + R), (B, S, R)
        k = torch.cat([k_nope, k_rope[:, None].expand(B, H, S, R)], dim=-1)  # (B, H, S, P + R)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale,
                                           dropout_p=self.dropout if self.training else 0.0)  # (B, H, S, V)
        if self.capture is not None:  # one key per head: the up-projected latent with the shared RoPE key
            self.capture.record(q, k, v, scale=self.scale, allowed=causal_allowed(S, S, x_BSD.device))
        return self.wo(y.transpose(1, 2).reshape(B, S, H * V))

    def _absorbed(self, x_BSD: Tensor, ctx: PosContext, cache: LayerKVCache) -> Tensor:
        """Generation: attention over the cached latent, W_UK absorbed into the query and W_UV
        applied to the attended latent."""
        B, S, _ = x_BSD.shape
        H, P, V = self.n_heads, self.dims[0], self.dims[2]
        c, k_rope = self.wqkv.latent(x_BSD)  # (B, S, C), (B, S, R)
        q, k_rope = self._rotate(self.wqkv.query(x_BSD), k_rope, ctx)
        past = cache.length
        c_all, k_rope_all = cache.update(c, k_rope)  # (B, T, C), (B, T, R)
        w_uk, w_uv = self.wqkv.up_weights()  # (H, P, C), (H, V, C)
        q_latent = torch.einsum("bhsp,hpc->bhsc", q[..., :P], w_uk)  # (B, H, S, C)
        q_abs = torch.cat([q_latent, q[..., P:]], dim=-1)  # (B, H, S, C + R)
        k_abs = torch.cat([c_all, k_rope_all], dim=-1)[:, None]  # (B, 1, T, C + R): one key head
        mask = CausalSelfAttention._mask(S, past, ctx, x_BSD)
        o_latent = F.scaled_dot_product_attention(q_abs, k_abs, c_all[:, None], attn_mask=mask,
                                                  is_causal=mask is None and past == 0, scale=self.scale,
                                                  enable_gqa=True)  # (B, H, S, C)
        o = torch.einsum("bhsc,hvc->bhsv", o_latent, w_uv)  # (B, H, S, V)
        return self.wo(o.transpose(1, 2).reshape(B, S, H * V))
