"""Routing statistics of one MoE layer, accumulated over training forwards between two reads.

Shape legend: N tokens, E experts, K experts per token, L MoE layers.

Everything is summed in one float64 vector so that a single all-reduce gives the global window:
[counts_E (kept slots per expert), tokens, dropped slots, entropy sum, forwards, term sums...,
dropped tokens].

The window is what lies between two reads: the trainer reads at every routing record and every
metrics row (``train.routing_every``, ``train.log_every``), so "dead" and "dropped" below count
over those steps (``moe/window_steps`` in the record says how many).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import Tensor

from archlab.nn.moe.balance import loss_term_names

TERMS = loss_term_names()  # every registered balancing term that adds a loss
# percentiles of the per-layer MaxVio reported across layers (linear interpolation, numpy's default)
LAYER_PERCENTILES = (50, 90, 95)
# an expert whose kept slots in a window fall under this fraction of the uniform share (mean over experts),
# but not to zero, is starved: it trains on too few tokens to learn, though it is not dead
STARVED_FRACTION = 0.1


class RoutingStats:
    """Accumulators of one layer. Not module state: they are not saved in checkpoints."""

    def __init__(self, num_experts: int, top_k: int):
        self.E, self.K = num_experts, top_k
        self.window = torch.zeros(num_experts + 5 + len(TERMS), dtype=torch.float64)
        self.step_counts_E = torch.zeros(num_experts, dtype=torch.float64)  # choices since the last optimizer step

    @torch.no_grad()
    def record(self, chosen_E: Tensor, kept_E: Tensor, dropped: Tensor, probs_NE: Tensor,
               terms: dict[str, Tensor], dropped_tokens: Tensor | None = None) -> None:
        """One training forward: router choices (before dropping), kept slots, dropped slots,
        router probabilities, the weighted balancing terms and the tokens whose K slots were all
        dropped (None: none)."""
        entropy = -(probs_NE * torch.log(probs_NE.clamp_min(1e-20))).sum()
        term_vals = [terms[t].detach() if t in terms else probs_NE.new_zeros(()) for t in TERMS]
        lost = dropped_tokens.to(probs_NE.dtype) if dropped_tokens is not None else probs_NE.new_zeros(())
        row = torch.cat([kept_E.double(), torch.stack([
            probs_NE.new_tensor(probs_NE.shape[0]), dropped.to(probs_NE.dtype), entropy, probs_NE.new_tensor(1.0),
            *term_vals, lost]).double()])
        if self.window.device != row.device:
            self.window = self.window.to(row.device)
            self.step_counts_E = self.step_counts_E.to(row.device)
        self.window += row
        self.step_counts_E += chosen_E.double()

    def read(self, all_reduce_sum: Callable[[Tensor], Tensor], enabled_terms: list[str]) -> dict[str, float | list]:
        """Global statistics of the window (summed over ranks), then reset. Empty when no token
        was routed in training since the last read.

        Over the window's kept slots per expert c_e: ``tokens_per_expert`` (the list),
        ``tokens_per_expert_min`` / ``_max`` / ``_std`` (population std), ``dead_experts`` (experts
        with c_e = 0: no token routed to them in the whole window; a chosen expert always keeps
        its first slot, capacity >= 1, so this is also "never chosen") and ``dead_expert_ids``,
        ``starved_experts`` / ``starved_expert_ids`` (0 < c_e < :data:`STARVED_FRACTION` x mean c),
        ``maxvio`` = (max c - mean c) / mean c, ``cv`` = std / mean. Dropping: ``dropped_slots``
        (token-expert slots over capacity), ``dropped_fraction`` (of the tokens*K slots), ``dropped_tokens``
        (tokens that lost all K slots: only the residual and any shared experts carried them; 0 when dropless)."""
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
        std = counts_E.std(unbiased=False)
        load_E = counts_E / counts_E.sum().clamp_min(1)
        starved = [e for e, c in enumerate(counts_E.tolist()) if round(c) > 0 and c < STARVED_FRACTION * float(mean)]
        out: dict[str, float | list] = {
            "tokens": tokens,
            "dropped_slots": dropped,
            "tokens_per_expert": [int(round(c)) for c in counts_E.tolist()],
            "tokens_per_expert_min": int(round(float(counts_E.min()))),
            "tokens_per_expert_max": int(round(float(counts_E.max()))),
            "tokens_per_expert_std": float(std),
            "dead_experts": int((counts_E.round() == 0).sum()),
            "dead_expert_ids": [e for e, c in enumerate(counts_E.tolist()) if round(c) == 0],
            "starved_experts": len(starved),
            "starved_expert_ids": starved,
            "load_fraction": load_E.tolist(),
            "maxvio": float((counts_E.max() - mean) / mean) if mean > 0 else 0.0,
            "cv": float(std / mean) if mean > 0 else 0.0,
            "router_entropy": entropy_sum / tokens,
            "dropped_fraction": dropped / (tokens * K),
            "dropped_tokens": int(round(float(w[E + 4 + len(TERMS)]))),
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


def layer_percentiles(values: Sequence[float], name: str = "maxvio") -> dict[str, float]:
    """``{name}_p50``, ``_p90``, ``_p95`` and ``_max`` of one statistic over the MoE layers, with
    linear interpolation between order statistics (``torch.quantile``'s and numpy's default): for
    sorted v_0 <= ... <= v_{L-1}, the p-th percentile is v at position p/100 * (L - 1). Empty for
    no layers."""
    if not values:
        return {}
    v = torch.tensor([float(x) for x in values], dtype=torch.float64)
    q = torch.quantile(v, torch.tensor([p / 100 for p in LAYER_PERCENTILES], dtype=torch.float64))
    out = {f"{name}_p{p}": float(x) for p, x in zip(LAYER_PERCENTILES, q)}
    out[f"{name}_max"] = float(v.max())
    return out
