"""Router trace: what the router of one MoE layer decided for a few sampled tokens of one
training forward.

Shape legend: N tokens of the forward, T traced tokens, E experts, K experts per token.

A :class:`TraceBuffer` holds the token rows to trace (``index_T``) and, once a forward has run
with the layer's ``tracing`` flag on, for each of those tokens: the K chosen experts (after the
selection bias and group limiting: what the layer really used), their gate weights (renormalised
and route-scaled, as applied to the expert outputs), which of the K slots capacity dropped, and
the E raw router logits (fp32, before softmax or sigmoid). The capture is four ``index_select``
copies into these preallocated tensors, the way the routing statistics accumulate in place, so
a compiled forward traces it without a graph break and no value is read on the host until the
trainer collects it (``archlab.nn.moe.take_trace``). The buffers live for the run and are only
refilled, so under ``torch.compile`` tracing costs one more compiled variant (flag on), not a
recompilation per traced step.
"""

from __future__ import annotations

import torch
from torch import Tensor

from archlab.nn.moe.experts import Dispatch
from archlab.nn.moe.router import Routing


class TraceBuffer:
    """The trace of one layer for T tokens (allocated on ``index_T``'s device)."""

    def __init__(self, index_T: Tensor, num_experts: int, top_k: int):
        T, dev = index_T.numel(), index_T.device
        self.index_T = index_T.clone().long()
        self.experts_TK = torch.zeros(T, top_k, dtype=torch.int64, device=dev)
        self.weights_TK = torch.zeros(T, top_k, dtype=torch.float32, device=dev)
        self.dropped_TK = torch.zeros(T, top_k, dtype=torch.bool, device=dev)
        self.logits_TE = torch.zeros(T, num_experts, dtype=torch.float32, device=dev)
        self.captured = torch.zeros((), dtype=torch.bool, device=dev)

    def fits(self, index_T: Tensor, num_experts: int, top_k: int) -> bool:
        """Whether these buffers can take a trace of ``index_T``'s tokens (same count and device)."""
        return (self.index_T.shape == index_T.shape and self.index_T.device == index_T.device
                and self.logits_TE.shape[1] == num_experts and self.experts_TK.shape[1] == top_k)

    def reset(self, index_T: Tensor) -> None:
        """Trace ``index_T``'s tokens next; what an earlier forward left is cleared (expert -1)."""
        self.index_T.copy_(index_T)
        self.experts_TK.fill_(-1)
        for buf in (self.weights_TK, self.dropped_TK, self.logits_TE, self.captured):
            buf.zero_()

    @torch.no_grad()
    def capture(self, r: Routing, d: Dispatch) -> None:
        """Copy the routing of the traced tokens of one forward (detached: no gradient flows)."""
        idx = self.index_T
        self.experts_TK.copy_(r.experts_NK.index_select(0, idx))
        self.weights_TK.copy_(r.weights_NK.detach().index_select(0, idx))
        self.logits_TE.copy_(r.logits_NE.detach().index_select(0, idx))
        self.dropped_TK.copy_(d.dropped_NK().index_select(0, idx))
        self.captured.fill_(True)
