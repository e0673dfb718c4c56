"""The MoE feed-forward layer: router -> routed experts (+ always-on shared experts).

Shape legend: B batch, S sequence, N = B*S tokens, D model dim, E routed experts, K experts per
token, F expert hidden dim.

    y = sum_{i in topK(x)} g_i(x) * expert_i(x)  +  shared(x)

with the enabled balancing terms of ``archlab.nn.moe.balance`` (``BALANCE_TERMS``) returned next
to y as one scalar.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional

import torch
from torch import Tensor, nn

from archlab.nn.ffn import build_ffn, ffn_class
from archlab.nn.moe.balance import BalanceConfig, BalanceTerm, build_terms, expert_counts
from archlab.nn.moe.experts import GroupedExperts, capacity_for, dispatch, expert_params  # noqa: F401  (re-exported)
from archlab.nn.moe.router import Router, RouterConfig, build_router, router_class
from archlab.nn.moe.stats import RoutingStats
from archlab.nn.moe.trace import TraceBuffer

if TYPE_CHECKING:
    from archlab.config.schema import ModelConfig


@dataclass
class MoEConfig:
    num_experts: int = 8  # routed experts E
    top_k: int = 2  # K experts per token
    expert_hidden: int = 512  # hidden size of one routed expert (small = fine-grained)
    n_shared_experts: int = 0  # always-active experts (DeepSeekMoE)
    shared_hidden: Optional[int] = None  # hidden size of one shared expert; default expert_hidden
    first_k_dense: int = 0  # the first k layers keep a dense FFN
    every: int = 1  # after those, every n-th layer is MoE
    router: RouterConfig = field(default_factory=RouterConfig)
    balance: BalanceConfig = field(default_factory=BalanceConfig)
    capacity_factor: Optional[float] = None  # None = dropless; else tokens beyond capacity drop
    min_capacity: int = 4
    ep_size: int = 1  # expert-parallel degree (DeepSpeed); experts sharded over ep_size ranks


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
        # the router's own config and its site; an expert-choice router warns in a decoder-only model
        self.router: Router = build_router(m, d_model=cfg.d_model, causal=cfg.type == "decoder")
        self.experts = GroupedExperts(cfg.ffn.type, m.num_experts, cfg.d_model, m.expert_hidden,
                                      act=ffn_class(cfg).activation(cfg.ffn))
        shared = _shared_hidden(cfg)
        self.shared = build_ffn(cfg, hidden=shared, expert=True) if shared else None
        self.balance_terms: list[BalanceTerm] = build_terms(cfg)
        self.slots = router_class(m).slots_per_token(m)  # columns of the routing: K (expert choice: E)
        self.stats = RoutingStats(m.num_experts, self.slots)
        # off while activation checkpointing runs a block's forward again in backward
        # (archlab.model.checkpointing): each training forward is recorded once
        self.record_stats = True
        # router trace (archlab.nn.moe.start_trace): while ``tracing``, a training forward copies the routing
        # of the sampled tokens into ``trace``; off (the default) it costs one flag test per forward
        self.tracing = False
        self.trace: Optional[TraceBuffer] = None
        self.dispatcher: Optional[Callable] = None
        self.init_weights(cfg.init_std, cfg.init_std)

    @staticmethod
    def num_params(cfg: ModelConfig) -> int:
        """All routed experts + shared experts + router (the selection bias is a buffer)."""
        m = cfg.moe
        return (m.num_experts * expert_params(cfg.ffn.type, cfg.d_model, m.expert_hidden)
                + _shared_params(cfg) + router_class(m).num_params(m, d_model=cfg.d_model))

    @staticmethod
    def active_params(cfg: ModelConfig) -> int:
        """Parameters one token uses: K routed experts + shared experts + router."""
        m = cfg.moe
        passes = router_class(m).experts_per_token(m)  # K (expert choice: capacity_factor on average)
        return (round(passes * expert_params(cfg.ffn.type, cfg.d_model, m.expert_hidden))
                + _shared_params(cfg) + router_class(m).num_params(m, d_model=cfg.d_model))

    @staticmethod
    def forward_flops(cfg: ModelConfig) -> tuple[float, float]:
        """(experts, router) matmul FLOPs per token: K routed experts + the shared experts, each an FFN of
        ``ffn.type`` (the gate-weighted sum of the K outputs is elementwise and counts zero); router 2 * D * E."""
        m = cfg.moe
        ffn = ffn_class(cfg)
        shared_hidden = m.shared_hidden if m.shared_hidden is not None else m.expert_hidden
        experts = router_class(m).experts_per_token(m) * ffn.forward_flops(d_model=cfg.d_model, hidden=m.expert_hidden)
        experts += m.n_shared_experts * ffn.forward_flops(d_model=cfg.d_model, hidden=shared_hidden)
        return experts, 2.0 * cfg.d_model * m.num_experts

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
        d = self.router.dispatch(r, B * S)
        y_ND = self.experts(x_ND, d) if self.dispatcher is None else self.dispatcher(self, x_ND, d)
        if self.shared is not None:
            y_ND = y_ND + self.shared(x_ND)
        recomputing = self.training and not self.record_stats
        terms = {t.name: v for t in self.balance_terms
                 if (v := t.loss(r, B, training=self.training, recomputing=recomputing)) is not None}
        if self.training and self.record_stats:
            chosen_E = expert_counts(r.experts_NK, self.moe.num_experts)
            lost = d.dropped_NK().all(dim=1).sum() if d.capacity is not None else None  # tokens with no expert
            self.stats.record(chosen_E, d.counts_E, d.dropped, r.probs_NE, terms, lost)
            if self.tracing:
                self.trace.capture(r, d)
        aux = sum(terms.values()) if terms else x_BSD.new_zeros(())
        return y_ND.view(B, S, D), aux

    def enabled_terms(self) -> list[str]:
        """The names of the enabled balancing terms that add a loss."""
        return [t.name for t in self.balance_terms if t.adds_loss]


def _shared_hidden(cfg: ModelConfig) -> int:
    m = cfg.moe
    return m.n_shared_experts * (m.shared_hidden if m.shared_hidden is not None else m.expert_hidden)


def _shared_params(cfg: ModelConfig) -> int:
    h = _shared_hidden(cfg)
    return ffn_class(cfg).num_params(cfg.ffn, d_model=cfg.d_model, hidden=h, expert=True) if h else 0
