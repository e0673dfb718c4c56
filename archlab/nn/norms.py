"""Normalisation layers, by ``norm.type``: ``layernorm`` (GPT, 2017) and ``rmsnorm`` (LLaMA).

Both are torch's own modules; the subclasses adapt the constructor to the recipe and state their
facts (``archlab.nn.component``): parameter count, what they keep for backward.
Site argument: ``dim``, the channels normalised (d_model, or the head dim for q/k norms).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from torch import nn

from archlab.errors import fail
from archlab.nn.component import STATS_BYTES, ActShape
from archlab.registry import Registry

if TYPE_CHECKING:
    from archlab.config.schema import ModelConfig

NORMS: Registry = Registry("norm")


@dataclass
class NormConfig:
    type: str = "layernorm"  # layernorm | rmsnorm
    placement: str = "pre"  # pre (GPT-2, LLaMA: stable at depth) | post (2017 Transformer)
    eps: float = 1e-5
    bias: bool = True  # LayerNorm bias; rmsnorm has none


PLACEMENTS = ("pre", "post")


class Norm:
    """The facts every norm states (mixed into a torch norm module)."""

    options: ClassVar[frozenset[str]] = frozenset({"placement", "eps"})  # the keys of model.norm it reads

    @classmethod
    def validate(cls, m, prefix: str = "model") -> None:
        if m.norm.placement not in PLACEMENTS:
            fail(f"{prefix}.norm.placement", m.norm.placement, f"must be one of: {', '.join(PLACEMENTS)}")
        if m.norm.eps is None or m.norm.eps <= 0:
            fail(f"{prefix}.norm.eps", m.norm.eps, "must be a positive number")

    @staticmethod
    def num_params(cfg: "ModelConfig", *, dim: int) -> int:
        raise NotImplementedError

    @staticmethod
    def saved(s: ActShape, *, dim: int) -> tuple[bool, float]:
        """Per row: (whether the norm keeps its input tensor itself, bytes of everything else)."""
        raise NotImplementedError

    @classmethod
    def saved_bytes(cls, s: ActShape, *, dim: int) -> float:
        """Per row: everything one norm keeps, its input included."""
        keeps_input, extra = cls.saved(s, dim=dim)
        return keeps_input * dim * s.act + extra


@NORMS.register("layernorm")
class LayerNorm(Norm, nn.LayerNorm):
    """(x - mean) / std * gamma + beta over the last dim."""

    options = Norm.options | {"bias"}

    def __init__(self, cfg: "ModelConfig", *, dim: int):
        nn.LayerNorm.__init__(self, dim, eps=cfg.norm.eps, bias=cfg.norm.bias)

    @staticmethod
    def num_params(cfg: "ModelConfig", *, dim: int) -> int:
        return dim * (2 if cfg.norm.bias else 1)

    @staticmethod
    def saved(s: ActShape, *, dim: int) -> tuple[bool, float]:
        """Its input, mean and rstd (activation dtype on CPU, fp32 on CUDA)."""
        return True, 2 * (s.act if s.device == "cpu" else STATS_BYTES)


@NORMS.register("rmsnorm")
class RMSNorm(Norm, nn.RMSNorm):
    """x / rms(x) * gamma: no centring, no bias (Zhang & Sennrich 2019; LLaMA)."""


    def __init__(self, cfg: "ModelConfig", *, dim: int):
        nn.RMSNorm.__init__(self, dim, eps=cfg.norm.eps)

    @staticmethod
    def num_params(cfg: "ModelConfig", *, dim: int) -> int:
        return dim

    @staticmethod
    def saved(s: ActShape, *, dim: int) -> tuple[bool, float]:
        """CPU: torch's composite, which upcasts: the fp32 input (a copy unless it is fp32 already),
        rstd and the fp32 normalised x*rstd. CUDA: the fused kernel keeps the input and an fp32 rstd."""
        if s.device == "cuda":
            return True, STATS_BYTES
        upcast_copy = dim * STATS_BYTES if s.act != STATS_BYTES else 0
        return s.act == STATS_BYTES, upcast_copy + STATS_BYTES + dim * STATS_BYTES


def norm_class(cfg: "ModelConfig") -> type[Norm]:
    return NORMS.get(cfg.norm.type)


def build_norm(cfg: "ModelConfig", *, dim: int) -> nn.Module:
    return norm_class(cfg)(cfg, dim=dim)


def norm_params(cfg: "ModelConfig", *, dim: int) -> int:
    return norm_class(cfg).num_params(cfg, dim=dim)
