"""Normalisation layers, by ``norm.type``: ``layernorm`` (GPT, 2017) and ``rmsnorm`` (LLaMA).

Both are torch's own modules; the subclasses adapt the constructor to their config and state their facts
(``archlab.nn.component``): parameter count, what they keep for backward. A norm receives its own config
(``model.norm``: ``LayerNormConfig`` or ``RMSNormConfig``, chosen by ``norm.type``) and its site: ``dim``, the
channels normalised (d_model, or the head dim for q/k norms).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from torch import nn

from archlab.errors import fail
from archlab.nn.component import STATS_BYTES, ActShape, option_names
from archlab.registry import Registry

NORMS: Registry = Registry("norm")


@dataclass
class NormConfig:
    """``model.norm``: the keys every norm reads; a norm's own keys are in its subclass."""

    variants: ClassVar[Registry] = NORMS  # norm.type chooses the dataclass: the norm's ``Config``
    type: str = "layernorm"  # layernorm | rmsnorm
    placement: str = "pre"  # pre (GPT-2, LLaMA: stable at depth) | post (2017 Transformer)
    eps: float = 1e-5


@dataclass
class LayerNormConfig(NormConfig):
    bias: bool = True  # LayerNorm's beta (BERT, GPT-2: yes)


@dataclass
class RMSNormConfig(NormConfig):
    type: str = "rmsnorm"


PLACEMENTS = ("pre", "post")


def _node(cfg: Any) -> NormConfig:
    """The norm node of ``cfg``: ``cfg`` itself, or a model config's ``norm`` (the call form of the components
    that still pass the model config)."""
    norm = getattr(cfg, "norm", None)
    return norm if norm is not None else cfg


class Norm:
    """The facts every norm states (mixed into a torch norm module)."""

    Config: ClassVar[type] = NormConfig
    options: ClassVar[frozenset[str]] = option_names(NormConfig)  # the keys of model.norm it reads

    @classmethod
    def validate(cls, m, prefix: str = "model") -> None:
        if m.norm.placement not in PLACEMENTS:
            fail(f"{prefix}.norm.placement", m.norm.placement, f"must be one of: {', '.join(PLACEMENTS)}")
        if m.norm.eps is None or m.norm.eps <= 0:
            fail(f"{prefix}.norm.eps", m.norm.eps, "must be a positive number")

    @staticmethod
    def num_params(config: NormConfig, *, dim: int) -> int:
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

    Config = LayerNormConfig
    options = option_names(LayerNormConfig)

    def __init__(self, config: LayerNormConfig, *, dim: int):
        nn.LayerNorm.__init__(self, dim, eps=config.eps, bias=config.bias)

    @staticmethod
    def num_params(config: LayerNormConfig, *, dim: int) -> int:
        return dim * (2 if config.bias else 1)

    @staticmethod
    def saved(s: ActShape, *, dim: int) -> tuple[bool, float]:
        """Its input, mean and rstd (activation dtype on CPU, fp32 on CUDA)."""
        return True, 2 * (s.act if s.device == "cpu" else STATS_BYTES)


@NORMS.register("rmsnorm")
class RMSNorm(Norm, nn.RMSNorm):
    """x / rms(x) * gamma: no centring, no bias (Zhang & Sennrich 2019; LLaMA)."""

    Config = RMSNormConfig

    def __init__(self, config: RMSNormConfig, *, dim: int):
        nn.RMSNorm.__init__(self, dim, eps=config.eps)

    @staticmethod
    def num_params(config: RMSNormConfig, *, dim: int) -> int:
        return dim

    @staticmethod
    def saved(s: ActShape, *, dim: int) -> tuple[bool, float]:
        """CPU: torch's composite, which upcasts: the fp32 input (a copy unless it is fp32 already),
        rstd and the fp32 normalised x*rstd. CUDA: the fused kernel keeps the input and an fp32 rstd."""
        if s.device == "cuda":
            return True, STATS_BYTES
        upcast_copy = dim * STATS_BYTES if s.act != STATS_BYTES else 0
        return s.act == STATS_BYTES, upcast_copy + STATS_BYTES + dim * STATS_BYTES


def norm_class(cfg: Any) -> type[Norm]:
    """The norm class of a norm node (or of a model config's)."""
    return NORMS.get(_node(cfg).type)


def build_norm(cfg: Any, *, dim: int) -> nn.Module:
    """The norm of a norm node (or of a model config's) over ``dim`` channels."""
    config = _node(cfg)
    return NORMS.get(config.type)(config, dim=dim)


def norm_params(cfg: Any, *, dim: int) -> int:
    config = _node(cfg)
    return NORMS.get(config.type).num_params(config, dim=dim)
