"""Dense feed-forward blocks, by ``ffn.type``: ``gelu`` (GPT MLP) and ``swiglu`` (LLaMA).

Shape legend: N tokens (any leading dims), D model dim, F hidden dim.
The same classes are the routed and shared experts' reference math in ``archlab.nn.moe``.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from archlab.registry import Registry

FFNS: Registry = Registry("ffn")


@FFNS.register("gelu")
class GeluMLP(nn.Module):
    """down(gelu(up(x))): GPT-2/3's MLP, tanh-approximated GELU as in GPT-2."""

    def __init__(self, d_model: int, hidden: int, bias: bool = True, dropout: float = 0.0):
        super().__init__()
        self.up = nn.Linear(d_model, hidden, bias=bias)
        self.down = nn.Linear(hidden, d_model, bias=bias)
        self.down.is_residual_proj = True
        self.drop = nn.Dropout(dropout)

    @staticmethod
    def num_params(d_model: int, hidden: int, bias: bool) -> int:
        return 2 * d_model * hidden + ((hidden + d_model) if bias else 0)

    def forward(self, x_ND: Tensor) -> Tensor:
        return self.drop(self.down(F.gelu(self.up(x_ND), approximate="tanh")))


@FFNS.register("swiglu")
class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)) (Shazeer 2020; LLaMA). Gate and up share one GEMM."""

    def __init__(self, d_model: int, hidden: int, bias: bool = False, dropout: float = 0.0):
        super().__init__()
        self.hidden = hidden
        self.gate_up = nn.Linear(d_model, 2 * hidden, bias=bias)  # [gate; up]
        self.down = nn.Linear(hidden, d_model, bias=bias)
        self.down.is_residual_proj = True
        self.drop = nn.Dropout(dropout)

    @staticmethod
    def num_params(d_model: int, hidden: int, bias: bool) -> int:
        return 3 * d_model * hidden + ((2 * hidden + d_model) if bias else 0)

    def forward(self, x_ND: Tensor) -> Tensor:
        gate, up = self.gate_up(x_ND).chunk(2, dim=-1)
        return self.drop(self.down(F.silu(gate) * up))


def build_ffn(kind: str, d_model: int, hidden: int, bias: bool, dropout: float = 0.0) -> nn.Module:
    return FFNS.get(kind)(d_model, hidden, bias, dropout)


def ffn_params(kind: str, d_model: int, hidden: int, bias: bool) -> int:
    return FFNS.get(kind).num_params(d_model, hidden, bias)


@FFNS.register("relu")
class ReluMLP(GeluMLP):
    """down(relu(up(x))): the 2017 Transformer's position-wise FFN."""

    def forward(self, x_ND: Tensor) -> Tensor:
        return self.drop(self.down(F.relu(self.up(x_ND))))
