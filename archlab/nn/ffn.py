"""Feed-forward blocks, by ``ffn.type``: ``gelu`` (GPT MLP), ``relu`` (2017) and ``swiglu`` (LLaMA).

Shape legend: N tokens (any leading dims), D model dim, F hidden dim.

Each class also states the facts the rest of archlab needs (``archlab.nn.component``): its
default hidden width, parameter count, matmul FLOPs, the hidden activations it keeps for
backward, the width of its up-projection and its activation, ``activation(cfg)`` (the routed
experts of ``archlab.nn.moe`` and BERT's head transform apply the same function).
Site arguments: ``hidden`` (F), and ``expert=True`` for an MoE expert (no bias, no dropout).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Callable, ClassVar, Optional

import torch.nn.functional as F
from torch import Tensor, nn

from archlab.errors import fail
from archlab.nn.component import ActShape
from archlab.registry import Registry

if TYPE_CHECKING:
    from archlab.config.schema import ModelConfig

FFNS: Registry = Registry("ffn")


@dataclass
class FFNConfig:
    type: str = "gelu"  # gelu (GPT 4x MLP) | relu (2017) | swiglu (LLaMA)
    approximate: str = "tanh"  # gelu: tanh (the tanh approximation: GPT-2) | none (the exact GELU, erf: BERT, GPT-NeoX)
    hidden: Optional[int] = None  # None: 4*d for gelu/relu, LLaMA's 8/3*d rounded to multiple_of for swiglu
    multiple_of: int = 32  # swiglu default hidden is rounded up to this
    bias: bool = True
    dropout: float = 0.0


class FFN(nn.Module):
    """up -> activation -> down. Subclasses set the facts below and ``activate``."""

    options: ClassVar[frozenset[str]] = frozenset({"hidden", "bias", "dropout"})  # the keys of model.ffn it reads
    up_name: ClassVar[str] = "up"  # the up-projection's attribute (its parameter names in checkpoints)
    up_width: ClassVar[int] = 1  # up-projection output width in units of F ([gate; up] = 2)
    hidden_saved: ClassVar[int] = 2  # hidden activations kept for backward per token, in units of F

    def __init__(self, cfg: "ModelConfig", *, hidden: int, expert: bool = False):
        super().__init__()
        bias = cfg.ffn.bias and not expert
        self.hidden = hidden
        setattr(self, self.up_name, nn.Linear(cfg.d_model, self.up_width * hidden, bias=bias))
        self.down = nn.Linear(hidden, cfg.d_model, bias=bias)
        self.down.is_residual_proj = True  # GPT-2 scaled init
        self.drop = nn.Dropout(0.0 if expert else cfg.ffn.dropout)
        self.activate = self.activation(cfg)  # the config's form (e.g. the exact GELU) on this instance

    @staticmethod
    def activate(h: Tensor) -> Tensor:
        """The activation on the up-projection's output (N, up_width * F) -> (N, F), at the config defaults."""
        raise NotImplementedError

    @classmethod
    def activation(cls, cfg: "ModelConfig") -> Callable[[Tensor], Tensor]:
        """``activate`` in the form ``cfg`` selects (the MLP's, MoE experts' and head transform's function)."""
        return cls.activate

    @property
    def up_proj(self) -> nn.Linear:
        return getattr(self, self.up_name)

    def forward(self, x_ND: Tensor) -> Tensor:
        return self.drop(self.down(self.activate(self.up_proj(x_ND))))

    @staticmethod
    def default_hidden(cfg: "ModelConfig") -> int:
        return 4 * cfg.d_model

    @classmethod
    def num_params(cls, cfg: "ModelConfig", *, hidden: int, expert: bool = False) -> int:
        n = (cls.up_width + 1) * cfg.d_model * hidden
        if cfg.ffn.bias and not expert:
            n += cls.up_width * hidden + cfg.d_model
        return n

    @classmethod
    def forward_flops(cls, cfg: "ModelConfig", *, hidden: int) -> float:
        """Matmul FLOPs per token: 2 x its weight matrices."""
        return 2.0 * (cls.up_width + 1) * cfg.d_model * hidden

    @classmethod
    def saved_bytes(cls, s: ActShape, *, hidden: int, n_tokens: float) -> float:
        """Applied to ``n_tokens`` rows: its input + hidden activations."""
        return n_tokens * (s.cfg.d_model + cls.hidden_saved * hidden) * s.act

    @classmethod
    def selective_saved_bytes(cls, s: ActShape, *, hidden: int, n_tokens: float) -> float:
        """Selective checkpointing keeps its two matmuls' outputs."""
        return n_tokens * (cls.up_width * hidden + s.cfg.d_model) * s.act

    @classmethod
    def validate(cls, m, prefix: str = "model") -> None:
        if m.ffn.hidden is not None and m.ffn.hidden <= 0:
            fail(f"{prefix}.ffn.hidden", m.ffn.hidden, "must be a positive number (or null for the default)")
        if m.ffn.multiple_of is None or m.ffn.multiple_of <= 0:
            fail(f"{prefix}.ffn.multiple_of", m.ffn.multiple_of, "must be a positive number")
        if not 0.0 <= m.ffn.dropout < 1.0:
            fail(f"{prefix}.ffn.dropout", m.ffn.dropout, "must lie in [0, 1)")


GELU_FORMS = ("tanh", "none")  # ffn.approximate: torch's F.gelu(approximate=...)


@FFNS.register("gelu")
class GeluMLP(FFN):
    """down(gelu(up(x))): GPT-2/3's MLP. ``ffn.approximate``: tanh, the tanh approximation as in GPT-2
    (default), or none, the exact x * Phi(x) with erf (BERT, GPT-NeoX). Either keeps its input and output
    (2F per token); the activation is elementwise and counts no FLOPs."""

    options = FFN.options | {"approximate"}

    @staticmethod
    def activate(h: Tensor) -> Tensor:
        return F.gelu(h, approximate="tanh")

    @classmethod
    def activation(cls, cfg: "ModelConfig") -> Callable[[Tensor], Tensor]:
        return cls.activate if cfg.ffn.approximate == "tanh" else partial(F.gelu, approximate="none")

    @classmethod
    def validate(cls, m, prefix: str = "model") -> None:
        super().validate(m, prefix)
        if m.ffn.approximate not in GELU_FORMS:
            fail(f"{prefix}.ffn.approximate", m.ffn.approximate,
                 f"must be one of {', '.join(GELU_FORMS)} (tanh: the tanh approximation; none: exact, with erf)")


@FFNS.register("relu")
class ReluMLP(FFN):
    """down(relu(up(x))): the 2017 Transformer's position-wise FFN. Its output serves as the
    saved tensor of both the relu and the down projection (F per token)."""

    hidden_saved = 1

    @staticmethod
    def activate(h: Tensor) -> Tensor:
        return F.relu(h)


@FFNS.register("swiglu")
class SwiGLU(FFN):
    """down(silu(gate(x)) * up(x)) (Shazeer 2020; LLaMA). Gate and up share one GEMM ([gate; up]
    rows of ``up``); keeps [gate; up], silu(gate) and the product (4F per token)."""

    options = FFN.options | {"multiple_of"}  # rounds the default hidden width (ffn.hidden null)
    up_name = "gate_up"  # [gate; up] rows
    up_width = 2
    hidden_saved = 4

    @staticmethod
    def activate(h: Tensor) -> Tensor:
        gate, up = h.chunk(2, dim=-1)
        return F.silu(gate) * up

    @staticmethod
    def default_hidden(cfg: "ModelConfig") -> int:
        h, mult = int(2 * 4 * cfg.d_model / 3), cfg.ffn.multiple_of
        return mult * ((h + mult - 1) // mult)


def ffn_class(cfg: "ModelConfig") -> type[FFN]:
    return FFNS.get(cfg.ffn.type)


def build_ffn(cfg: "ModelConfig", *, hidden: int, expert: bool = False) -> FFN:
    return ffn_class(cfg)(cfg, hidden=hidden, expert=expert)
