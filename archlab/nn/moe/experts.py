"""Routed experts stored as stacked 3-D weights, and the token dispatch that feeds them.

Shape legend: N tokens, D model dim, E experts, K experts per token, F expert hidden dim,
S = N*K token-slots (one per (token, chosen expert) pair), C capacity (slots one expert keeps).

Dispatch without a Python loop over experts: the S slots are sorted by expert id (stable), the
tokens gathered into that order, and every expert's rows multiplied by its own weights in one
batched GEMM per projection, then weighted by the gate and summed back into their tokens with
``index_add_``. Two batched forms:

- grouped: ``torch.nn.functional.grouped_mm`` over the sorted rows with per-expert offsets (no
  padding); used on CUDA (bf16) and on CPU when padding would be large;
- padded: the rows placed on an (E, C, D) grid, C = the largest expert load, one ``bmm``; on CPU
  (where grouped_mm is a loop of mm) it is the faster one while padding stays moderate, and it
  serves every dtype and width grouped_mm has no kernel for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def _swiglu(h: Tensor) -> Tensor:
    gate, up = h.chunk(2, dim=-1)
    return F.silu(gate) * up


# expert activation by ffn.type: (width of the up-projection in units of F, activation)
EXPERT_ACTIVATIONS: dict[str, tuple[int, Callable[[Tensor], Tensor]]] = {
    "swiglu": (2, _swiglu),  # up-projection is [gate; up], as archlab.nn.ffn.SwiGLU
    "gelu": (1, lambda h: F.gelu(h, approximate="tanh")),
    "relu": (1, F.relu),
}


def expert_params(kind: str, d_model: int, hidden: int) -> int:
    """Parameters of one expert (no biases)."""
    return (EXPERT_ACTIVATIONS[kind][0] + 1) * d_model * hidden


@dataclass
class Dispatch:
    """The token-slots sorted by expert, after capacity dropping."""

    token_S: Tensor  # token index of each kept slot, grouped by expert (expert 0's slots first)
    weight_S: Tensor  # gate weight of each kept slot
    counts_E: Tensor  # kept slots per expert (sums to the number of kept slots)
    dropped: Tensor  # scalar int64: slots dropped over capacity


def dispatch(experts_NK: Tensor, weights_NK: Tensor, num_experts: int, capacity: Optional[int]) -> Dispatch:
    """Sort the N*K slots by expert; with a ``capacity`` C, keep only each expert's first C slots.

    Priority when dropping is token order: slot n*K + k comes before slot m*K + j when n < m (the
    stable sort keeps that order inside each expert), so later tokens of the batch drop first.
    """
    K = experts_NK.shape[1]
    expert_S = experts_NK.reshape(-1)
    order_S = torch.argsort(expert_S, stable=True)
    counts_E = torch.bincount(expert_S, minlength=num_experts)
    if capacity is not None:
        sorted_expert_S = expert_S[order_S]
        start_E = torch.cumsum(counts_E, 0) - counts_E
        rank_S = torch.arange(order_S.numel(), device=order_S.device) - start_E[sorted_expert_S]
        keep_S = rank_S < capacity
        order_S = order_S[keep_S]
        kept_E = counts_E.clamp(max=capacity)
        dropped = counts_E.sum() - kept_E.sum()
        counts_E = kept_E
    else:
        dropped = counts_E.new_zeros(())
    return Dispatch(order_S // K, weights_NK.reshape(-1)[order_S], counts_E, dropped)


def capacity_for(n_tokens: int, moe) -> Optional[int]:
    """Slots one expert keeps: ceil(N*K/E * capacity_factor) (Megatron), at least min_capacity;
    None (dropless) when capacity_factor is null."""
    if moe.capacity_factor is None:
        return None
    c = math.ceil(n_tokens * moe.top_k / moe.num_experts * moe.capacity_factor)
    return max(c, moe.min_capacity)


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the incoming gradient contiguous: the CPU grouped_mm backward
    rejects stride-0 (expanded) gradients such as the one ``y.sum().backward()`` produces."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g: Tensor) -> Tensor:
        return g.contiguous()


def _grouped_mm_ok(x: Tensor, w: Tensor) -> bool:
    """grouped_mm has kernels on CPU (fp32, bf16, fp16) and on CUDA for bf16 (SM80+); rows of
    both operands must be a multiple of 16 bytes long."""
    if not hasattr(F, "grouped_mm") or any(n * x.element_size() % 16 for n in w.shape[1:]):
        return False
    if x.device.type == "cpu":
        return x.dtype in (torch.float32, torch.bfloat16, torch.float16)
    return x.device.type == "cuda" and x.dtype == torch.bfloat16


def grouped_linear(x_SX: Tensor, w_EXY: Tensor, counts_E: Tensor) -> Tensor:
    """Rows of ``x_SX`` grouped by expert (``counts_E`` rows each, in order) times their expert's
    (X, Y) matrix -> (S, Y), with one ``grouped_mm``."""
    offs_E = torch.cumsum(counts_E, 0).to(torch.int32)
    return _ContiguousGrad.apply(F.grouped_mm(x_SX, w_EXY, offs=offs_E))


def padded_layout(d: Dispatch, num_experts: int, n_tokens: int) -> tuple[Tensor, Tensor, int]:
    """The kept slots laid out as an (E, C) grid, C = the largest expert load: for each cell the
    token it holds (``n_tokens`` = an all-zero padding row) and its gate weight (0 for padding)."""
    E, C = num_experts, max(int(d.counts_E.max()), 1) if d.token_S.numel() else 1
    start_E = torch.cumsum(d.counts_E, 0) - d.counts_E
    expert_S = torch.repeat_interleave(torch.arange(E, device=d.token_S.device), d.counts_E)
    cell_S = expert_S * C + torch.arange(d.token_S.numel(), device=d.token_S.device) - start_E[expert_S]
    token_EC = torch.full((E * C,), n_tokens, dtype=d.token_S.dtype, device=d.token_S.device)
    token_EC[cell_S] = d.token_S
    weight_EC = d.weight_S.new_zeros(E * C).index_copy(0, cell_S, d.weight_S)
    return token_EC, weight_EC, C


class GroupedExperts(nn.Module):
    """E feed-forward experts as two stacked weights: w_up (E, D, u*F), w_down (E, F, D), where
    u = 2 for SwiGLU ([gate; up], as archlab.nn.ffn.SwiGLU) and 1 for GELU/ReLU. No biases."""

    def __init__(self, kind: str, num_experts: int, d_model: int, hidden: int):
        super().__init__()
        if kind not in EXPERT_ACTIVATIONS:
            raise ValueError(f"expert activation {kind!r} unknown; valid: {', '.join(sorted(EXPERT_ACTIVATIONS))}")
        width, self.act = EXPERT_ACTIVATIONS[kind]
        self.kind, self.num_experts, self.hidden = kind, num_experts, hidden
        self.w_up = nn.Parameter(torch.empty(num_experts, d_model, width * hidden))
        self.w_down = nn.Parameter(torch.empty(num_experts, hidden, d_model))
        # CPU: the padded bmm runs 1.5-3x faster than grouped_mm (a loop of mm there) as long as
        # padding to the largest expert load adds at most this factor of rows
        self.max_padding = 2.0

    @torch.no_grad()
    def init_weights(self, std: float, residual_std: float) -> None:
        nn.init.normal_(self.w_up, 0.0, std)
        nn.init.normal_(self.w_down, 0.0, residual_std)

    def forward(self, x_ND: Tensor, d: Dispatch) -> Tensor:
        """Each kept slot's expert output times its gate weight, summed per token -> (N, D)."""
        S, E = d.token_S.numel(), self.num_experts
        if _grouped_mm_ok(x_ND, self.w_up) and _grouped_mm_ok(x_ND, self.w_down):
            if x_ND.device.type != "cpu" or E * int(d.counts_E.max()) > self.max_padding * max(S, 1):
                return self._forward_grouped(x_ND, d)
        return self._forward_padded(x_ND, d)

    def _forward_grouped(self, x_ND: Tensor, d: Dispatch) -> Tensor:
        """Slots sorted by expert -> two grouped GEMMs -> weighted scatter-add into tokens."""
        x_SD = x_ND[d.token_S]
        h_SF = self.act(grouped_linear(x_SD, self.w_up, d.counts_E))
        y_SD = grouped_linear(h_SF, self.w_down, d.counts_E)
        y_SD = y_SD * d.weight_S.unsqueeze(-1).to(y_SD.dtype)
        return torch.zeros_like(x_ND).index_add_(0, d.token_S, y_SD)

    def _forward_padded(self, x_ND: Tensor, d: Dispatch) -> Tensor:
        """Slots on an (E, C) grid padded with a zero token -> two bmm -> weighted scatter-add."""
        N, D = x_ND.shape
        token_EC, weight_EC, C = padded_layout(d, self.num_experts, N)
        x_ECD = torch.cat([x_ND, x_ND.new_zeros(1, D)])[token_EC].view(self.num_experts, C, D)
        h_ECF = self.act(torch.bmm(x_ECD, self.w_up))
        y_ED = torch.bmm(h_ECF, self.w_down).view(-1, D) * weight_EC.unsqueeze(-1).to(x_ND.dtype)
        return x_ND.new_zeros(N + 1, D).index_add_(0, token_EC, y_ED)[:N]
