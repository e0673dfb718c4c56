"""Position encodings, by ``position.type``, and RoPE scalings, by ``position.rope_scaling.type``.

Shape legend: B batch, S query positions, T key positions, D model dim, H heads, Dh head dim,
R rotary dims (the head dim, or MLA's ``qk_rope_head_dim``: ``ModelConfig.rotary_dim``).

A position encoding has four hooks, and each class overrides only the ones it uses:
- ``check_length(end)``: refuse positions it cannot encode (learned: past its table), from the
  Python ints the decoder knows (cache length + S), so that no tensor value is read on the host
  and ``torch.compile`` traces the forward in one graph;
- ``embed(x_BSD, pos_S)``: absolute encodings added to the token embeddings (learned, sinusoidal);
- ``context(q_pos_S, k_pos_T)``: what attention needs, computed once per forward and shared by all
  layers: RoPE's cos/sin tables or ALiBi's additive bias;
and states its facts (``archlab.nn.component``): ``max_length`` (None: any length),
``rotates_qk`` / ``score_bias`` (what attention receives), ``supports_bidirectional`` (valid in an
encoder, whose attention has no causal mask), ``num_params``, ``saved_bytes``, ``validate``.

Formulas: ``../shared/REFERENCES.md`` (Positions) and the seeds on extrapolation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Optional

import torch
from torch import Tensor, nn

from archlab.errors import fail
from archlab.nn.component import ID_BYTES, STATS_BYTES, ActShape
from archlab.registry import Registry

if TYPE_CHECKING:
    from archlab.config.schema import ModelConfig


@dataclass
class RopeScalingConfig:
    type: str = "none"  # none | linear (position interpolation) | ntk | yarn
    factor: float = 1.0  # context extension factor s
    original_max_seq_len: Optional[int] = None  # context trained at; default model.max_seq_len
    beta_fast: float = 32.0  # yarn ramp: wavelengths with more rotations than this extrapolate
    beta_slow: float = 1.0  # yarn ramp: fewer rotations than this interpolate


@dataclass
class PositionConfig:
    type: str = "learned"  # learned | sinusoidal | rope | alibi | relative (T5's bucketed bias) | none (NoPE)
    rope_base: float = 10000.0
    relative_buckets: int = 32  # relative: buckets of offsets (T5: 32; half exact, half log-spaced)
    relative_max_distance: int = 128  # relative: offsets at or past this share the last bucket (T5: 128)
    rope_scaling: RopeScalingConfig = field(default_factory=RopeScalingConfig)


POSITIONS: Registry = Registry("position")
ROPE_SCALINGS: Registry = Registry("rope scaling")


@dataclass
class PosContext:
    """Per-forward position data handed to every attention layer."""

    cos: Optional[Tensor] = None  # (S, R) RoPE, already scaled by the YaRN temperature
    sin: Optional[Tensor] = None  # (S, R)
    bias: Optional[Tensor] = None  # (H, S, T) additive score bias (ALiBi), causal part excluded


class PositionEncoding(nn.Module):
    options: ClassVar[frozenset[str]] = frozenset()  # the keys of model.position it reads (besides type)
    rotates_qk: ClassVar[bool] = False  # attention rotates q and k by ctx.cos / ctx.sin
    score_bias: ClassVar[bool] = False  # attention adds ctx.bias to its scores (an explicit mask)
    supports_bidirectional: ClassVar[bool] = True  # valid without the causal mask (an encoder)
    bidirectional_unsupported: ClassVar[str] = ""  # why not, when it is not

    def __init__(self, config: PositionConfig, *, d_model: int, n_heads: int, max_seq_len: int, rotary_dim: int,
                 causal: bool = True):
        """``config``: its own node (``model.position``); the site: the model width, the heads, the positions the
        model is built for, the channels per head RoPE rotates, and whether the stack's attention is causal."""
        super().__init__()
        self.causal = causal  # the stack's attention is causal (a decoder) or sees both sides (an encoder)

    @staticmethod
    def max_length(cfg: "ModelConfig") -> Optional[int]:
        """The most positions it can encode; None: any number."""
        return None

    def check_length(self, end: int) -> None:
        """Raise ValueError when positions 0 ... end - 1 cannot all be encoded."""

    def embed(self, x_BSD: Tensor, pos_S: Tensor) -> Tensor:
        return x_BSD

    def context(self, q_pos_S: Tensor, k_pos_T: Tensor) -> PosContext:
        return PosContext()

    @staticmethod
    def num_params(config: PositionConfig, *, d_model: int, n_heads: int, max_seq_len: int) -> int:
        return 0

    @staticmethod
    def saved_bytes(s: ActShape, checkpointing: str) -> float:
        """Bytes kept for backward outside the blocks (position ids, shared tables)."""
        return 0.0

    @classmethod
    def validate(cls, m, prefix: str = "model") -> None:
        """No rules of its own; keys it does not read (``options``) are refused by ``archlab.config.options``."""


@POSITIONS.register("none")
class NoPE(PositionEncoding):
    """No position information (NoPE): the causal mask alone breaks permutation symmetry. In an encoder
    (no mask) nothing does: the model sees a bag of tokens, an ablation baseline."""


@POSITIONS.register("learned")
class LearnedPositions(PositionEncoding):
    """A trained table of max_seq_len vectors added to the embeddings (GPT-2/3)."""


    def __init__(self, config: PositionConfig, *, d_model: int, n_heads: int, max_seq_len: int, rotary_dim: int,
                 causal: bool = True):
        super().__init__(config, d_model=d_model, n_heads=n_heads, max_seq_len=max_seq_len, rotary_dim=rotary_dim,
                         causal=causal)
        self.max_seq_len = max_seq_len
        self.table = nn.Embedding(max_seq_len, d_model)

    @staticmethod
    def max_length(cfg: "ModelConfig") -> Optional[int]:
        return cfg.max_seq_len

    def check_length(self, end: int) -> None:
        if end > self.max_seq_len:
            raise ValueError(
                f"position {end - 1} is beyond the learned table (model.max_seq_len="
                f"{self.max_seq_len}); learned positions cannot extrapolate")

    def embed(self, x_BSD: Tensor, pos_S: Tensor) -> Tensor:
        return x_BSD + self.table(pos_S)  # positions checked by check_length

    @staticmethod
    def num_params(config: PositionConfig, *, d_model: int, n_heads: int, max_seq_len: int) -> int:
        return max_seq_len * d_model

    @staticmethod
    def saved_bytes(s: ActShape, checkpointing: str) -> float:
        return s.seq_len * ID_BYTES  # the position ids the table lookup keeps


@POSITIONS.register("sinusoidal")
class SinusoidalPositions(PositionEncoding):
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...) (Vaswani et al. 2017).

    Computed from the positions on the fly, so any length works (quality past training is the
    question the extrapolation evals ask).
    """


    def __init__(self, config: PositionConfig, *, d_model: int, n_heads: int, max_seq_len: int, rotary_dim: int,
                 causal: bool = True):
        super().__init__(config, d_model=d_model, n_heads=n_heads, max_seq_len=max_seq_len, rotary_dim=rotary_dim,
                         causal=causal)
        d = d_model
        inv = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
        self.register_buffer("inv_freq", inv, persistent=False)
        self.d = d

    def embed(self, x_BSD: Tensor, pos_S: Tensor) -> Tensor:
        angle = pos_S.float()[:, None] * self.inv_freq[None, :]  # (S, D/2)
        pe = torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(1)[:, : self.d]  # (S, D) interleaved
        return x_BSD + pe.to(x_BSD.dtype)


# ----------------------------------------------------------------------------- RoPE scalings


class RopeScaling:
    """Turns RoPE's inverse frequencies theta_k = base^(-2k/R) into the scaled ones, with an
    attention temperature (1.0 except YaRN).
    ``options``: the keys of ``model.position.rope_scaling`` it reads (besides type)."""

    options: ClassVar[frozenset[str]] = frozenset()

    @staticmethod
    def inv_freq(idx: Tensor, base: float, rot_dim: int, sc: RopeScalingConfig,
                 max_seq_len: int) -> tuple[Tensor, float]:
        raise NotImplementedError


    @classmethod
    def validate(cls, m, prefix: str = "model") -> None:
        sc, key = m.position.rope_scaling, f"{prefix}.position.rope_scaling"
        if sc.factor < 1.0:
            fail(f"{key}.factor", sc.factor, "must be >= 1 (context extension factor)")
        if sc.original_max_seq_len is not None and sc.original_max_seq_len <= 0:
            fail(f"{key}.original_max_seq_len", sc.original_max_seq_len, "must be a positive number")


@ROPE_SCALINGS.register("none")
class NoRopeScaling(RopeScaling):

    @staticmethod
    def inv_freq(idx, base, rot_dim, sc, max_seq_len):
        return 1.0 / base**idx, 1.0


@ROPE_SCALINGS.register("linear")
class LinearRopeScaling(RopeScaling):
    """Position interpolation (Chen et al. 2023): pos / s, i.e. every frequency divided by s."""

    options = frozenset({"factor"})

    @staticmethod
    def inv_freq(idx, base, rot_dim, sc, max_seq_len):
        return 1.0 / base**idx / sc.factor, 1.0


@ROPE_SCALINGS.register("ntk")
class NTKRopeScaling(RopeScaling):
    """NTK-aware scaling: stretch the base instead of the positions, base * s^(R/(R-2))."""

    options = frozenset({"factor"})

    @staticmethod
    def inv_freq(idx, base, rot_dim, sc, max_seq_len):
        return 1.0 / (base * sc.factor ** (rot_dim / (rot_dim - 2)))**idx, 1.0


@ROPE_SCALINGS.register("yarn")
class YarnRopeScaling(RopeScaling):
    """YaRN (Peng et al. 2023): interpolate the low frequencies, keep the high ones, with a ramp
    between, and scale attention by the temperature 0.1 ln s + 1. Matches HF ``modeling_rope_utils``."""

    options = frozenset({"factor", "original_max_seq_len", "beta_fast", "beta_slow"})

    @staticmethod
    def inv_freq(idx, base, rot_dim, sc, max_seq_len):
        s = sc.factor
        inv_freq = 1.0 / base**idx
        orig = sc.original_max_seq_len or max_seq_len

        def correction_dim(n_rot: float) -> float:  # dim index whose wavelength fits n_rot times in orig
            return rot_dim * math.log(orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))

        low = max(math.floor(correction_dim(sc.beta_fast)), 0)
        high = min(math.ceil(correction_dim(sc.beta_slow)), rot_dim - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(rot_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
        extrapolate = 1.0 - ramp  # 1: keep original frequency (high-frequency dims)
        inv_freq = (inv_freq / s) * (1 - extrapolate) + inv_freq * extrapolate
        temperature = 0.1 * math.log(s) + 1.0 if s > 1 else 1.0
        return inv_freq, temperature


def rope_inv_freq(rot_dim: int, base: float, scaling: RopeScalingConfig, max_seq_len: int) -> tuple[Tensor, float]:
    """Inverse frequencies theta_k = base^(-2k/R) after the chosen scaling, and the attention
    temperature (1.0 except YaRN)."""
    idx = torch.arange(0, rot_dim, 2, dtype=torch.float32) / rot_dim  # 2k/R
    return ROPE_SCALINGS.get(scaling.type).inv_freq(idx, base, rot_dim, scaling, max_seq_len)


@POSITIONS.register("rope")
class RotaryPositions(PositionEncoding):
    """RoPE (Su et al. 2021): rotate channel pairs of q and k by pos * theta_k, so that q.k depends
    on the offset only. Pairs are (i, i + R/2), the "rotate half" layout HF LLaMA uses; R is the
    attention's rotary width (``ModelConfig.rotary_dim``: the head dim, MLA's ``qk_rope_head_dim``)."""

    options = frozenset({"rope_base", "rope_scaling"})
    rotates_qk = True

    def __init__(self, config: PositionConfig, *, d_model: int, n_heads: int, max_seq_len: int, rotary_dim: int,
                 causal: bool = True):
        super().__init__(config, d_model=d_model, n_heads=n_heads, max_seq_len=max_seq_len, rotary_dim=rotary_dim,
                         causal=causal)
        inv_freq, temp = rope_inv_freq(rotary_dim, config.rope_base, config.rope_scaling, max_seq_len)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.temperature = temp

    def context(self, q_pos_S: Tensor, k_pos_T: Tensor) -> PosContext:
        angle = q_pos_S.float()[:, None] * self.inv_freq[None, :]  # (S, R/2)
        angle = torch.cat([angle, angle], dim=-1)  # (S, R)
        return PosContext(cos=angle.cos() * self.temperature, sin=angle.sin() * self.temperature)

    @staticmethod
    def saved_bytes(s: ActShape, checkpointing: str) -> float:
        # cos/sin tables (fp32) shared by all layers; under checkpointing only inside the recomputed blocks
        return 2 * s.seq_len * s.cfg.rotary_dim * STATS_BYTES if checkpointing == "none" else 0.0

    @classmethod
    def validate(cls, m, prefix: str = "model") -> None:
        # an odd rotated head dim is refused by the attention that owns it (mha: n_heads, mla: qk_rope_head_dim)
        if m.position.rope_base is None or m.position.rope_base <= 0:
            fail(f"{prefix}.position.rope_base", m.position.rope_base, "must be a positive number")
        ROPE_SCALINGS.get(m.position.rope_scaling.type).validate(m, prefix)


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

    score_bias = True
    supports_bidirectional = False
    bidirectional_unsupported = ("ALiBi's bias here is the causal form -m (i - j); its symmetric form -m |i - j| "
                                 "is not implemented")

    def __init__(self, config: PositionConfig, *, d_model: int, n_heads: int, max_seq_len: int, rotary_dim: int,
                 causal: bool = True):
        super().__init__(config, d_model=d_model, n_heads=n_heads, max_seq_len=max_seq_len, rotary_dim=rotary_dim,
                         causal=causal)
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)

    def context(self, q_pos_S: Tensor, k_pos_T: Tensor) -> PosContext:
        dist = (q_pos_S[:, None] - k_pos_T[None, :]).float()  # (S, T) = i - j
        return PosContext(bias=-self.slopes[:, None, None] * dist)  # (H, S, T)


def relative_bucket(offset: Tensor, bidirectional: bool, num_buckets: int, max_distance: int) -> Tensor:
    """T5's bucket of each key-minus-query offset (Raffel et al. 2020, Mesh TensorFlow): bidirectional, half
    the buckets for keys after the query; then half of the rest exact (offsets 0 .. n/2 - 1), the others
    log-spaced up to ``max_distance``, beyond which all offsets share the last bucket. A causal stack sees
    only keys at or before the query: every later offset counts as 0."""
    bucket = torch.zeros_like(offset)
    if bidirectional:
        num_buckets //= 2
        bucket = bucket + (offset > 0).long() * num_buckets
        distance = offset.abs()
    else:
        distance = (-offset).clamp(min=0)
    exact = num_buckets // 2
    log_ratio = torch.log(distance.float().clamp(min=1) / exact) / math.log(max_distance / exact)
    large = (exact + (log_ratio * (num_buckets - exact)).long()).clamp(max=num_buckets - 1)
    return bucket + torch.where(distance < exact, distance, large)


@POSITIONS.register("relative")
class RelativeBias(PositionEncoding):
    """T5's relative position bias: a learned scalar per head and offset bucket, added to the attention
    scores of every layer of a stack (one table per stack, shared by its layers; an encoder's buckets are
    bidirectional, a decoder's one-sided). No embedding, any length (offsets past ``relative_max_distance``
    share a bucket)."""

    options = frozenset({"relative_buckets", "relative_max_distance"})
    score_bias = True

    def __init__(self, config: PositionConfig, *, d_model: int, n_heads: int, max_seq_len: int, rotary_dim: int,
                 causal: bool = True):
        super().__init__(config, d_model=d_model, n_heads=n_heads, max_seq_len=max_seq_len, rotary_dim=rotary_dim,
                         causal=causal)
        self.num_buckets, self.max_distance = config.relative_buckets, config.relative_max_distance
        self.table = nn.Embedding(config.relative_buckets, n_heads)  # (buckets, H)

    def context(self, q_pos_S: Tensor, k_pos_T: Tensor) -> PosContext:
        offset = k_pos_T[None, :] - q_pos_S[:, None]  # (S, T): key position - query position
        bucket = relative_bucket(offset, not self.causal, self.num_buckets, self.max_distance)
        return PosContext(bias=self.table(bucket).permute(2, 0, 1))  # (H, S, T)

    @staticmethod
    def num_params(config: PositionConfig, *, d_model: int, n_heads: int, max_seq_len: int) -> int:
        return config.relative_buckets * n_heads

    @staticmethod
    def saved_bytes(s: ActShape, checkpointing: str) -> float:
        return s.seq_len * s.seq_len * ID_BYTES  # the (S, S) bucket ids the table lookup keeps

    @classmethod
    def validate(cls, m, prefix: str = "model") -> None:
        p, key = m.position, f"{prefix}.position"
        if p.relative_buckets < 4 or p.relative_buckets % 2:
            fail(f"{key}.relative_buckets", p.relative_buckets, "must be an even number >= 4 (T5: 32): half of "
                 "them hold keys after the query in an encoder, and half of each half exact offsets")
        if p.relative_max_distance <= p.relative_buckets // 2:
            fail(f"{key}.relative_max_distance", p.relative_max_distance,
                 f"must exceed relative_buckets / 2 = {p.relative_buckets // 2} (the exact offsets; T5: 128)")


def position_class(cfg: Any) -> type[PositionEncoding]:
    """The position class of a position node (or of a model config's)."""
    node = getattr(cfg, "position", None)
    return POSITIONS.get((node if node is not None else cfg).type)


def build_positions(cfg: "ModelConfig", *, causal: bool = True) -> PositionEncoding:
    """The position encoding of one stack of the model ``cfg``: its own node and the site's facts; ``causal``:
    its attention sees only earlier keys (a decoder's)."""
    return position_class(cfg)(cfg.position, d_model=cfg.d_model, n_heads=cfg.n_heads, max_seq_len=cfg.max_seq_len,
                               rotary_dim=cfg.rotary_dim, causal=causal)


def position_params(cfg: "ModelConfig") -> int:
    """Parameters of one stack's position encoding in the model ``cfg``."""
    return position_class(cfg).num_params(cfg.position, d_model=cfg.d_model, n_heads=cfg.n_heads,
                                          max_seq_len=cfg.max_seq_len)
