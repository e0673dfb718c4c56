"""Feed-forward blocks, by ``ffn.type``: ``gelu`` (GPT MLP), ``relu`` (2017) and ``swiglu`` (LLaMA).

Shape legend: N tokens (any leading dims), D model dim, F hidden dim.

Each variant has its own config (``model.ffn``, chosen by ``ffn.type``: :class:`FFNConfig` and the
variant's subclass) and is built from it and its site: ``d_model`` (D), ``hidden`` (F) and
``expert=True`` for an MoE expert (no bias, no dropout); never the whole model config. Each class
also states the facts the rest of archlab needs (``archlab.nn.component``): its default hidden width,
parameter count, matmul FLOPs, the hidden activations it keeps for backward, the width of its
up-projection and its activation, ``activation(config)`` (the routed experts of ``archlab.nn.moe`` and
BERT's head transform apply the same function).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Callable, ClassVar, Optional

import torch.nn.functional as F
from torch import Tensor, nn

from archlab.errors import fail
from archlab.nn.component import ActShape, option_names
from archlab.registry import Registry

if TYPE_CHECKING:
    from archlab.config.schema import ModelConfig

FFNS: Registry = Registry("ffn")


@dataclass
class FFNConfig:
    """``model.ffn``: the keys every feed-forward variant reads; a variant's own keys are in its subclass."""

    variants: ClassVar[Registry] = FFNS  # ffn.type chooses the dataclass: the variant's ``Config``
    type: str = "gelu"  # gelu (GPT 4x MLP) | relu (2017) | swiglu (LLaMA)
    hidden: Optional[int] = None  # None: 4*d for gelu/relu, LLaMA's 8/3*d rounded to multiple_of for swiglu
    bias: bool = True
    dropout: float = 0.0


@dataclass
class GeluConfig(FFNConfig):
    approximate: str = "tanh"  # tanh (the tanh approximation: GPT-2) | none (the exact GELU, erf: BERT, GPT-NeoX)


@dataclass
class ReluConfig(FFNConfig):
    type: str = "relu"


@dataclass
class SwiGLUConfig(FFNConfig):
    type: str = "swiglu"
    multiple_of: int = 32  # the default hidden width (hidden null) is rounded up to this


class FFN(nn.Module):
    """up -> activation -> down. Subclasses set the facts below and ``activate``."""

    Config: ClassVar[type[FFNConfig]] = FFNConfig  # its keys of model.ffn
    options: ClassVar[frozenset[str]] = option_names(FFNConfig)
    up_name: ClassVar[str] = "up"  # the up-projection's attribute (its parameter names in checkpoints)
    up_width: ClassVar[int] = 1  # up-projection output width in units of F ([gate; up] = 2)
    hidden_saved: ClassVar[int] = 2  # hidden activations kept for backward per token, in units of F

    def __init__(self, config: FFNConfig, *, d_model: int, hidden: int, expert: bool = False):
        super().__init__()
        bias = config.bias and not expert
        self.hidden = hidden
        setattr(self, self.up_name, nn.Linear(d_model, self.up_width * hidden, bias=bias))
        self.down = nn.Linear(hidden, d_model, bias=bias)
        self.down.is_residual_proj = True  # GPT-2 scaled init
        self.drop = nn.Dropout(0.0 if expert else config.dropout)
        self.activate = self.activation(config)  # the config's form (e.g. the exact GELU) on this instance

    @staticmethod
    def activate(h: Tensor) -> Tensor:
        """The activation on the up-projection's output (N, up_width * F) -> (N, F), at the config defaults."""
        raise NotImplementedError

    @classmethod
    def activation(cls, config: FFNConfig) -> Callable[[Tensor], Tensor]:
        """``activate`` in the form ``config`` selects (the MLP's, MoE experts' and head transform's function)."""
        return cls.activate

    @property
    def up_proj(self) -> nn.Linear:
        return getattr(self, self.up_name)

    def forward(self, x_ND: Tensor) -> Tensor:
        return self.drop(self.down(self.activate(self.up_proj(x_ND))))

    @staticmethod
    def default_hidden(config: FFNConfig, *, d_model: int) -> int:
        return 4 * d_model

    @classmethod
    def num_params(cls, config: FFNConfig, *, d_model: int, hidden: int, expert: bool = False) -> int:
        n = (cls.up_width + 1) * d_model * hidden
        if config.bias and not expert:
            n += cls.up_width * hidden + d_model
        return n

    @classmethod
    def forward_flops(cls, *, d_model: int, hidden: int) -> float:
        """Matmul FLOPs per token: 2 x its weight matrices."""
        return 2.0 * (cls.up_width + 1) * d_model * hidden

    @classmethod
    def saved_bytes(cls, s: ActShape, *, hidden: int, n_tokens: float) -> float:
        """Applied to ``n_tokens`` rows: its input + hidden activations."""
        return n_tokens * (s.cfg.d_model + cls.hidden_saved * hidden) * s.act

    @classmethod
    def selective_saved_bytes(cls, s: ActShape, *, hidden: int, n_tokens: float) -> float:
        """Selective checkpointing keeps its two matmuls' outputs."""
        return n_tokens * (cls.up_width * hidden + s.cfg.d_model) * s.act

    @classmethod
    def validate(cls, config: FFNConfig, prefix: str = "model.ffn") -> None:
        """Its rules on its config node (``prefix``: where the node is in the recipe)."""
        if config.hidden is not None and config.hidden <= 0:
            fail(f"{prefix}.hidden", config.hidden, "must be a positive number (or null for the default)")
        if not 0.0 <= config.dropout < 1.0:
            fail(f"{prefix}.dropout", config.dropout, "must lie in [0, 1)")


GELU_FORMS = ("tanh", "none")  # ffn.approximate: torch's F.gelu(approximate=...)


@FFNS.register("gelu")
class GeluMLP(FFN):
    """down(gelu(up(x))): GPT-2/3's MLP. ``ffn.approximate``: tanh, the tanh approximation as in GPT-2
    (default), or none, the exact x * Phi(x) with erf (BERT, GPT-NeoX). Either keeps its input and output
    (2F per token); the activation is elementwise and counts no FLOPs."""

    Config = GeluConfig
    options = option_names(GeluConfig)

    @staticmethod
    def activate(h: Tensor) -> Tensor:
        return F.gelu(h, approximate="tanh")

    @classmethod
    def activation(cls, config: GeluConfig) -> Callable[[Tensor], Tensor]:
        return cls.activate if config.approximate == "tanh" else partial(F.gelu, approximate="none")

    @classmethod
    def validate(cls, config: GeluConfig, prefix: str = "model.ffn") -> None:
        super().validate(config, prefix)
        if config.approximate not in GELU_FORMS:
            fail(f"{prefix}.approximate", config.approximate,
                 f"must be one of {', '.join(GELU_FORMS)} (tanh: the tanh approximation; none: exact, with erf)")


@FFNS.register("relu")
class ReluMLP(FFN):
    """down(relu(up(x))): the 2017 Transformer's position-wise FFN. Its output serves as the
    saved tensor of both the relu and the down projection (F per token)."""

    Config = ReluConfig
    hidden_saved = 1

    @staticmethod
    def activate(h: Tensor) -> Tensor:
        return F.relu(h)


@FFNS.register("swiglu")
class SwiGLU(FFN):
    """down(silu(gate(x)) * up(x)) (Shazeer 2020; LLaMA). Gate and up share one GEMM ([gate; up]
    rows of ``up``); keeps [gate; up], silu(gate) and the product (4F per token)."""

    Config = SwiGLUConfig
    options = option_names(SwiGLUConfig)
    up_name = "gate_up"  # [gate; up] rows
    up_width = 2
    hidden_saved = 4

    @staticmethod
    def activate(h: Tensor) -> Tensor:
        gate, up = h.chunk(2, dim=-1)
        return F.silu(gate) * up

    @staticmethod
    def default_hidden(config: SwiGLUConfig, *, d_model: int) -> int:
        h, mult = int(2 * 4 * d_model / 3), config.multiple_of
        return mult * ((h + mult - 1) // mult)

    @classmethod
    def validate(cls, config: SwiGLUConfig, prefix: str = "model.ffn") -> None:
        super().validate(config, prefix)
        if config.multiple_of is None or config.multiple_of <= 0:
            fail(f"{prefix}.multiple_of", config.multiple_of, "must be a positive number")


def ffn_class(cfg: "ModelConfig") -> type[FFN]:
    """The variant a model config's ``ffn.type`` names."""
    return FFNS.get(cfg.ffn.type)


def build_ffn(cfg: "ModelConfig", *, hidden: int, expert: bool = False) -> FFN:
    """The FFN of a model: its ``ffn`` config at width ``d_model``."""
    return ffn_class(cfg)(cfg.ffn, d_model=cfg.d_model, hidden=hidden, expert=expert)
