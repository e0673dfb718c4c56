"""Routing statistics of one MoE layer, accumulated over training forwards between two reads.

Shape legend: N tokens, E experts, K experts per token.

Everything is summed in one float64 vector so that a single all-reduce gives the global window:
[counts_E (kept slots per expert), tokens, dropped slots, entropy sum, forwards, term sums...].
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from archlab.nn.moe.balance import loss_term_names

TERMS = loss_term_names()  # every registered balancing term that adds a loss


class RoutingStats:
    """Accumulators of one layer. Not module state: they are not saved in checkpoints."""

    def __init__(self, num_experts: int, top_k: int):
        self.E, self.K = num_experts, top_k
        self.window = torch.zeros(num_experts + 4 + len(TERMS), dtype=torch.float64)
        self.step_counts_E = torch.zeros(num_experts, dtype=torch.float64)  # choices since the last optimizer step

    @torch.no_grad()
    def record(self, chosen_E: Tensor, kept_E: Tensor, dropped: Tensor, probs_NE: Tensor,
               terms: dict[str, Tensor]) -> None:
        """One training forward: router choices (before dropping), kept slots, dropped slots,
        router probabilities and the weighted balancing terms."""
        entropy = -(probs_NE * torch.log(probs_NE.clamp_min(1e-20))).sum()
        term_vals = [terms[t].detach() if t in terms else probs_NE.new_zeros(()) for t in TERMS]
        row = torch.cat([kept_E.double(), torch.stack([
            probs_NE.new_tensor(probs_NE.shape[0]), dropped.to(probs_NE.dtype), entropy, probs_NE.new_tensor(1.0),
            *term_vals]).double()])
        if self.window.device != row.device:
            self.window = self.window.to(row.device)
            self.step_counts_E = self.step_counts_E.to(row.device)
        self.window += row
        self.step_counts_E += chosen_E.double()

    def read(self, all_reduce_sum: Callable[[Tensor], Tensor], enabled_terms: list[str]) -> dict[str, float | list]:
        """Global statistics of the window (summed over ranks), then reset. Empty when no token
        was routed in training since the last read."""
        w = all_reduce_sum(self.window.clone())
        self.window.zero_()
        E, K = self.E, self.K
        counts_E = w[:E]
        tokens, dropped, entropy_sum, forwards = (float(v) for v in w[E:E + 4])
        if tokens == 0:
            return {}
        if int(round(counts_E.sum().item())) != int(round(tokens * K - dropped)):
            raise RuntimeError(f"routing bookkeeping broken: sum(counts)={counts_E.sum().item()} but "
                               f"tokens*K - dropped = {tokens * K - dropped}")
        mean = counts_E.mean()
        load_E = counts_E / counts_E.sum().clamp_min(1)
        out: dict[str, float | list] = {
            "tokens": tokens,
            "dropped_slots": dropped,
            "tokens_per_expert": [int(round(c)) for c in counts_E.tolist()],
            "load_fraction": load_E.tolist(),
            "maxvio": float((counts_E.max() - mean) / mean) if mean > 0 else 0.0,
            "cv": float(counts_E.std(unbiased=False) / mean) if mean > 0 else 0.0,
            "router_entropy": entropy_sum / tokens,
            "dropped_fraction": dropped / (tokens * K),
        }
        for i, t in enumerate(TERMS):
            if t in enabled_terms:
                out[t] = float(w[E + 4 + i]) / forwards
        return out

    def take_step_counts(self) -> Tensor:
        """Router choices per expert since the last optimizer step, then reset."""
        c = self.step_counts_E.clone()
        self.step_counts_E.zero_()
        return c
