"""The MoE feed-forward layer: router -> routed experts (+ always-on shared experts).

Shape legend: B batch, S sequence, N = B*S tokens, D model dim, E routed experts, K experts per
token, F expert hidden dim.

    y = sum_{i in topK(x)} g_i(x) * expert_i(x)  +  shared(x)

with the balancing terms of ``archlab.nn.moe.balance`` returned next to y as one scalar.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor, nn

from archlab.config.schema import ModelConfig
from archlab.nn.ffn import build_ffn, ffn_params
from archlab.nn.moe.balance import balance_losses, expert_counts
from archlab.nn.moe.experts import GroupedExperts, capacity_for, dispatch, expert_params
from archlab.nn.moe.router import Router, build_router
from archlab.nn.moe.stats import RoutingStats


class MoELayer(nn.Module):
    """Routed experts (fine-grained when many and small), ``n_shared_experts`` shared experts
    (one dense FFN of width n_shared * shared_hidden, as DeepSeekMoE), capacity dropping or
    dropless routing, balancing losses and routing statistics.

    ``dispatcher``: None runs all experts locally; expert-parallel wiring (archlab.parallel)
    sets a callable ``dispatcher(layer, x_ND, dispatch) -> y_ND`` that replaces the local
    expert computation. The model code itself knows nothing of any parallel library.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        m = cfg.moe
        self.moe = m
        self.router: Router = build_router(cfg.d_model, m)
        self.experts = GroupedExperts(cfg.ffn.type, m.num_experts, cfg.d_model, m.expert_hidden)
        shared = _shared_hidden(cfg)
        self.shared = build_ffn(cfg.ffn.type, cfg.d_model, shared, bias=False) if shared else None
        self.stats = RoutingStats(m.num_experts, m.top_k)
        # off while activation checkpointing runs a block's forward again in backward
        # (archlab.model.checkpointing): each training forward is recorded once
        self.record_stats = True
        self.dispatcher: Optional[Callable] = None
        self.init_weights(cfg.init_std, cfg.init_std)

    @staticmethod
    def num_params(cfg: ModelConfig) -> int:
        """All routed experts + shared experts + router (the selection bias is a buffer)."""
        m = cfg.moe
        return (m.num_experts * expert_params(cfg.ffn.type, cfg.d_model, m.expert_hidden)
                + _shared_params(cfg) + Router.num_params(cfg.d_model, m))

    @staticmethod
    def active_params(cfg: ModelConfig) -> int:
        """Parameters one token uses: K routed experts + shared experts + router."""
        m = cfg.moe
        return (m.top_k * expert_params(cfg.ffn.type, cfg.d_model, m.expert_hidden)
                + _shared_params(cfg) + Router.num_params(cfg.d_model, m))

    @torch.no_grad()
    def init_weights(self, std: float, residual_std: float) -> None:
        nn.init.normal_(self.router.gate.weight, 0.0, std)
        self.experts.init_weights(std, residual_std)
        if self.shared is not None:
            for lin in self.shared.modules():
                if isinstance(lin, nn.Linear):
                    nn.init.normal_(lin.weight, 0.0, residual_std if getattr(lin, "is_residual_proj", False) else std)

    def forward(self, x_BSD: Tensor) -> tuple[Tensor, Tensor]:
        """(B, S, D) -> ((B, S, D), scalar sum of the enabled balancing terms)."""
        B, S, D = x_BSD.shape
        x_ND = x_BSD.reshape(B * S, D)
        r = self.router(x_ND)
        d = dispatch(r.experts_NK, r.weights_NK, self.moe.num_experts, capacity_for(B * S, self.moe))
        y_ND = self.experts(x_ND, d) if self.dispatcher is None else self.dispatcher(self, x_ND, d)
        if self.shared is not None:
            y_ND = y_ND + self.shared(x_ND)
        terms = balance_losses(self.moe.balance, r.probs_NE, r.logits_NE, r.experts_NK, B)
        if self.training and self.record_stats:
            chosen_E = expert_counts(r.experts_NK, self.moe.num_experts)
            self.stats.record(chosen_E, d.counts_E, d.dropped, r.probs_NE, terms)
        aux = sum(terms.values()) if terms else x_BSD.new_zeros(())
        return y_ND.view(B, S, D), aux

    def enabled_terms(self) -> list[str]:
        b = self.moe.balance
        return [t for t, c in (("aux_loss", b.aux_loss_coeff), ("seq_aux_loss", b.seq_aux_loss_coeff),
                               ("z_loss", b.z_loss_coeff)) if c > 0]


def _shared_hidden(cfg: ModelConfig) -> int:
    m = cfg.moe
    return m.n_shared_experts * (m.shared_hidden if m.shared_hidden is not None else m.expert_hidden)


def _shared_params(cfg: ModelConfig) -> int:
    h = _shared_hidden(cfg)
    return ffn_params(cfg.ffn.type, cfg.d_model, h, False) if h else 0
