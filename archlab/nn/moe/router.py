"""MoE routers, by ``moe.router.type``: which K of the E routed experts each token visits, and
with which gate weights.

Shape legend: N tokens, D model dim, E routed experts, K experts per token, G expert groups.

- ``softmax_topk`` (Switch, Mixtral): p = softmax(logits); keep the K largest; with
  ``renormalize`` the K kept weights are divided by their sum, which equals Mixtral's "softmax over
  the K selected logits".
- ``sigmoid_topk`` (DeepSeek-V3): s = sigmoid(logits); keep the K largest; with ``renormalize``
  the K kept scores are divided by their sum.
- ``expert_choice`` (Zhou et al. 2022, ``archlab.nn.moe.expert_choice``): the other way round, each
  expert keeps its top-C tokens; a router's ``dispatch`` turns its choice into the experts' slots.

Both multiply the gate weights by ``route_scale``, support group-limited routing (experts split
into ``n_groups`` groups, only the best ``topk_groups`` groups per token are eligible) and the
auxiliary-loss-free selection bias: a per-expert bias (a buffer, not a parameter) is added to the
scores only to choose the experts; the gate weights use the unbiased scores (Wang et al. 2024).
Routing math runs in fp32 whatever the model dtype.

Benchmark-only switch (not a recipe key): ``router.force_uniform = True``, or ``with
uniform_routing(model):`` for every router of a model, replaces the top-k choice by a fixed
round-robin assignment, token n to experts (n*K + k) mod E for k < K, so every expert gets N*K/E
slots (within one when E does not divide N*K); groups and the selection bias are then ignored.
The gate weights stay the router's own scores at those experts (renormalised and scaled as
usual), so the gate, the balancing terms and the experts run the same operations (only the
small N x E top-k is skipped) and the assignment alone changes: ``tools.bench_moe --routing
uniform`` times expert dispatch apart from load imbalance (Megatron-Core's
``--moe-router-force-load-balancing`` serves the same purpose).

Each router class also states the bytes it keeps for backward (``saved_bytes``, read by
``archlab.costs.memory``); a router without that model raises there instead of being guessed.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Iterator, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from archlab.errors import fail
from archlab.nn.component import option_names
from archlab.nn.flags import flag_set
from archlab.nn.moe.experts import Dispatch, capacity_for, dispatch
from archlab.registry import Registry

if TYPE_CHECKING:
    from archlab.nn.component import ActShape
    from archlab.nn.moe.layer import MoEConfig

@dataclass
class RouterConfig:
    # expert_choice: each expert takes its top-C tokens (archlab/nn/moe/expert_choice.py; non-causal)
    type: str = "softmax_topk"  # softmax_topk (Mixtral, Switch) | sigmoid_topk (DeepSeek-V3) | expert_choice
    renormalize: bool = True  # renormalise the k selected weights to sum 1 (Mixtral: yes)
    route_scale: float = 1.0  # multiply the gate weights (DeepSeek-V3: 2.5)
    n_groups: int = 1  # group-limited routing: experts split into n_groups groups...
    topk_groups: int = 1  # ...of which the best topk_groups are kept per token
    jitter: float = 0.0  # multiplicative input jitter U(1-eps, 1+eps) in training (Switch)


ROUTERS: Registry = Registry("router")

FP32_BYTES = 4  # routing math runs in fp32
ID_BYTES = 8  # int64 expert ids


def _register(name: str):
    """Register a router class under ``name`` and give it that name."""

    def deco(cls):
        cls.name = name
        return ROUTERS.register(name)(cls)

    return deco


@dataclass
class Routing:
    """What a router decided for N tokens."""

    experts_NK: Tensor  # int64 expert ids, the K chosen experts per token
    weights_NK: Tensor  # fp32 gate weights of those experts
    probs_NE: Tensor  # fp32 router probabilities over all E experts (rows sum to 1): balancing losses, entropy
    logits_NE: Tensor  # fp32 raw router logits: z-loss
    chosen_NK: Optional[Tensor] = None  # bool: which slots the router filled (expert choice); None = all


class Router(nn.Module):
    """Shared part of the routers: the gate projection, the selection bias, jitter and groups.

    Built as ``Router(config, d_model=, moe=, causal=)``: its own config (``model.moe.router``) and its site, the
    model width, the MoE layer's config (experts, top-k, capacity, balancing) and whether the stack is causal.
    The static facts take the layer's config (``moe``). Subclasses define
    ``scores(logits_NE)`` (the values the top-k runs over and the gate weights come from),
    ``probs(scores_NE)`` (a distribution over experts for the balancing losses),
    ``group_score(scores_NGX)`` (how a group of experts is ranked in group-limited routing) and
    ``saved_bytes`` (what they keep for backward).
    """

    name = "router"  # the registry name, set by the registration
    # the keys of model.moe.router it reads: every router reads them all (groups, jitter, route scale)
    options: ClassVar[frozenset[str]] = option_names(RouterConfig)

    def __init__(self, config: RouterConfig, *, d_model: int, moe: "MoEConfig", causal: bool = True):
        super().__init__()
        r = config
        self.num_experts, self.top_k = moe.num_experts, moe.top_k
        self.renormalize, self.route_scale = r.renormalize, r.route_scale
        self.n_groups, self.topk_groups, self.jitter = r.n_groups, r.topk_groups, r.jitter
        self.gate = nn.Linear(d_model, moe.num_experts, bias=False)
        self.moe_cfg = moe
        # aux-loss-free balancing: selection bias, updated by archlab.nn.moe.balance_step
        if moe.balance.bias_update_rate > 0:
            self.register_buffer("expert_bias", torch.zeros(moe.num_experts, dtype=torch.float32))
        else:
            self.expert_bias = None
        self.force_uniform = False  # benchmark-only round-robin assignment: see uniform_routing()

    def _apply(self, fn, recurse: bool = True):
        """Keep the selection bias in fp32 through ``model.to(bfloat16)``: its sign steps of
        ~1e-3 would round away in bf16."""
        super()._apply(fn, recurse)
        if self.expert_bias is not None and self.expert_bias.dtype != torch.float32:
            self.expert_bias = self.expert_bias.float()
        return self

    @staticmethod
    def num_params(moe: "MoEConfig", *, d_model: int) -> int:
        return d_model * moe.num_experts  # the bias is a buffer, not a parameter

    @staticmethod
    def slots_per_token(moe: "MoEConfig") -> int:
        """Columns of ``Routing.experts_NK``: K (expert choice: E, one per expert that may take the token)."""
        return moe.top_k

    @staticmethod
    def experts_per_token(moe: "MoEConfig") -> float:
        """Expert passes per token (the FLOPs and active parameters): K."""
        return moe.top_k

    @staticmethod
    def kept_slots(moe: "MoEConfig", n_tokens: int) -> int:
        """Token-expert slots the experts compute for N tokens: N*K dropless, at most E*C with a capacity C
        (the memory model's upper bound: fewer when the routing is unbalanced)."""
        cap = capacity_for(n_tokens, moe)
        return n_tokens * moe.top_k if cap is None else min(n_tokens * moe.top_k, moe.num_experts * cap)

    @classmethod
    def gathered_slots(cls, moe: "MoEConfig", n_tokens: int) -> int:
        """Rows of the slot-indexed tensors the gate-weighted sum reads (its gates, indices, expert outputs)."""
        return cls.kept_slots(moe, n_tokens)

    def dispatch(self, r: Routing, n_tokens: int) -> Dispatch:
        """The slots sorted by expert, each expert's first C kept (capacity) or all (dropless)."""
        return dispatch(r.experts_NK, r.weights_NK, self.num_experts, capacity_for(n_tokens, self.moe_cfg))

    @classmethod
    def validate(cls, m, prefix: str = "model") -> None:
        """The router's rules on the ``model`` node ``m`` of an MoE recipe: groups that divide the
        experts and hold at least top_k of them, a positive route scale, jitter in [0, 1)."""
        e, key = m.moe, f"{prefix}.moe.router"
        r = e.router
        for name in ("n_groups", "topk_groups", "route_scale"):
            v = getattr(r, name)
            if v is None or v <= 0:
                fail(f"{key}.{name}", v, "must be a positive number")
        if e.num_experts % r.n_groups:
            fail(f"{key}.n_groups", r.n_groups, f"must divide num_experts ({e.num_experts})")
        if r.topk_groups > r.n_groups:
            fail(f"{key}.topk_groups", r.topk_groups, f"must be <= n_groups ({r.n_groups})")
        if r.topk_groups * (e.num_experts // r.n_groups) < e.top_k:
            fail(f"{key}.topk_groups", r.topk_groups,
                 f"the kept groups hold {r.topk_groups * (e.num_experts // r.n_groups)} experts, "
                 f"fewer than top_k={e.top_k}")
        if not 0.0 <= r.jitter < 1.0:
            fail(f"{key}.jitter", r.jitter, "must lie in [0, 1)")

    @classmethod
    def saved_bytes(cls, s: ActShape, *, probs_read: bool) -> float:
        """Bytes this router keeps for backward in one MoE layer for the micro-batch ``s`` (N =
        s.n tokens, s.act bytes per activation). ``probs_read``: whether an enabled balancing
        term reads ``Routing.probs_NE`` (else the graph behind it is freed in the forward)."""
        raise NotImplementedError(f"model.moe.router.type={cls.name!r}: no activation memory model; "
                                  f"define saved_bytes() on {cls.__name__} in archlab/nn/moe/router.py")

    @staticmethod
    def _shared_saved_bytes(s: ActShape) -> float:
        """What every top-k router of this module keeps besides its score function's own tensors:
        the chosen ids, the fp32 copy of the gate weight (for a non-fp32 model), the renormalised
        weights and their sum, the jitter noise. Group-limited routing (n_groups > 1) keeps
        nothing: its ranking only picks ids, and the graph behind them is freed as soon as the
        top-k indices are taken; so does the selection bias."""
        n, D, moe = s.n, s.cfg.d_model, s.cfg.moe
        E, K, f, r = moe.num_experts, moe.top_k, FP32_BYTES, moe.router
        total = n * K * ID_BYTES  # chosen expert ids
        if s.act != f:  # the gate runs in fp32 on an fp32 copy of its (D, E) weight
            total += D * E * f
        if r.renormalize:
            total += n * K * f + n * f  # gathered weights and their sum
        if r.jitter > 0:  # the noise; the gate then keeps the jittered copy instead of x
            total += n * D * s.act
        return total

    def scores(self, logits_NE: Tensor) -> Tensor:
        raise NotImplementedError

    def probs(self, scores_NE: Tensor) -> Tensor:
        raise NotImplementedError

    def group_score(self, scores_NGX: Tensor) -> Tensor:
        raise NotImplementedError

    def forward(self, x_ND: Tensor) -> Routing:
        if self.training and self.jitter > 0:  # Switch: multiplicative noise on the router input only
            x_ND = x_ND * torch.empty_like(x_ND).uniform_(1.0 - self.jitter, 1.0 + self.jitter)
        logits_NE = F.linear(x_ND.float(), self.gate.weight.float())
        scores_NE = self.scores(logits_NE)
        if self.force_uniform:
            experts_NK = uniform_assignment(x_ND.shape[0], self.num_experts, self.top_k, x_ND.device)
        else:
            choice_NE = scores_NE if self.expert_bias is None else scores_NE + self.expert_bias
            if self.n_groups > 1:
                choice_NE = self._limit_to_best_groups(choice_NE)
            experts_NK = torch.topk(choice_NE, self.top_k, dim=-1).indices
        weights_NK = scores_NE.gather(1, experts_NK)
        if self.renormalize:
            weights_NK = weights_NK / (weights_NK.sum(dim=-1, keepdim=True) + 1e-20)
        return Routing(experts_NK, weights_NK * self.route_scale, self.probs(scores_NE), logits_NE)

    def _limit_to_best_groups(self, choice_NE: Tensor) -> Tensor:
        """Mask (to -inf) the experts outside each token's ``topk_groups`` best groups."""
        N, E, G = choice_NE.shape[0], self.num_experts, self.n_groups
        group_NG = self.group_score(choice_NE.view(N, G, E // G))
        best_NG = torch.topk(group_NG, self.topk_groups, dim=-1).indices
        keep_NG = torch.zeros_like(group_NG, dtype=torch.bool).scatter_(1, best_NG, True)
        keep_NE = keep_NG.unsqueeze(-1).expand(N, G, E // G).reshape(N, E)
        return choice_NE.masked_fill(~keep_NE, float("-inf"))


@_register("softmax_topk")
class SoftmaxTopKRouter(Router):
    """p = softmax(logits) over all E experts; top-K of p (Switch, Mixtral). A group is ranked by
    its best expert (DeepSeek-V2's group-limited greedy routing)."""


    @classmethod
    def saved_bytes(cls, s, *, probs_read):
        # the softmax output (the scores, and the balancing probabilities themselves)
        return s.n * s.cfg.moe.num_experts * FP32_BYTES + cls._shared_saved_bytes(s)

    def scores(self, logits_NE: Tensor) -> Tensor:
        return torch.softmax(logits_NE, dim=-1)

    def probs(self, scores_NE: Tensor) -> Tensor:
        return scores_NE

    def group_score(self, scores_NGX: Tensor) -> Tensor:
        return scores_NGX.amax(dim=-1)


@_register("sigmoid_topk")
class SigmoidTopKRouter(Router):
    """s = sigmoid(logits), independent per expert; top-K of s (DeepSeek-V3). A group is ranked by
    the sum of its two best (biased) scores; the balancing losses use s normalised over experts."""


    @classmethod
    def saved_bytes(cls, s, *, probs_read):
        total = s.n * s.cfg.moe.num_experts * FP32_BYTES  # the sigmoid output
        if probs_read:  # the normaliser of the balancing probabilities (freed when no term reads them)
            total += s.n * FP32_BYTES
        return total + cls._shared_saved_bytes(s)

    def scores(self, logits_NE: Tensor) -> Tensor:
        return torch.sigmoid(logits_NE)

    def probs(self, scores_NE: Tensor) -> Tensor:
        return scores_NE / scores_NE.sum(dim=-1, keepdim=True)

    def group_score(self, scores_NGX: Tensor) -> Tensor:
        return scores_NGX.topk(min(2, scores_NGX.shape[-1]), dim=-1).values.sum(dim=-1)


def uniform_assignment(n_tokens: int, num_experts: int, top_k: int, device=None) -> Tensor:
    """(N, K) expert ids with token n on experts (n*K + k) mod E: slot s on expert s mod E, so
    the counts differ by at most one (none when E divides N*K); a token's K experts are distinct
    for K <= E."""
    return (torch.arange(n_tokens * top_k, device=device) % num_experts).view(n_tokens, top_k)


@contextmanager
def uniform_routing(model: nn.Module) -> Iterator[None]:
    """Benchmark-only: every router inside ``model`` routes round-robin (``force_uniform``)
    until the block exits, then returns to its previous setting."""
    with flag_set((m for m in model.modules() if isinstance(m, Router)), "force_uniform", True):
        yield


def router_class(cfg: Any) -> type[Router]:
    """The router class ``moe.router.type`` names, of an MoE layer's config or a model config's."""
    moe = getattr(cfg, "moe", None) or cfg
    return ROUTERS.get(moe.router.type)


def build_router(moe: "MoEConfig", *, d_model: int, causal: bool = True) -> Router:
    """The router of an MoE layer's config: its own config and its site."""
    return router_class(moe)(moe.router, d_model=d_model, moe=moe, causal=causal)
