"""Routed experts stored as stacked 3-D weights, and the token dispatch that feeds them.

Shape legend: N tokens, D model dim, E experts, K experts per token, F expert hidden dim,
S = N*K token-slots (slot n*K + k: token n's k-th choice), C capacity or largest expert load,
R expert-major rows (the slots as the experts see them, grouped by expert).

Dispatch without a Python loop over experts: the S slots are sorted by expert id (stable), the
tokens gathered into that expert-major order, every expert's rows multiplied by its own weights
in one batched GEMM per projection, the rows gathered back into slot order and each token's K
outputs summed with its gate weights. Both gathers know their inverse (each slot has at most
one row and each row at most one slot), so their backward passes are gathers too: no
scatter-add anywhere. Two batched forms of the GEMMs:

- grouped: ``torch.nn.functional.grouped_mm`` over the sorted rows with per-expert offsets (no
  padding); used on CUDA (bf16: under autocast too, see below), on single-threaded CPU, on CPU
  when padding would be large, and always while compiling;
- padded: the rows placed on an (E, C, D) grid, C = the largest expert load, one ``bmm``; on
  multi-threaded CPU (where grouped_mm is a loop of mm, one parallel region each) it is the
  faster one while padding stays moderate, and it serves every dtype and width grouped_mm has
  no kernel for.

Under ``torch.compile`` no shape may depend on the routing (reading a load on the host is a
graph break, and a shape it sets is data-dependent). Every index tensor here is sized by N, K, E
and C alone (dropped slots and padding rows are kept as rows that are computed and never read),
so only two choices read the loads, and both become static while compiling
(``GroupedExperts.layout``): the rows are always packed (R = N*K, or E*C when capacity keeps
fewer), and the grouped matmul runs as torch's grouped_mm where it has a kernel, elsewhere
(odd widths; CUDA outside bf16) as the opaque op ``archlab::grouped_mm``, which pads each group
to the step's real largest load inside itself (see ``compilable_grouped_mm``): E times the
largest load rows, never E*N. Only an explicit ``mode = "padded"`` keeps the static grid (C = the
capacity, or N when dropless).

Mixed precision: autocast lowers matmul-type ops only, and grouped_mm is not one of them, so
under autocast the routed rows and the expert weights are cast to autocast's dtype here
(``expert_dtype``), as torchtitan and OLMo-core do before their grouped GEMMs: the experts then
run in bf16 on every path, and on CUDA the bf16 grouped GEMM is the one taken.

Host reads of the routing ("host syncs": each stalls an asynchronous device until the GPU has
caught up) happen only where they cost nothing or buy a smaller grid: on CPU (the eager choice
between grouped and padded, and skipping dropped slots' rows), and where grouped_mm has no kernel
(the eager padded grid, the opaque op's fallback: one read each). The CUDA bf16 path reads nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from archlab.nn.ffn import FFNS
from archlab.nn.moe.balance import expert_counts


def expert_params(kind: str, d_model: int, hidden: int) -> int:
    """Parameters of one expert of ``ffn.type`` ``kind`` (no biases): its FFN class says the width."""
    return (FFNS.get(kind).up_width + 1) * d_model * hidden


@dataclass
class Dispatch:
    """The router's choices as slots sorted by expert, after capacity dropping. Shapes depend on
    N, K and E only, never on the routing."""

    slot_S: Tensor  # all N*K slots (n*K + k): the kept ones grouped by expert (expert 0's first, token
    #                 order inside), then the dropped ones
    counts_E: Tensor  # kept slots per expert (sums to N*K - dropped)
    dropped: Tensor  # scalar int64: slots dropped over capacity
    weights_NK: Tensor  # gate weights; a dropped slot contributes nothing
    capacity: Optional[int] = None  # C: kept slots per expert at most; None when dropless

    @property
    def top_k(self) -> int:
        return self.weights_NK.shape[1]

    def dropped_NK(self) -> Tensor:
        """bool (N, K): which slots capacity dropped (all False when dropless). The dropped slots
        are the last ``dropped`` entries of ``slot_S``; computed without reading a count on the
        host, so a compiled forward may ask for it."""
        N, K = self.weights_NK.shape
        mask_S = torch.zeros(N * K, dtype=torch.bool, device=self.slot_S.device)
        if self.capacity is None:
            return mask_S.view(N, K)
        pos_P = torch.arange(N * K, device=self.slot_S.device)
        return mask_S.index_put((self.slot_S,), pos_P >= N * K - self.dropped).view(N, K)


def dispatch(experts_NK: Tensor, weights_NK: Tensor, num_experts: int, capacity: Optional[int]) -> Dispatch:
    """Sort the N*K slots by expert; with a ``capacity`` C, keep only each expert's first C slots.

    Priority when dropping is token order: slot n*K + k comes before slot m*K + j when n < m (the
    stable sort keeps that order inside each expert), so later tokens of the batch drop first.
    The dropped slots are moved behind the kept ones rather than cut off, so that no length
    depends on how many drop.
    """
    expert_S = experts_NK.reshape(-1)
    slot_S = torch.argsort(expert_S, stable=True)
    counts_E = expert_counts(expert_S, num_experts)
    dropped = counts_E.new_zeros(())
    if capacity is not None:
        rank_S = torch.arange(slot_S.numel(), device=slot_S.device) - _starts(counts_E)[expert_S[slot_S]]
        slot_S = slot_S[torch.argsort((rank_S >= capacity).to(torch.int8), stable=True)]  # kept first, same order
        kept_E = counts_E.clamp(max=capacity)
        dropped = counts_E.sum() - kept_E.sum()
        counts_E = kept_E
    return Dispatch(slot_S, counts_E, dropped, weights_NK, capacity)


def _starts(counts_E: Tensor) -> Tensor:
    return torch.cumsum(counts_E, 0) - counts_E


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


def expert_dtype(x: Tensor) -> torch.dtype:
    """The dtype the expert matmuls run in: autocast's where autocast is on for ``x``'s device
    (it lowers matmul-type ops only, and grouped_mm is not one of them), else ``x``'s own."""
    device = x.device.type
    if x.is_floating_point() and torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return x.dtype


def _grouped_mm_ok(x: Tensor, w: Tensor) -> bool:
    """grouped_mm has kernels on CPU (fp32, bf16, fp16) and on CUDA for bf16 (SM80+); rows of
    both operands must be a multiple of 16 bytes long."""
    return _has_kernel(x, w.shape[1:])


def _has_kernel(x: Tensor, widths) -> bool:
    """Whether grouped_mm has a kernel for ``x``'s dtype and device with rows ``widths`` long."""
    if not hasattr(F, "grouped_mm") or any(n * x.element_size() % 16 for n in widths):
        return False
    if x.device.type == "cpu":
        return x.dtype in (torch.float32, torch.bfloat16, torch.float16)
    return x.device.type == "cuda" and x.dtype == torch.bfloat16


@torch.library.custom_op("archlab::grouped_mm", mutates_args=())
def compilable_grouped_mm(a: Tensor, b: Tensor, offs: Tensor) -> Tensor:
    """``F.grouped_mm(a, b, offs=offs)`` as an op torch.compile treats as opaque: torch's own fake
    (meta) grouped_mm accepts bf16 only, as its CUDA kernel does, so an fp32 or fp16 grouped_mm
    (which has CPU kernels) cannot be traced. Forms: (R, X) x (E, X, Y) -> (R, Y), differentiable;
    (X, R) x (R, Y) -> (E, X, Y), the weight gradient. Where grouped_mm has no kernel (the dtype,
    the device or the widths) it runs :func:`padded_grouped_mm` instead: same result."""
    if _has_kernel(a, (a.shape[1] if b.dim() == 3 else a.shape[0], b.shape[-1])):
        return F.grouped_mm(a, b, offs=offs)
    return padded_grouped_mm(a, b, offs)


def padded_grouped_mm(a: Tensor, b: Tensor, offs: Tensor) -> Tensor:
    """grouped_mm's result (both forms of :func:`compilable_grouped_mm`) from one ``bmm`` on an
    (E, C) grid, C = the largest group, read here on the host. Inside the opaque op that read
    breaks no compiled graph, so a compiled layer pads to E * (real largest load), never E * N.
    Rows beyond ``offs[-1]`` belong to no group: zero in the output, left out of the sums."""
    ends_E = offs.long()
    counts_E = torch.diff(ends_E, prepend=ends_E.new_zeros(1))
    E, C = counts_E.numel(), max(int(counts_E.max()), 1)
    a_RX = a if b.dim() == 3 else a.t()
    pos_R = torch.arange(a_RX.shape[0], device=a.device)
    group_R = torch.searchsorted(ends_E, pos_R, right=True)  # E beyond offs[-1]
    start_R = (ends_E - counts_E)[group_R.clamp(max=E - 1)]
    cell_R = torch.where(group_R < E, group_R * C + pos_R - start_R, E * C)  # E * C: a spare cell, cut off

    def to_grid(t_RX: Tensor) -> Tensor:
        grid = t_RX.new_zeros(E * C + 1, t_RX.shape[1]).index_copy(0, cell_R, t_RX)
        return grid[:-1].view(E, C, -1)

    if b.dim() == 3:
        y_ECY = torch.bmm(to_grid(a_RX), b)
        return torch.cat([y_ECY.flatten(0, 1), y_ECY.new_zeros(1, y_ECY.shape[-1])]).index_select(0, cell_R)
    return torch.bmm(to_grid(a_RX).transpose(1, 2), to_grid(b))


@compilable_grouped_mm.register_fake
def _(a: Tensor, b: Tensor, offs: Tensor) -> Tensor:
    if b.dim() == 3:
        return a.new_empty(a.shape[0], b.shape[-1])
    return a.new_empty(offs.shape[0], a.shape[0], b.shape[-1])


def _grouped_mm_setup(ctx, inputs, output) -> None:
    a, b, offs = inputs
    ctx.save_for_backward(a, b, offs)


def _grouped_mm_backward(ctx, g_RY: Tensor):
    """The gradients torch's own grouped_mm backward computes (bit-for-bit on CPU), as grouped_mms."""
    a_RX, b_EXY, offs = ctx.saved_tensors
    g_RY = g_RY.contiguous()
    ga = compilable_grouped_mm(g_RY, b_EXY.transpose(-2, -1), offs) if ctx.needs_input_grad[0] else None
    gb = compilable_grouped_mm(a_RX.t(), g_RY, offs) if ctx.needs_input_grad[1] else None
    return ga, gb, None


compilable_grouped_mm.register_autograd(_grouped_mm_backward, setup_context=_grouped_mm_setup)


def grouped_linear(x_SX: Tensor, w_EXY: Tensor, counts_E: Tensor) -> Tensor:
    """Rows of ``x_SX`` grouped by expert (``counts_E`` rows each, in order) times their expert's
    (X, Y) matrix -> (S, Y), with one ``grouped_mm``. Compiled outside bf16, or where grouped_mm
    has no kernel, it runs as :func:`compilable_grouped_mm` (the same kernel or its padded
    fallback, traceable); eager keeps torch's op."""
    offs_E = torch.cumsum(counts_E, 0).to(torch.int32)
    if torch.compiler.is_compiling() and not (x_SX.dtype == torch.bfloat16 and _grouped_mm_ok(x_SX, w_EXY)):
        return compilable_grouped_mm(x_SX, w_EXY, offs_E)
    return _ContiguousGrad.apply(F.grouped_mm(x_SX, w_EXY, offs=offs_E))


@dataclass
class RowLayout:
    """Where slots sit among the experts' rows, and back.

    ``slot_R``: the slot each row holds (N*K for a padding row); ``row_S``: the row each slot
    went to (R for a dropped slot). Packed: the kept slots, then padding rows up to a static
    R = min(N*K, E*C) (C the capacity; R = N*K when dropless); eager on CPU, where reading the
    dropped count on the host costs nothing, R = the kept slots. Padded: R = E*C, expert e's
    rows are e*C ... e*C + C - 1."""

    slot_R: Tensor
    row_S: Tensor
    capacity: Optional[int]  # C of the padded grid; None when packed
    rows_E: Optional[Tensor] = None  # packed: rows per expert for grouped_mm, the padding rows in the last
    # known from the configuration, not read from the data: whether row_S may hold R (slots can drop)
    # and slot_R may hold N*K (a grid, or the rows of dropped slots)
    may_drop: bool = False
    has_padding: bool = False


def row_layout(d: Dispatch, padded: bool, capacity: Optional[int] = None) -> RowLayout:
    """Packed or padded rows; a padded grid has ``capacity`` rows per expert (default: the
    largest expert load, read on the host: eager only), which must hold every kept slot."""
    n_slots = d.slot_S.numel()
    dev = d.slot_S.device
    pos_P = torch.arange(n_slots, device=dev)  # position in slot_S order
    rows_E = None
    if padded:
        E = d.counts_E.numel()
        C = capacity if capacity is not None else max(int(d.counts_E.max()), 1)
        ends_E = torch.cumsum(d.counts_E, 0)
        expert_P = torch.searchsorted(ends_E, pos_P, right=True)  # expert of each kept slot, E for a dropped one
        rank_P = pos_P - (ends_E - d.counts_E)[expert_P.clamp(max=E - 1)]  # place in its expert's queue
        R = E * C
        row_P = torch.where(expert_P < E, expert_P * C + rank_P, R)
    elif d.capacity is not None and dev.type == "cpu" and not torch.compiler.is_compiling():
        # eager on CPU: the dropped slots get no row at all, so no expert compute is spent on them (the
        # host read is free here; on an asynchronous device it would stall every MoE layer)
        C, R = None, n_slots - int(d.dropped)
        row_P = torch.where(pos_P < R, pos_P, R)
        rows_E = d.counts_E
    else:  # static rows: dropless, compiled, or not on CPU. At most E*C slots are kept
        C, R = None, n_slots if d.capacity is None else min(n_slots, d.counts_E.numel() * d.capacity)
        kept = n_slots - d.dropped
        row_P = torch.where(pos_P < kept, pos_P, R)  # a dropped slot gets no row...
        rows_E = torch.cat([d.counts_E[:-1], d.counts_E[-1:] + (R - kept)])  # ...spare rows pad the last expert
    slot_R = torch.full((R + 1,), n_slots, dtype=d.slot_S.dtype, device=dev)
    slot_R[row_P] = d.slot_S  # dropped slots all land on row R, cut off next
    row_S = torch.full((n_slots,), R, dtype=d.slot_S.dtype, device=dev)
    row_S[d.slot_S] = row_P
    may_drop = d.capacity is not None
    return RowLayout(slot_R[:R], row_S, C, rows_E, may_drop=may_drop, has_padding=padded or may_drop)


class _GatherRows(torch.autograd.Function):
    """out = [x; 0][index]: rows of ``x`` (index = len(x) picks a zero row). Its backward is the
    gather ``[g; 0][inverse]`` summed over groups of ``fold`` consecutive rows, exact when each
    row of x is picked by at most ``fold`` outputs whose positions ``inverse`` lists. The zero row
    is there when ``zero_in`` (forward) or ``zero_back`` (backward) says an index may need it."""

    @staticmethod
    def forward(ctx, x: Tensor, index: Tensor, inverse: Tensor, fold: int, zero_in: bool, zero_back: bool) -> Tensor:
        ctx.save_for_backward(inverse)
        ctx.fold, ctx.zero_back = fold, zero_back
        return _take_rows(x, index, zero_in)

    @staticmethod
    def backward(ctx, g: Tensor):
        (inverse,) = ctx.saved_tensors
        gx = _take_rows(g.contiguous(), inverse, ctx.zero_back)
        if ctx.fold > 1:
            gx = gx.view(-1, ctx.fold, gx.shape[-1]).sum(dim=1)
        return gx, None, None, None, None, None


def _take_rows(x: Tensor, index: Tensor, zero_row: bool) -> Tensor:
    """x[index] where index == len(x) means a zero row (appended when ``zero_row``: known from
    the layout, since asking the index on the host would break a compiled graph)."""
    if zero_row:
        x = torch.cat([x, x.new_zeros(1, x.shape[-1])])
    return torch.index_select(x, 0, index)


def to_rows(x_ND: Tensor, layout: RowLayout, top_k: int) -> Tensor:
    """Token features -> expert-major rows (R, D). A padding row copies token 0: its output is
    never read and its gradient is zero (``from_rows``), so it adds nothing to any gradient."""
    token_R = torch.where(layout.slot_R < layout.row_S.numel(), layout.slot_R // top_k, 0)
    return _GatherRows.apply(x_ND, token_R, layout.row_S, top_k, False, layout.may_drop)


def from_rows(y_RD: Tensor, layout: RowLayout, weights_NK: Tensor) -> Tensor:
    """Expert-major rows -> per token, the gate-weighted sum of its K slots' outputs (N, D)."""
    N, K = weights_NK.shape
    y_NKD = _GatherRows.apply(y_RD, layout.row_S, layout.slot_R, 1, layout.may_drop, layout.has_padding).view(N, K, -1)
    return (y_NKD * weights_NK.unsqueeze(-1).to(y_NKD.dtype)).sum(dim=1)


class GroupedExperts(nn.Module):
    """E feed-forward experts as two stacked weights: w_up (E, D, u*F), w_down (E, F, D), where
    u = 2 for SwiGLU ([gate; up], as archlab.nn.ffn.SwiGLU) and 1 for GELU/ReLU. No biases."""

    def __init__(self, kind: str, num_experts: int, d_model: int, hidden: int, act=None):
        super().__init__()
        ffn = FFNS.get(kind)  # the expert math is the dense FFN's: its up-projection width and activation
        width, self.act = ffn.up_width, act or ffn.activate  # act: the config's form (FFN.activation(cfg))
        self.kind, self.num_experts, self.hidden = kind, num_experts, hidden
        self.w_up = nn.Parameter(torch.empty(num_experts, d_model, width * hidden))
        self.w_down = nn.Parameter(torch.empty(num_experts, hidden, d_model))
        self.mode = "auto"  # auto | grouped | padded (grouped needs grouped_mm: else padded)
        self.max_padding = 2.0  # auto on multi-threaded CPU: padded while E*C <= this * kept slots

    @torch.no_grad()
    def init_weights(self, std: float, residual_std: float) -> None:
        nn.init.normal_(self.w_up, 0.0, std)
        nn.init.normal_(self.w_down, 0.0, residual_std)

    def forward(self, x_ND: Tensor, d: Dispatch) -> Tensor:
        """Each kept slot's expert output times its gate weight, summed per token -> (N, D), in
        the experts' dtype (:func:`expert_dtype`: bf16 under bf16 autocast, as a Linear's)."""
        x_ND = x_ND.to(expert_dtype(x_ND))  # before the gather: N rows cast, not N*K
        layout = self.layout(x_ND, d)
        x_RD = to_rows(x_ND, layout, d.top_k)
        return from_rows(self.rows_forward(x_RD, layout.rows_E, layout.capacity), layout, d.weights_NK)

    def layout(self, x_ND: Tensor, d: Dispatch) -> RowLayout:
        """Packed rows for grouped_mm, or the padded grid: of the largest load in eager, of a
        static C while compiling in ``padded`` mode (the capacity; dropless: N, every token on one
        expert)."""
        if self._use_grouped_mm(x_ND, d):
            return row_layout(d, padded=False)
        if not torch.compiler.is_compiling():
            return row_layout(d, padded=True)
        return row_layout(d, padded=True, capacity=d.capacity if d.capacity is not None else d.weights_NK.shape[0])

    def rows_forward(self, x_RD: Tensor, counts_E: Tensor, capacity: Optional[int]) -> Tensor:
        """The experts on expert-major rows: packed (grouped_mm with ``counts_E`` rows each) or an
        (E, C) grid (bmm) when ``capacity`` C is given. Rows and weights run in
        :func:`expert_dtype` (the weights follow the rows' dtype: bf16 copies under bf16 autocast)."""
        x_RD = x_RD.to(expert_dtype(x_RD))
        w_up, w_down = self.w_up.to(x_RD.dtype), self.w_down.to(x_RD.dtype)
        if capacity is None:
            return grouped_linear(self.act(grouped_linear(x_RD, w_up, counts_E)), w_down, counts_E)
        x_ECD = x_RD.view(-1, capacity, x_RD.shape[-1])
        return torch.bmm(self.act(torch.bmm(x_ECD, w_up)), w_down).flatten(0, 1)

    def _use_grouped_mm(self, x_ND: Tensor, d: Dispatch) -> bool:
        """Which batched form runs. Measured on a 2-core CPU, fwd+bwd of one layer (B*S = 2048):
        one thread: grouped 10-25% faster (no padding work); two threads: the padded bmm
        1.3-3x faster (one parallel region instead of one per expert), while padding is small.
        While compiling, always packed (the padding ratio is data, and a static grid would be E/K
        times the packed rows): grouped_mm, or where it has no kernel the opaque op's grid padded
        to the real largest load (:func:`padded_grouped_mm`)."""
        if self.mode == "padded":
            return False
        if torch.compiler.is_compiling():
            return True
        if not (_grouped_mm_ok(x_ND, self.w_up) and _grouped_mm_ok(x_ND, self.w_down)):
            return False
        if self.mode == "grouped" or x_ND.device.type != "cpu" or torch.get_num_threads() == 1:
            return True
        kept = int(d.counts_E.sum())
        return self.num_experts * int(d.counts_E.max()) > self.max_padding * max(kept, 1)
