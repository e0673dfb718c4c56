"""``attention.type: gated_deltanet``: Gated DeltaNet (Yang, Kautz, Hatamizadeh, ICLR 2025), a linear-attention
token mixer with a fixed-size state instead of a growing KV cache (Qwen3-Next's linear-attention layers).

Shape legend: B batch, S sequence, D model dim, Hk query/key heads, Hv value heads (Hv % Hk == 0: each
query/key head serves Hv / Hk value heads), Dk key head dim, Dv value head dim, C conv channels
(2 Hk Dk + Hv Dv), K conv kernel, L chunk length, nc = ceil(S / L) chunks.

Per value head, with the state M (Dk, Dv) and the token's q, k (L2-normalised), v, gate a_t and rate b_t:

    M_t = a_t M_{t-1} (I - b_t k_t k_t^T) + b_t k_t v_t^T          o_t = M_t^T q_t / sqrt(Dk)

a_t = exp(-exp(A_log) * softplus(alpha_t + dt_bias)) in (0, 1) (Mamba-2's decay), b_t = sigmoid(beta_t).
Before the rule q, k, v pass a causal depthwise convolution (kernel K) and SiLU; after it, o is
RMS-normalised per head and gated by SiLU(z) (``GatedRMSNorm``), then projected back to D.

Two forms of the same rule: the chunked one for training and prompts (per chunk of L tokens: the
WY/UT transform turns L delta updates into triangular solves and matmuls, then one state update per
chunk), and the recurrent one for generation (one token at a time). The generation cache
(:class:`LayerStateCache`) is the state (B, Hv, Dk, Dv) in fp32 and the last K - 1 conv inputs: its size
does not depend on the context. On CUDA with ``flash-linear-attention`` installed (``pip install
flash-linear-attention``), ``gdn_kernels: auto`` runs its Triton kernels instead of the torch loops.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from archlab.errors import fail
from archlab.nn.attention.base import ATTENTIONS, Attention, AttentionConfig, attention_classes
from archlab.nn.component import STATS_BYTES, ActShape, option_names
from archlab.nn.positions import PosContext, position_class

if TYPE_CHECKING:
    from archlab.config.schema import ModelConfig

L2_EPS = 1e-6  # q/k L2 norm: sqrt(sum x^2 + eps), as the fla kernels
KERNELS = ("auto", "torch", "fla")


@dataclass
class GatedDeltaNetConfig(AttentionConfig):
    """``attention.type: gated_deltanet`` (no dropout: no attention probabilities)."""

    type: str = "gated_deltanet"
    gdn_k_heads: Optional[int] = None  # gated_deltanet: query/key heads; null = n_heads (Qwen3-Next-80B: 16)
    gdn_v_heads: Optional[int] = None  # gated_deltanet: value heads, a multiple of gdn_k_heads; null = gdn_k_heads
    gdn_k_head_dim: Optional[int] = None  # gated_deltanet: query/key head dim; null = d_model // n_heads (80B: 128)
    gdn_v_head_dim: Optional[int] = None  # gated_deltanet: value head dim; null = gdn_k_head_dim (80B: 128)
    gdn_conv_kernel: int = 4  # gated_deltanet: causal depthwise conv over q, k, v (Qwen3-Next: 4)
    gdn_chunk_size: int = 64  # gated_deltanet: tokens per chunk of the chunked (training) form
    # gated_deltanet: auto (the flash-linear-attention kernels on CUDA when installed, else torch) | torch | fla
    gdn_kernels: str = "auto"


def gdn_dims(cfg) -> tuple[int, int, int, int]:
    """(Hk, Hv, Dk, Dv) with the defaults filled in."""
    a = cfg.attention
    hk = a.gdn_k_heads or cfg.n_heads
    hv = a.gdn_v_heads or hk
    dk = a.gdn_k_head_dim or cfg.d_model // cfg.n_heads
    return hk, hv, dk, a.gdn_v_head_dim or dk


def fla_ops():
    """(chunk, fused_recurrent) gated delta rule kernels of flash-linear-attention, or None if absent."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    except ImportError:
        return None
    return chunk_gated_delta_rule, fused_recurrent_gated_delta_rule


class LayerStateCache:
    """A linear-attention layer's generation cache: the recurrent state and the conv buffer, both fixed-size.

    ``state`` (B, Hv, Dk, Dv) fp32; ``conv`` (B, C, K - 1): the conv's inputs at the last K - 1 positions;
    ``length`` counts every position seen (as :class:`archlab.nn.attention.base.LayerKVCache`).
    """

    def __init__(self):
        self.state: Optional[Tensor] = None
        self.conv: Optional[Tensor] = None
        self.length = 0


def l2norm(x: Tensor) -> Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + L2_EPS)


def chunk_gated_delta_rule(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, chunk: int,
                           state: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """The chunked form. q, k (B, H, S, Dk) normalised and scaled, v (B, H, S, Dv), g (log decay) and beta (B, H, S),
    all fp32; state (B, H, Dk, Dv) or None (zeros). Returns o (B, H, S, Dv) and the final state.

    Within a chunk, with the cumulative log decay c and W = tril(diag(beta) (K K^T) * exp(c_i - c_j), -1):
    U = (I + W)^-1 diag(beta) V are the delta-corrected values and (I + W)^-1 diag(beta) exp(c) K the keys
    that read the chunk's starting state; the chunks are then scanned once each.
    """
    B, H, S, Dk = k.shape
    Dv = v.shape[-1]
    L = chunk
    pad = (L - S % L) % L
    q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
    g, beta = (F.pad(t, (0, pad)) for t in (g, beta))
    nc = (S + pad) // L
    q, k, v = (t.reshape(B, H, nc, L, t.shape[-1]) for t in (q, k, v))  # (B, H, nc, L, D*)
    g, beta = g.reshape(B, H, nc, L), beta.reshape(B, H, nc, L)
    k_beta, v_beta = k * beta[..., None], v * beta[..., None]
    c = g.cumsum(dim=-1)  # (B, H, nc, L): log decay from the chunk's start
    upper = torch.ones(L, L, dtype=torch.bool, device=q.device).triu(1)
    decay_LL = (c[..., :, None] - c[..., None, :]).masked_fill(upper, float("-inf")).exp()  # exp(c_i - c_j), i >= j
    system = (k_beta @ k.transpose(-1, -2)) * decay_LL  # W below the diagonal; the solves take the diagonal as 1
    u = torch.linalg.solve_triangular(system, v_beta, upper=False, unitriangular=True)  # (B, H, nc, L, Dv)
    w = torch.linalg.solve_triangular(system, k_beta * c.exp()[..., None], upper=False, unitriangular=True)
    scores = (q @ k.transpose(-1, -2)) * decay_LL  # (B, H, nc, L, L): intra-chunk, causal by the mask
    q = q * c.exp()[..., None]
    k = k * (c[..., -1:] - c).exp()[..., None]
    chunk_decay = c[..., -1].exp()[..., None, None]  # (B, H, nc, 1, 1)
    M = q.new_zeros(B, H, Dk, Dv) if state is None else state.to(q)
    o = torch.empty_like(u)
    for i in range(nc):
        u_i = u[:, :, i] - w[:, :, i] @ M  # values less what the starting state already predicts
        o[:, :, i] = q[:, :, i] @ M + scores[:, :, i] @ u_i
        M = M * chunk_decay[:, :, i] + k[:, :, i].transpose(-1, -2) @ u_i
    return o.reshape(B, H, nc * L, Dv)[:, :, :S], M


def recurrent_gated_delta_rule(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
                               state: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """The recurrent form, one token at a time (same arguments and result as :func:`chunk_gated_delta_rule`)."""
    B, H, S, Dk = k.shape
    M = q.new_zeros(B, H, Dk, v.shape[-1]) if state is None else state.to(q)
    o = torch.empty_like(v)
    for t in range(S):
        M = M * g[:, :, t].exp()[..., None, None]
        predicted = (M * k[:, :, t, :, None]).sum(dim=-2)  # (B, H, Dv): M^T k
        delta = (v[:, :, t] - predicted) * beta[:, :, t, None]
        M = M + k[:, :, t, :, None] * delta[:, :, None, :]
        o[:, :, t] = (M * q[:, :, t, :, None]).sum(dim=-2)
    return o, M


class GatedRMSNorm(nn.Module):
    """RMSNorm over the value head dim, then times SiLU(z): the output gate of Gated DeltaNet."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, o: Tensor, z: Tensor) -> Tensor:
        dtype = o.dtype
        o32 = o.float()
        o = (o32 * torch.rsqrt(o32.pow(2).mean(-1, keepdim=True) + self.eps)).to(dtype)
        return (self.weight * o * F.silu(z.float())).to(dtype)


@ATTENTIONS.register("gated_deltanet")
class GatedDeltaNet(Attention):
    """Gated DeltaNet: in projection (q, k, v, z, beta, alpha) -> causal conv + SiLU on q, k, v -> gated delta
    rule -> gated RMSNorm -> out projection. No positional encoding: order comes from the conv and the decay."""

    Config = GatedDeltaNetConfig
    options = option_names(GatedDeltaNetConfig)

    def __init__(self, cfg: "ModelConfig", *, layer: int, causal: bool = True):
        super().__init__(cfg, layer=layer, causal=causal)
        a = cfg.attention
        self.hk, self.hv, self.dk, self.dv = gdn_dims(cfg)
        self.conv_dim = 2 * self.hk * self.dk + self.hv * self.dv
        self.kernel, self.chunk, self.kernels = a.gdn_conv_kernel, a.gdn_chunk_size, a.gdn_kernels
        self.scale = a.scale if a.scale is not None else self.dk ** -0.5
        # one GEMM for q, k, v (the conv's channels) and z (the output gate), beta (write rate), alpha (decay)
        self.wqkv = nn.Linear(cfg.d_model, self.conv_dim + self.hv * self.dv + 2 * self.hv, bias=a.bias)
        self.conv_weight = nn.Parameter(torch.empty(self.conv_dim, 1, self.kernel))  # depthwise, no bias
        self.A_log = nn.Parameter(torch.empty(self.hv))  # decay rate per value head: exp(A_log) > 0
        self.dt_bias = nn.Parameter(torch.ones(self.hv))
        self.norm = GatedRMSNorm(self.dv, cfg.norm.eps)
        self.wo = nn.Linear(self.hv * self.dv, cfg.d_model, bias=a.bias)
        self.wo.is_residual_proj = True  # GPT-2 scaled init
        self.init_weights()

    def init_weights(self, std: float = 0.02, res_std: float = 0.02) -> None:
        """The gates' parameters (Mamba-2's: A uniform in [1, 16], dt_bias 1) and the conv (PyTorch's default);
        the projections are initialised by the model with the rest of its matrices."""
        with torch.no_grad():
            nn.init.kaiming_uniform_(self.conv_weight, a=math.sqrt(5))
            self.A_log.copy_(torch.empty(self.hv).uniform_(1, 16).log())
            self.dt_bias.fill_(1.0)

    def new_cache(self) -> LayerStateCache:
        return LayerStateCache()

    # ------------------------------------------------------------------ facts

    @staticmethod
    def rotary_dim(cfg) -> int:
        return 0  # no positional encoding: the conv and the decay see order

    @classmethod
    def validate(cls, m, prefix: str = "model") -> None:
        super().validate(m, prefix)
        a, p = m.attention, f"{prefix}.attention"
        for key in ("gdn_k_heads", "gdn_v_heads", "gdn_k_head_dim", "gdn_v_head_dim"):
            if getattr(a, key) is not None and getattr(a, key) <= 0:
                fail(f"{p}.{key}", getattr(a, key), "must be a positive number (or null for the default)")
        hk, hv, dk, _ = gdn_dims(m)
        if hv % hk:
            fail(f"{p}.gdn_v_heads", hv, f"must be a multiple of gdn_k_heads ({hk}): each key head serves "
                                          "gdn_v_heads / gdn_k_heads value heads")
        if a.gdn_k_head_dim is None and m.d_model % m.n_heads:
            fail(f"{p}.gdn_k_head_dim", None, f"d_model ({m.d_model}) is not divisible by n_heads: set it")
        if a.gdn_conv_kernel < 1:
            fail(f"{p}.gdn_conv_kernel", a.gdn_conv_kernel, "must be >= 1 (1 = no mixing across positions)")
        if a.gdn_chunk_size < 1:
            fail(f"{p}.gdn_chunk_size", a.gdn_chunk_size, "must be >= 1")
        if a.gdn_kernels not in KERNELS:
            fail(f"{p}.gdn_kernels", a.gdn_kernels, f"must be one of {', '.join(KERNELS)}")
        position = position_class(m)
        if (position.rotates_qk or position.score_bias) and attention_classes(m) == [cls]:
            fail(f"{prefix}.position.type", m.position.type, "gated_deltanet reads no rotary angles or score bias "
                 "and no other layer attends: use none (the conv and the decay see order), learned or sinusoidal")

    @classmethod
    def num_params(cls, cfg: "ModelConfig", *, layer: int) -> int:
        hk, hv, dk, dv = gdn_dims(cfg)
        d, conv = cfg.d_model, 2 * hk * dk + hv * dv
        n_in = conv + hv * dv + 2 * hv
        n = d * n_in + hv * dv * d + conv * cfg.attention.gdn_conv_kernel + 2 * hv + dv
        return n + (n_in + d if cfg.attention.bias else 0)

    @classmethod
    def forward_flops(cls, cfg: "ModelConfig", seq_len: int, *, layer: int) -> dict[str, float]:
        """Per token, in FlopCounterMode's conventions (matmuls; the triangular solves, the conv's shifted
        products and the gates are elementwise or uncounted). ``qkv_proj``: the in projection; ``attn_scores``:
        per chunk and value head K K^T and Q K^T (2 L^2 Dk each); ``attn_values``: per chunk the state reads
        W M and Q M (2 L Dk Dv each), the intra-chunk P U (2 L^2 Dv) and the state update K^T U (2 L Dk Dv).
        The padded last chunk counts whole."""
        hk, hv, dk, dv = gdn_dims(cfg)
        d, L = cfg.d_model, cfg.attention.gdn_chunk_size
        conv = 2 * hk * dk + hv * dv
        padded = math.ceil(seq_len / L) * L / seq_len  # padded tokens per real token
        return {"qkv_proj": 2.0 * d * (conv + hv * dv + 2 * hv),
                "out_proj": 2.0 * hv * dv * d,
                "attn_scores": padded * hv * 4.0 * L * dk,
                "attn_values": padded * hv * (2.0 * L * dv + 6.0 * dk * dv)}

    @classmethod
    def training_flops(cls, cfg: "ModelConfig", seq_len: int, *, layer: int) -> dict[str, float]:
        """Forward + backward per token: three forwards, plus what the chunked form's backward adds or skips
        (measured op by op with FlopCounterMode): each chunk's two triangular solves get a matmul in backward
        (grad of the system: 2 L^2 Dk and 2 L^2 Dv), while the first chunk's zero starting state needs no
        gradient (W M and Q M: one backward matmul each instead of two) and the last state update feeds
        nothing (K^T U: none instead of two): 8 L Dk Dv fewer per sequence and value head."""
        hk, hv, dk, dv = gdn_dims(cfg)
        L = cfg.attention.gdn_chunk_size
        nc = math.ceil(seq_len / L)
        out = {k: 3.0 * v for k, v in cls.forward_flops(cfg, seq_len, layer=layer).items()}
        out["attn_scores"] += hv * 2.0 * L * L * dk * nc / seq_len
        out["attn_values"] += hv * (2.0 * L * L * dv * nc - 8.0 * L * dk * dv) / seq_len
        return out

    @classmethod
    def kv_cache_bytes(cls, cfg: "ModelConfig", context: int, *, layer: int, dtype_bytes: int) -> float:
        """The fixed-size cache, whatever ``context``: the fp32 state Hv Dk Dv and K - 1 conv inputs per channel."""
        hk, hv, dk, dv = gdn_dims(cfg)
        conv = 2 * hk * dk + hv * dv
        return float(hv * dk * dv * STATS_BYTES + conv * (cfg.attention.gdn_conv_kernel - 1) * dtype_bytes)

    @classmethod
    def saved_bytes(cls, s: ActShape, *, layer: int) -> float:
        """What the torch path keeps for backward (measured tensor by tensor on the CPU in fp32 and bf16): the in
        projection's input (and in fp32 its output, read through z), the conv's padded input and sum, then
        the SiLU output (fp32) or the fp32 copies of q and k (bf16), the gates' inputs and outputs, the q/k L2
        norms' rsqrt; in the chunked form, fp32 whatever the model's dtype (R = B Hv nc L padded rows), the padded
        k, v, q and beta, the decay matrix, K K^T, Q K^T, the system and the intra-chunk scores (each R x L),
        the solves' outputs, beta K, the decayed q and k, the exp(cumulative decay) vectors, each chunk's
        starting state and corrected values, and the output (bf16: an fp32 copy of it instead); the gated
        norm's rsqrt, normalised output, SiLU(z) (bf16: and the fp32 copy of z) and product; the out
        projection's input. On CUDA the flash-linear-attention kernels, when they run, keep less."""
        cfg, n, a, f = s.cfg, s.n, s.act, STATS_BYTES
        fp32 = a == f
        hk, hv, dk, dv = gdn_dims(cfg)
        D, K, L = cfg.d_model, cfg.attention.gdn_conv_kernel, cfg.attention.gdn_chunk_size
        C = 2 * hk * dk + hv * dv
        nc = math.ceil(s.seq_len / L)
        R = s.batch * hv * nc * L
        one = nc == 1  # the state update after the only chunk feeds nothing: what only it reads is freed
        total = n * D * a + (n * (C + hv * dv + 2 * hv) * a if fp32 else 0)  # in projection
        total += s.batch * C * (s.seq_len + K - 1) * a + n * C * a  # conv: padded input, sum of the taps
        total += n * C * a if fp32 else 2 * n * hk * dk * f  # SiLU output, or the fp32 q and k
        total += n * hv * a + 2 * n * hv * f + 2 * hv * f + 2 * n * hk * f  # sigmoid(beta), decay gate, A; rsqrt
        total += R * f * (4 - one) + R * dk * f * (4 if one else 6) + 5 * R * L * f + L * L  # chunked form
        total += R * dv * f * (4 if fp32 else 3)  # v, the solve's U, the corrected values; the output (fp32)
        total += (not one) * s.batch * hv * nc * f + nc * s.batch * hv * dk * dv * f  # chunk decays, states
        total += n * hv * f + n * hv * dv * ((2 * f + a) if fp32 else (3 * f + 2 * a))  # gated norm
        return total + n * hv * dv * a  # out projection's input

    @classmethod
    def selective_saved_bytes(cls, s: ActShape, *, layer: int) -> float:
        """The matmul outputs: the in and out projections, K K^T and Q K^T, and per chunk W M, Q M, P U, K^T U."""
        cfg, n, a, f = s.cfg, s.n, s.act, STATS_BYTES
        hk, hv, dk, dv = gdn_dims(cfg)
        D, L = cfg.d_model, cfg.attention.gdn_chunk_size
        C = 2 * hk * dk + hv * dv
        nc = math.ceil(s.seq_len / L)
        R = s.batch * hv * nc * L
        total = n * (C + hv * dv + 2 * hv) * a + n * D * a
        return total + 2 * R * L * f + R * 3 * dv * f + nc * s.batch * hv * dk * dv * f

    # ------------------------------------------------------------------ forward

    def use_fla(self, x: Tensor):
        """The fla kernels when asked for (refused if absent) or, under ``auto``, on CUDA when installed."""
        if self.kernels == "torch" or (self.kernels == "auto" and not x.is_cuda):
            return None
        ops = fla_ops()
        if ops is None and self.kernels == "fla":
            raise RuntimeError("model.attention.gdn_kernels=fla: flash-linear-attention is not installed "
                               "(pip install flash-linear-attention), or use gdn_kernels: torch")
        return ops

    def conv(self, x_BCS: Tensor, cache: Optional[LayerStateCache]) -> Tensor:
        """Causal depthwise conv + SiLU; the K - 1 inputs before the first are the cache's (zeros without).

        Written as K shifted products (elementwise work, 2 K FLOPs per channel and token, as cheap as a norm)
        rather than ``F.conv1d``, whose backward FlopCounterMode counts as a dense C x C convolution."""
        B, C, S = x_BCS.shape
        K = self.kernel
        past = cache.conv if cache is not None and cache.conv is not None else x_BCS.new_zeros(B, C, K - 1)
        full = torch.cat([past, x_BCS], dim=-1)  # (B, C, K - 1 + S)
        if cache is not None:
            cache.conv = full[:, :, full.shape[-1] - (K - 1):]
        w_CK = self.conv_weight[:, 0]
        y = sum(w_CK[:, j, None] * full[:, :, j:j + S] for j in range(K))  # (B, C, S): tap j sees position t-K+1+j
        return F.silu(y)

    def forward(self, x_BSD: Tensor, ctx: PosContext, cache: Optional[LayerStateCache] = None) -> Tensor:
        B, S, _ = x_BSD.shape
        Hk, Hv, Dk, Dv = self.hk, self.hv, self.dk, self.dv
        qkv, z, b, a = self.wqkv(x_BSD).split([self.conv_dim, Hv * Dv, Hv, Hv], dim=-1)
        qkv = self.conv(qkv.transpose(1, 2), cache).transpose(1, 2)  # (B, S, C)
        q, k, v = qkv.split([Hk * Dk, Hk * Dk, Hv * Dv], dim=-1)
        q, k, v = q.view(B, S, Hk, Dk), k.view(B, S, Hk, Dk), v.view(B, S, Hv, Dv)
        beta = b.sigmoid()  # (B, S, Hv)
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)  # (B, S, Hv): log of the decay
        state = cache.state if cache is not None else None
        recurrent = cache is not None and cache.length > 0 and S == 1
        ops = self.use_fla(x_BSD)
        if ops is not None:  # fla takes (B, S, H, D), the grouped key heads and the L2 norm in the kernel
            run = ops[1] if recurrent else ops[0]
            o, state = run(q, k, v, g=g, beta=beta, scale=self.scale, initial_state=state,
                           output_final_state=cache is not None, use_qk_l2norm_in_kernel=True)
        else:
            rep = Hv // Hk
            # (B, Hv, S, D*), contiguous whatever the padding: the chunked form's layout (and memory) is one
            q, k = (l2norm(t.float()).repeat_interleave(rep, dim=2).transpose(1, 2).contiguous() for t in (q, k))
            v = v.float().transpose(1, 2).contiguous()  # (B, Hv, S, Dv)
            g, beta = g.transpose(1, 2).contiguous(), beta.float().transpose(1, 2).contiguous()  # (B, Hv, S)
            if recurrent:
                o, state = recurrent_gated_delta_rule(q * self.scale, k, v, g, beta, state)
            else:
                o, state = chunk_gated_delta_rule(q * self.scale, k, v, g, beta, self.chunk, state)
            o = o.transpose(1, 2).to(x_BSD.dtype)  # (B, S, Hv, Dv)
        if cache is not None:
            cache.state, cache.length = state, cache.length + S
        o = self.norm(o, z.view(B, S, Hv, Dv))
        return self.wo(o.reshape(B, S, Hv * Dv))
