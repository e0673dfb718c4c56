"""``attention.type: sliding_window``: each query sees only the last ``window`` positions, itself
included (Mistral 7B; Gemma 2/3 interleave such local layers with global ones).

Shape legend: B batch, S query length, T key length, D model dim, H query heads, G key/value
heads, Dh head dim, W window, C = W query-block length, nb = ceil(S / C) blocks, N = B*S tokens.

Query i attends to keys j with 0 <= i - j < W (HF Mistral's ``sliding_window``). Layer pattern:
``global_every: 0`` makes every layer local; ``global_every: n`` makes every n-th layer (layers
n-1, 2n-1, ...) a full causal layer, as Gemma 2 (n = 2) and Gemma 3 (n = 6) do.

Banded training path: for S > W the queries are cut into blocks of C = W and block b attends to
the keys of blocks b-1 and b (2W keys, the band masked inside), so the work per token is bounded
by the window instead of growing with S: Q K^T and P V each cost 2 * keys * H * Dh FLOPs per token
with keys = nb * 2W * W / S (the padded last block included), against S for full attention.
For S <= W it is ordinary causal attention.

Activation memory (``saved_bytes``): what the SDPA kernel that runs the blocks keeps, measured on
the CPU (flash; math with attention dropout); on CUDA derived from torch 2.13's dispatch and the
kernels' saved tensors, not measured on a GPU: memory-efficient attention for H == G, the math
kernel (fp32 scores) for GQA/MQA, whose mask the memory-efficient kernel does not take.

KV cache: a rolling buffer of the last W - 1 positions per local layer
(``LayerKVCache(window=W)``), so a local layer's cache stops growing at the window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from archlab.errors import fail
from archlab.nn.attention.base import ATTENTIONS, LayerKVCache
from archlab.nn.attention.capture import causal_allowed
from archlab.nn.attention.mha import CausalSelfAttention, MHAConfig, qk_norm_saved
from archlab.nn.component import STATS_BYTES, ActShape, option_names
from archlab.nn.positions import PosContext, position_class

if TYPE_CHECKING:
    from archlab.config.schema import ModelConfig


@dataclass
class SlidingWindowConfig(MHAConfig):
    """``attention.type: sliding_window``: MHA's keys and the window's."""

    type: str = "sliding_window"
    window: Optional[int] = None  # sliding_window: positions a query sees, itself included (Mistral: 4096)
    global_every: int = 0  # sliding_window: 0 = every layer local; n = every n-th layer full (Gemma 2: 2, Gemma 3: 6)


def layer_window(cfg, layer: int) -> Optional[int]:
    """The window of ``layer``, or None for a full (global) layer."""
    n = cfg.attention.global_every
    return None if n and (layer + 1) % n == 0 else cfg.attention.window


@ATTENTIONS.register("sliding_window")
class SlidingWindowAttention(CausalSelfAttention):
    """Grouped-query attention (same projections as ``mha``) restricted to a window."""

    Config = SlidingWindowConfig
    options = option_names(SlidingWindowConfig)
    supports_bidirectional = False
    bidirectional_unsupported = ("the window looks back only (0 <= i - j < W); a two-sided window is not "
                                 "implemented: use mha")

    def __init__(self, cfg: "ModelConfig", *, layer: int, causal: bool = True):
        super().__init__(cfg, layer=layer, causal=causal)
        self.window = layer_window(cfg, layer)

    def new_cache(self) -> LayerKVCache:
        return LayerKVCache(window=self.window)

    # ------------------------------------------------------------------ facts

    @classmethod
    def validate(cls, m, prefix: str = "model") -> None:
        super().validate(m, prefix)
        a = m.attention
        if a.window is None or a.window < 1:
            fail(f"{prefix}.attention.window", a.window,
                 "sliding_window needs a window of at least 1 position (it may exceed max_seq_len)")
        if a.global_every < 0:
            fail(f"{prefix}.attention.global_every", a.global_every, "must be >= 0 (0 = every layer local)")
        if position_class(m).score_bias:
            fail(f"{prefix}.position.type", m.position.type,
                 "sliding_window attention takes no additive score bias (ALiBi, relative); use rope or none")
        if a.output_gate:  # mha's option: the banded path's memory model has no gate
            fail(f"{prefix}.attention.output_gate", a.output_gate, "the output gate is mha's only: use attention.type "
                 "mha (with or without the gate) or output_gate: false")
        if a.rotary_fraction != 1.0:
            fail(f"{prefix}.attention.rotary_fraction", a.rotary_fraction, "partial RoPE is mha's only: use "
                 "attention.type mha or rotary_fraction: 1.0")

    @classmethod
    def core_keys(cls, cfg: "ModelConfig", seq_len: int, *, layer: int) -> float:
        W = layer_window(cfg, layer)
        if W is None or seq_len <= W:
            return float(seq_len)
        return math.ceil(seq_len / W) * 2 * W * W / seq_len

    @classmethod
    def kv_cache_bytes(cls, cfg: "ModelConfig", context: int, *, layer: int, dtype_bytes: int) -> float:
        """The rolling buffer: at most W - 1 positions kept between steps (none past the window)."""
        W = layer_window(cfg, layer)
        kept = context if W is None else min(context, W - 1)
        return 2.0 * cfg.kv_heads * cfg.d_head * kept * dtype_bytes

    @classmethod
    def _band_shape(cls, s: ActShape, layer: int) -> Optional[tuple[int, int]]:
        """(W, nb) when ``layer`` runs the banded path at this shape, else None (as ``mha``)."""
        W = layer_window(s.cfg, layer)
        if W is None or s.seq_len <= W:
            return None
        return W, math.ceil(s.seq_len / W)

    @staticmethod
    def banded_kernel(s: ActShape) -> str:
        """The SDPA kernel that runs the banded blocks (an explicit mask): ``flash`` (CPU, no
        dropout), ``efficient`` (CUDA memory-efficient attention: H == G and a head dim that its
        GEMMs take, a multiple of 8 in bf16 and of 4 in fp32 on sm80 or newer) or ``math``
        (CPU with attention dropout; CUDA otherwise). CUDA's flash kernel takes no mask, and
        torch 2.13's memory-efficient kernel no grouped K/V heads (its backward's meta function
        gives dK the query's head count; the SDPA docstring: GQA "works only for Flash_attention
        and math kernel on CUDA"): GQA/MQA with a mask falls to the math kernel, which comes
        before cuDNN attention in torch's default backend order."""
        cfg = s.cfg
        if s.device == "cpu":
            return "math" if cfg.attention.dropout > 0 else "flash"
        aligned = cfg.d_head % (8 if s.act == 2 else 4) == 0
        return "efficient" if cfg.kv_heads == cfg.n_heads and aligned else "math"

    @classmethod
    def saved_bytes(cls, s: ActShape, *, layer: int, kernel: Optional[str] = None) -> float:
        """Banded (S > W): the QKV input; then what the kernel that runs the padded query blocks
        against their key and value blocks (2W rows per block) keeps (``kernel``: default
        :meth:`banded_kernel`). q/k norms keep what they keep in ``mha``. Full layers and S <= W:
        as ``mha``.

        - CPU flash (measured, exact): the blocks, the band mask (converted to the activation
          dtype), the output and the log-sum-exp (fp32 per head and query row);
        - math (CPU: measured with attention dropout; CUDA: the same composite kernel): fp32
          (bf16 is upcast) copies of q (scaled) and of k^T (scaled) and v repeated to H heads,
          the probabilities, with dropout the mask (fp32 on CPU, bool on CUDA) and the dropped
          probabilities, and a copy of the output for the projection;
        - CUDA memory-efficient attention, derived, not measured on a GPU, from torch 2.13's
          dispatch (``scaled_dot_product_attention``: the boolean band converted to an additive
          mask of the activation dtype, ``preprocess_mask`` expanding it over the H heads) and
          what ``_scaled_dot_product_efficient_attention`` saves for backward (its meta
          functions give the shapes): the q, k and v blocks; the mask, one (C, 2W) tile per
          block while 2W is a multiple of 16, else padded to 16 columns, which materialises it
          over the H heads; the output, allocated (B*nb, C, H, Dh) so that wo reads it through
          views; the log-sum-exp, fp32, its rows padded to a multiple of 32 per block; and two
          8-byte RNG scalars, not counted (as for ``mha``'s fused kernels).

        Where torch puts cuDNN attention first (sm90/sm100 with cuDNN newer than 9.15) cuDNN runs
        the banded blocks instead, GQA included, and keeps q, k, v (G heads), the mask, the output
        and the log-sum-exp without the paddings: the CUDA estimate is then an upper bound (for
        GQA by the math kernel's fp32 copies and scores).

        wo reads the kernel's output through views unless the padded rows are cut off (a copy
        then; on CPU also when normed q changed its layout)."""
        banded = cls._band_shape(s, layer)
        if banded is None:
            return super().saved_bytes(s, layer=layer)
        W, nb = banded
        kernel = kernel or cls.banded_kernel(s)
        cfg, n, a, f = s.cfg, s.n, s.act, STATS_BYTES
        H, G, Dh, D = cfg.n_heads, cfg.kv_heads, cfg.d_head, cfg.d_model
        blocks = s.batch * nb
        rows_q, rows_k = blocks * W, blocks * 2 * W  # padded query rows, blocked key rows
        total = n * D * a  # input of wqkv
        if cfg.attention.qk_norm:  # per head (or projection) and token, on views of the qkv output
            keeps_input, extra = qk_norm_saved(s)
            total += n * extra + (n * (H + 2 * G) * Dh * a if keeps_input else 0)
        if kernel == "math":  # fp32 whatever the input dtype
            total += rows_q * H * Dh * f + 2 * rows_k * H * Dh * f  # q (scaled), k^T (scaled) and v over H heads
            total += rows_q * H * 2 * W * f  # probabilities
            if cfg.attention.dropout > 0:  # the mask, dropped probabilities
                total += rows_q * H * 2 * W * ((f if s.device == "cpu" else s.mask) + f)
            return total + n * H * Dh * a  # output, copied to (B, S, H*Dh) for wo
        total += rows_q * H * Dh * a + 2 * rows_k * G * Dh * a  # query, key and value blocks
        total += rows_q * H * Dh * a  # output
        if kernel == "flash":
            total += rows_q * 2 * W * a + rows_q * H * f  # the band mask, one per block; log-sum-exp
            copied = cfg.attention.qk_norm or nb * W != s.seq_len
        elif kernel == "efficient":
            cols = 2 * W
            total += (rows_q * cols if cols % 16 == 0 else rows_q * H * (-(-cols // 16) * 16)) * a  # additive mask
            total += blocks * H * (-(-W // 32) * 32) * f  # log-sum-exp
            copied = nb * W != s.seq_len
        else:
            raise ValueError(f"kernel={kernel!r}: must be one of flash, efficient, math")
        return total + (n * H * Dh * a if copied else 0)

    @classmethod
    def selective_saved_bytes(cls, s: ActShape, *, layer: int, kernel: Optional[str] = None) -> float:
        """Banded: the QKV and output projections' outputs and the attention kernel's (flash and
        memory-efficient: output and log-sum-exp of the padded blocks, the latter's rows padded
        to 32 per block; math: its fp32 scores and weighted values)."""
        banded = cls._band_shape(s, layer)
        if banded is None:
            return super().selective_saved_bytes(s, layer=layer)
        W, nb = banded
        kernel = kernel or cls.banded_kernel(s)
        cfg, n, a, f = s.cfg, s.n, s.act, STATS_BYTES
        H, G, Dh, D = cfg.n_heads, cfg.kv_heads, cfg.d_head, cfg.d_model
        rows_q = s.batch * nb * W
        total = n * (H + 2 * G) * Dh * a + n * D * a
        if kernel == "math":
            return total + rows_q * H * 2 * W * f + rows_q * H * Dh * f
        if kernel == "efficient":
            return total + rows_q * H * Dh * a + s.batch * nb * H * (-(-W // 32) * 32) * f
        return total + rows_q * H * Dh * a + rows_q * H * f

    # ------------------------------------------------------------------ forward

    def forward(self, x_BSD: Tensor, ctx: PosContext, cache: Optional[LayerKVCache] = None) -> Tensor:
        W, S = self.window, x_BSD.shape[1]
        if W is None:
            return super().forward(x_BSD, ctx, cache)
        q, k, v = self.qkv(x_BSD, ctx)
        drop = self.dropout if self.training else 0.0
        gqa = self.n_kv_heads != self.n_heads
        if cache is None or cache.length == 0:
            if cache is not None:
                cache.update(k, v)  # keeps the last W - 1 positions
            if S <= W:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=drop, scale=self.scale,
                                                   enable_gqa=gqa)
            else:
                y = self._banded(q, k, v, drop)
            if self.capture is not None and cache is None:
                self.capture.record(q, k, v, scale=self.scale, allowed=causal_allowed(S, S, q.device, W))
            return self.out(y, x_BSD)
        past = cache.length
        k, v = cache.update(k, v)  # (B, G, T, Dh): the kept past, then the new positions
        T = k.shape[2]
        q_pos = torch.arange(past, past + S, device=x_BSD.device)
        k_pos = torch.arange(past + S - T, past + S, device=x_BSD.device)
        offset = q_pos[:, None] - k_pos[None, :]  # (S, T)
        mask = (offset >= 0) & (offset < W)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=drop, scale=self.scale,
                                           enable_gqa=gqa)
        return self.out(y, x_BSD)

    def _banded(self, q: Tensor, k: Tensor, v: Tensor, drop: float) -> Tensor:
        """Block b of C = W queries against the 2W keys of blocks b-1 and b."""
        B, H, S, Dh = q.shape
        G, C = k.shape[1], self.window
        nb = -(-S // C)
        pad = nb * C - S
        q = F.pad(q, (0, 0, 0, pad)).view(B, H, nb, C, Dh).transpose(1, 2).reshape(B * nb, H, C, Dh)

        def blocks(t: Tensor) -> Tensor:  # (B, G, S, Dh) -> (B*nb, G, 2C, Dh): [block b-1; block b]
            t = F.pad(t, (0, 0, C, pad)).view(B, G, nb + 1, C, Dh)
            return torch.cat([t[:, :, :-1], t[:, :, 1:]], dim=3).transpose(1, 2).reshape(B * nb, G, 2 * C, Dh)

        k, v = blocks(k), blocks(v)
        r = torch.arange(C, device=q.device)[:, None]  # query row in its block
        j = torch.arange(2 * C, device=q.device)[None, :]  # key column: block b-1 then block b
        band = (j > r) & (j <= r + C)  # 0 <= (C + r) - j < W with W = C
        first = band & (j >= C)  # block 0 has no block before it
        mask = torch.stack([first] + [band] * (nb - 1)).unsqueeze(1)  # (nb, 1, C, 2C)
        mask = mask.unsqueeze(0).expand(B, nb, 1, C, 2 * C).reshape(B * nb, 1, C, 2 * C)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=drop, scale=self.scale,
                                           enable_gqa=G != H)  # (B*nb, H, C, Dh)
        return y.view(B, nb, H, C, Dh).transpose(1, 2).reshape(B, H, nb * C, Dh)[:, :, :S]
