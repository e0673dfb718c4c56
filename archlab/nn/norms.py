"""Normalisation layers, by ``norm.type``: ``layernorm`` (GPT, 2017) and ``rmsnorm`` (LLaMA).

Both are torch's own modules; the subclasses only adapt the constructor to the recipe and state
their parameter count, so that a config can count parameters without building anything.
"""

from __future__ import annotations

from torch import nn

from archlab.config.schema import NormConfig
from archlab.registry import Registry

NORMS: Registry = Registry("norm")


@NORMS.register("layernorm")
class LayerNorm(nn.LayerNorm):
    """(x - mean) / std * gamma + beta over the last dim."""

    def __init__(self, dim: int, cfg: NormConfig):
        super().__init__(dim, eps=cfg.eps, bias=cfg.bias)

    @staticmethod
    def num_params(dim: int, cfg: NormConfig) -> int:
        return dim * (2 if cfg.bias else 1)


@NORMS.register("rmsnorm")
class RMSNorm(nn.RMSNorm):
    """x / rms(x) * gamma: no centring, no bias (Zhang & Sennrich 2019; LLaMA)."""

    def __init__(self, dim: int, cfg: NormConfig):
        super().__init__(dim, eps=cfg.eps)

    @staticmethod
    def num_params(dim: int, cfg: NormConfig) -> int:
        return dim


def build_norm(dim: int, cfg: NormConfig) -> nn.Module:
    return NORMS.get(cfg.type)(dim, cfg)


def norm_params(dim: int, cfg: NormConfig) -> int:
    return NORMS.get(cfg.type).num_params(dim, cfg)
