"""Position encodings, by ``position.type``.

Shape legend: B batch, S query positions, T key positions, D model dim, H heads, Dh head dim.

A position encoding has four hooks, and each class overrides only the ones it uses:
- ``check_length(end)``: refuse positions it cannot encode (learned: past its table), from the
  Python ints the decoder knows (cache length + S), so that no tensor value is read on the host
  and ``torch.compile`` traces the forward in one graph;
- ``embed(x_BSD, pos_S)``: absolute encodings added to the token embeddings (learned, sinusoidal);
- ``context(q_pos_S, k_pos_T)``: what attention needs, computed once per forward and shared by all
  layers: RoPE's cos/sin tables or ALiBi's additive bias;
- ``num_params(cfg)``: parameters owned (only the learned table has any).

Formulas: ``../shared/REFERENCES.md`` (Positions) and the seeds on extrapolation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor, nn

from archlab.config.schema import ModelConfig
from archlab.registry import Registry

POSITIONS: Registry = Registry("position")
ROPE_SCALINGS = ["none", "linear", "ntk", "yarn"]


@dataclass
class PosContext:
    """Per-forward position data handed to every attention layer."""

    cos: Optional[Tensor] = None  # (S, Dh) RoPE, already scaled by the YaRN temperature
    sin: Optional[Tensor] = None  # (S, Dh)
    bias: Optional[Tensor] = None  # (H, S, T) additive score bias (ALiBi), causal part excluded


class PositionEncoding(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()

    def check_length(self, end: int) -> None:
        """Raise ValueError when positions 0 ... end - 1 cannot all be encoded."""

    def embed(self, x_BSD: Tensor, pos_S: Tensor) -> Tensor:
        return x_BSD

    def context(self, q_pos_S: Tensor, k_pos_T: Tensor) -> PosContext:
        return PosContext()

    @staticmethod
    def num_params(cfg: ModelConfig) -> int:
        return 0


@POSITIONS.register("none")
class NoPE(PositionEncoding):
    """No position information (NoPE): the causal mask alone breaks permutation symmetry."""


@POSITIONS.register("learned")
class LearnedPositions(PositionEncoding):
    """A trained table of max_seq_len vectors added to the embeddings (GPT-2/3)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.max_seq_len = cfg.max_seq_len
        self.table = nn.Embedding(cfg.max_seq_len, cfg.d_model)

    def check_length(self, end: int) -> None:
        if end > self.max_seq_len:
            raise ValueError(
                f"position {end - 1} is beyond the learned table (model.max_seq_len="
                f"{self.max_seq_len}); learned positions cannot extrapolate")

    def embed(self, x_BSD: Tensor, pos_S: Tensor) -> Tensor:
        return x_BSD + self.table(pos_S)  # positions checked by check_length

    @staticmethod
    def num_params(cfg: ModelConfig) -> int:
        return cfg.max_seq_len * cfg.d_model


@POSITIONS.register("sinusoidal")
class SinusoidalPositions(PositionEncoding):
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...) (Vaswani et al. 2017).

    Computed from the positions on the fly, so any length works (quality past training is the
    question the extrapolation evals ask).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        d = cfg.d_model
        inv = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
        self.register_buffer("inv_freq", inv, persistent=False)
        self.d = d

    def embed(self, x_BSD: Tensor, pos_S: Tensor) -> Tensor:
        angle = pos_S.float()[:, None] * self.inv_freq[None, :]  # (S, D/2)
        pe = torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(1)[:, : self.d]  # (S, D) interleaved
        return x_BSD + pe.to(x_BSD.dtype)


def rope_inv_freq(d_head: int, base: float, scaling, max_seq_len: int) -> tuple[Tensor, float]:
    """Inverse frequencies theta_k = base^(-2k/Dh) after the chosen scaling, and the attention
    temperature (1.0 except YaRN). Matches HF ``modeling_rope_utils`` for linear and yarn."""
    idx = torch.arange(0, d_head, 2, dtype=torch.float32) / d_head  # 2k/Dh
    s = scaling.factor
    if scaling.type == "ntk":  # NTK-aware: stretch the base instead of the positions
        base = base * s ** (d_head / (d_head - 2))
    inv_freq = 1.0 / base**idx
    if scaling.type == "linear":  # position interpolation: pos / s
        return inv_freq / s, 1.0
    if scaling.type != "yarn":
        return inv_freq, 1.0
    orig = scaling.original_max_seq_len or max_seq_len

    def correction_dim(n_rot: float) -> float:  # dim index whose wavelength fits n_rot times in orig
        return d_head * math.log(orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction_dim(scaling.beta_fast)), 0)
    high = min(math.ceil(correction_dim(scaling.beta_slow)), d_head - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(d_head // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolate = 1.0 - ramp  # 1: keep original frequency (high-frequency dims)
    inv_freq = (inv_freq / s) * (1 - extrapolate) + inv_freq * extrapolate
    temperature = 0.1 * math.log(s) + 1.0 if s > 1 else 1.0
    return inv_freq, temperature


@POSITIONS.register("rope")
class RotaryPositions(PositionEncoding):
    """RoPE (Su et al. 2021): rotate channel pairs of q and k by pos * theta_k, so that q.k depends
    on the offset only. Pairs are (i, i + Dh/2), the "rotate half" layout HF LLaMA uses."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        inv_freq, temp = rope_inv_freq(cfg.d_head, cfg.position.rope_base, cfg.position.rope_scaling,
                                       cfg.max_seq_len)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.temperature = temp

    def context(self, q_pos_S: Tensor, k_pos_T: Tensor) -> PosContext:
        angle = q_pos_S.float()[:, None] * self.inv_freq[None, :]  # (S, Dh/2)
        angle = torch.cat([angle, angle], dim=-1)  # (S, Dh)
        return PosContext(cos=angle.cos() * self.temperature, sin=angle.sin() * self.temperature)


def apply_rotary(x_BHSD: Tensor, cos_SD: Tensor, sin_SD: Tensor) -> Tensor:
    """x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1]."""
    x1, x2 = x_BHSD.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x_BHSD * cos_SD + rotated * sin_SD).to(x_BHSD.dtype)


def alibi_slopes(n_heads: int) -> Tensor:
    """Head slopes of Press et al. 2022: geometric from 2^(-8/n) with ratio 2^(-8/n); for n not a
    power of two, the closest power's slopes plus every other slope of twice that power."""

    def power_of_two(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n_heads).is_integer():
        return torch.tensor(power_of_two(n_heads))
    closest = 2 ** math.floor(math.log2(n_heads))
    extra = power_of_two(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(power_of_two(closest) + extra)


@POSITIONS.register("alibi")
class ALiBi(PositionEncoding):
    """Attention with Linear Biases: score(i, j) -= m_h * (i - j). No parameters, no embedding."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.register_buffer("slopes", alibi_slopes(cfg.n_heads), persistent=False)

    def context(self, q_pos_S: Tensor, k_pos_T: Tensor) -> PosContext:
        dist = (q_pos_S[:, None] - k_pos_T[None, :]).float()  # (S, T) = i - j
        return PosContext(bias=-self.slopes[:, None, None] * dist)  # (H, S, T)


def build_positions(cfg: ModelConfig) -> PositionEncoding:
    return POSITIONS.get(cfg.position.type)(cfg)
