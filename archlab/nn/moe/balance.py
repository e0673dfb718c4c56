"""Load balancing of the routed experts: one registered class per balancing term, each on when its
recipe key (a ``model.moe.balance`` coefficient) is > 0.

Shape legend: B batch, S sequence, N = B*S tokens, E experts, K experts per token.

Every field of ``BalanceConfig`` is the key of exactly one class of ``BALANCE_TERMS``, and each
class says what the rest of archlab needs to know about its term (``archlab.nn.component``): its
key, its validation rule (:meth:`BalanceTerm.validate`), its loss on a router's decisions
(:meth:`BalanceTerm.loss`), what it does after an optimizer step (:meth:`BalanceTerm.after_step`)
and the bytes it keeps for backward per MoE layer (:meth:`BalanceTerm.saved_bytes`, read by
``archlab.costs.memory``). A term is built per MoE layer as ``Term(cfg)``, cfg the ``ModelConfig``.

==================  ======================  ===========================================================
name                key                     term
==================  ======================  ===========================================================
aux_loss            aux_loss_coeff          Switch auxiliary loss over the micro-batch's N tokens
global_aux_loss     global_aux_loss_coeff   Switch auxiliary loss, f from the step's global counts
seq_aux_loss        seq_aux_loss_coeff      DeepSeek-V3 sequence-wise auxiliary loss
z_loss              z_loss_coeff            ST-MoE router z-loss
expert_bias         bias_update_rate        aux-loss-free selection bias (no loss; a step update)
==================  ======================  ===========================================================

The normalisation of each term and what the global-batch loss makes exact: docs/methods/balancing.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, ClassVar, Optional

import torch
import torch.distributed as dist
from torch import Tensor

from archlab.errors import fail
from archlab.registry import Registry

if TYPE_CHECKING:
    from archlab.config.schema import ModelConfig
    from archlab.nn.component import ActShape
    from archlab.nn.moe.router import Router, Routing


@dataclass
class BalanceConfig:
    aux_loss_coeff: float = 0.0  # Switch-style auxiliary loss over the batch
    seq_aux_loss_coeff: float = 0.0  # DeepSeek-V3 sequence-wise auxiliary loss
    z_loss_coeff: float = 0.0  # ST-MoE router z-loss
    bias_update_rate: float = 0.0  # aux-loss-free balancing rate u (0 = off)
    # Switch aux loss from expert counts summed over the step's micro-batches and the data-parallel ranks
    # (Megatron-Core global_aux_loss; Qiu et al. 2025 "global-batch balance")
    global_aux_loss_coeff: float = 0.0


BALANCE_TERMS: Registry = Registry("balancing term")

FP32_BYTES = 4  # the routing math, and so every balancing term, runs in fp32


# ----------------------------------------------------------------------------- the quantities


def expert_counts(experts: Tensor, num_experts: int) -> Tensor:
    """int64 (E,): how many entries of ``experts`` (expert ids, any shape) name each expert.
    ``torch.bincount(experts, minlength=E)`` in value, but of a length fixed by E: bincount's
    length depends on the largest id, a data-dependent shape torch.compile cannot trace."""
    ids = experts.reshape(-1)
    return torch.zeros(num_experts, dtype=torch.int64, device=ids.device).scatter_add_(
        0, ids, torch.ones_like(ids, dtype=torch.int64))


def switch_loss(probs_NE: Tensor, f_E: Tensor) -> Tensor:
    """E * sum_i f_i P_i with given routed fractions ``f_E`` (not differentiated), P over N tokens."""
    return probs_NE.shape[1] * torch.dot(f_E.to(probs_NE.dtype), probs_NE.mean(dim=0))


def switch_aux_loss(probs_NE: Tensor, experts_NK: Tensor) -> Tensor:
    """E * sum_i f_i P_i over all N tokens (without the coefficient)."""
    N, E = probs_NE.shape
    K = experts_NK.shape[1]
    with torch.no_grad():
        f_E = expert_counts(experts_NK, E).to(probs_NE.dtype) / (K * N)
    return switch_loss(probs_NE, f_E)


def seq_aux_loss(probs_NE: Tensor, experts_NK: Tensor, batch: int) -> Tensor:
    """The Switch quantity per sequence (tokens laid out as (B, S)), averaged over sequences."""
    N, E = probs_NE.shape
    K, S = experts_NK.shape[1], N // batch
    with torch.no_grad():
        onehot_BSE = torch.zeros(batch, S, E, dtype=probs_NE.dtype, device=probs_NE.device)
        ones_BSK = torch.ones_like(experts_NK, dtype=probs_NE.dtype).view(batch, S, K)
        onehot_BSE.scatter_add_(2, experts_NK.view(batch, S, K), ones_BSK)
        f_BE = onehot_BSE.sum(dim=1) / (K * S)
    P_BE = probs_NE.view(batch, S, E).mean(dim=1)
    return E * (f_BE * P_BE).sum(dim=-1).mean()


def z_loss(logits_NE: Tensor) -> Tensor:
    """mean over tokens of logsumexp(logits)^2 (without the coefficient)."""
    return torch.logsumexp(logits_NE, dim=-1).square().mean()


@torch.no_grad()
def update_bias(bias_E: Tensor, counts_E: Tensor, rate: float) -> None:
    """Aux-loss-free step: b_i += u * sign(mean(c) - c_i) (under-loaded experts become more
    attractive), then re-centred to mean 0 as torchtitan does (a shift of all b changes no
    top-k choice, and keeps b bounded)."""
    c = counts_E.to(bias_E.dtype)
    bias_E.add_(rate * torch.sign(c.mean() - c))
    bias_E.sub_(bias_E.mean())


# ----------------------------------------------------------------------------- the terms


class BalanceTerm:
    """One balancing term of one MoE layer, built when its coefficient is > 0.

    Class attributes: ``name`` (the registry name, also the routing-statistics key), ``key`` (its
    ``BalanceConfig`` field), ``adds_loss`` (False for a term that only acts after a step) and
    ``reads_probs`` (whether its loss reads the router's probabilities, which then stay alive for
    backward). A subclass without a memory model inherits :meth:`saved_bytes`, which raises.
    """

    name: ClassVar[str] = ""  # set by the registration
    key: ClassVar[str] = ""
    adds_loss: ClassVar[bool] = True
    reads_probs: ClassVar[bool] = False

    def __init__(self, cfg: ModelConfig):
        m = cfg.moe
        self.coeff, self.num_experts, self.top_k = getattr(m.balance, self.key), m.num_experts, m.top_k

    @classmethod
    def validate(cls, m, prefix: str = "model") -> None:
        """This term's rules on the ``model`` node ``m`` of a recipe (an MoE model): its key >= 0."""
        value = getattr(m.moe.balance, cls.key)
        if not value >= 0:
            fail(f"{prefix}.moe.balance.{cls.key}", value, "must be >= 0")

    def loss(self, routing: Routing, batch: int, training: bool, recomputing: bool) -> Optional[Tensor]:
        """The coefficient-weighted loss of one forward, or None for a term without a loss.
        ``recomputing``: activation checkpointing runs this training forward a second time."""
        raise NotImplementedError(f"balancing term {self.name!r}: define loss()")

    def after_step(self, router: Router, counts_E: Tensor, all_reduce_sum: Callable[[Tensor], Tensor]) -> None:
        """After an optimizer step, with the router choices of that step on this rank (float64 (E,))."""

    def start_step(self) -> None:
        """Before the first micro-batch of an optimizer step."""

    @classmethod
    def saved_bytes(cls, s: ActShape) -> float:
        """Bytes this term keeps for backward in one MoE layer for the micro-batch ``s`` (B = s.batch
        sequences, N = s.n tokens), beyond the router's own (``Router.saved_bytes``)."""
        raise NotImplementedError(f"model.moe.balance.{cls.key} ({cls.name}): no activation memory model; "
                                  f"define saved_bytes() on {cls.__name__} in archlab/nn/moe/balance.py")


def _register(name: str):
    """Register a term class under ``name`` and give it that name."""

    def deco(cls: type[BalanceTerm]) -> type[BalanceTerm]:
        cls.name = name
        return BALANCE_TERMS.register(name)(cls)

    return deco


@_register("aux_loss")
class AuxLoss(BalanceTerm):
    """Switch auxiliary loss over the micro-batch's own N tokens."""

    key = "aux_loss_coeff"
    reads_probs = True

    def loss(self, routing, batch, training, recomputing):
        return self.coeff * switch_aux_loss(routing.probs_NE, routing.experts_NK)

    @classmethod
    def saved_bytes(cls, s):
        return s.cfg.moe.num_experts * FP32_BYTES  # the routed fractions f_i (the dot's other operand)


@_register("global_aux_loss")
class GlobalAuxLoss(BalanceTerm):
    """Switch auxiliary loss whose fractions f come from the counts summed over the micro-batches
    of the optimizer step so far and over the data-parallel ranks (module docstring).

    ``group``: the process group the counts are summed over; None is the default group (every
    rank: archlab's data-parallel group; expert parallelism splits experts, not data).
    """

    key = "global_aux_loss_coeff"
    reads_probs = True

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.group = None
        self.step_open = False  # start_step() was called; the training forwards may add their counts
        self.step_counts: Optional[Tensor] = None  # float64 (E + 1,): counts C_E, then tokens T
        self.last_f_E: Optional[Tensor] = None  # the fractions of the last training forward

    def start_step(self) -> None:
        self.step_open, self.step_counts, self.last_f_E = True, None, None

    def loss(self, routing, batch, training, recomputing):
        probs_NE, experts_NK = routing.probs_NE, routing.experts_NK
        if not training:
            return self.coeff * switch_aux_loss(probs_NE, experts_NK)
        if recomputing:
            if self.last_f_E is None:
                raise RuntimeError("global_aux_loss: a recomputed forward without a first forward in this step")
            return self.coeff * switch_loss(probs_NE, self.last_f_E)
        if not self.step_open:
            raise RuntimeError("model.moe.balance.global_aux_loss_coeff > 0 sums expert counts over the micro-batches "
                               "of an optimizer step: call archlab.nn.moe.start_step(model) before the first "
                               "micro-batch of every step")
        self.last_f_E = self._global_fractions(experts_NK)
        return self.coeff * switch_loss(probs_NE, self.last_f_E)

    @torch.no_grad()
    def _global_fractions(self, experts_NK: Tensor) -> Tensor:
        """float64 (E,): f = C / (K * T) with this forward's counts and tokens added, over all ranks."""
        E = self.num_experts
        local = torch.cat([expert_counts(experts_NK, E), experts_NK.new_full((1,), experts_NK.shape[0])]).double()
        if dist.is_available() and dist.is_initialized() and dist.get_world_size(self.group) > 1:
            dist.all_reduce(local, group=self.group)
        self.step_counts = local if self.step_counts is None else self.step_counts + local
        return self.step_counts[:E] / (self.top_k * self.step_counts[E])

    @classmethod
    def saved_bytes(cls, s):
        return s.cfg.moe.num_experts * FP32_BYTES  # the fractions f_i, as aux_loss


@_register("seq_aux_loss")
class SeqAuxLoss(BalanceTerm):
    """DeepSeek-V3 sequence-wise auxiliary loss: the Switch quantity per sequence, averaged."""

    key = "seq_aux_loss_coeff"
    reads_probs = True

    def loss(self, routing, batch, training, recomputing):
        return self.coeff * seq_aux_loss(routing.probs_NE, routing.experts_NK, batch)

    @classmethod
    def saved_bytes(cls, s):
        return s.batch * s.cfg.moe.num_experts * FP32_BYTES  # the per-sequence fractions f_BE


@_register("z_loss")
class ZLoss(BalanceTerm):
    """ST-MoE router z-loss on the raw logits."""

    key = "z_loss_coeff"

    def loss(self, routing, batch, training, recomputing):
        return self.coeff * z_loss(routing.logits_NE)

    @classmethod
    def saved_bytes(cls, s):
        return s.n * s.cfg.moe.num_experts * FP32_BYTES + s.n * FP32_BYTES  # logits, logsumexp


@_register("expert_bias")
class ExpertBias(BalanceTerm):
    """Aux-loss-free balancing: the router's selection bias (a buffer the router creates when
    ``bias_update_rate`` > 0) moves after each optimizer step by the step's global counts."""

    key = "bias_update_rate"
    adds_loss = False

    def loss(self, routing, batch, training, recomputing):
        return None

    def after_step(self, router, counts_E, all_reduce_sum):
        if router.expert_bias is None:
            raise RuntimeError("bias_update_rate > 0 but the router has no expert_bias buffer")
        update_bias(router.expert_bias, all_reduce_sum(counts_E.to(router.expert_bias.device)), self.coeff)

    @classmethod
    def saved_bytes(cls, s):
        return 0.0  # the bias only shifts the top-k's input; that graph dies with the indices


# ----------------------------------------------------------------------------- by recipe


def term_classes() -> list[type[BalanceTerm]]:
    """Every registered term, by name."""
    return [BALANCE_TERMS.get(n) for n in BALANCE_TERMS.names()]


def loss_term_names() -> tuple[str, ...]:
    """The names of the terms that add a loss, by name (the routing statistics' term columns)."""
    return tuple(c.name for c in term_classes() if c.adds_loss)


def _check_keys(balance) -> None:
    """A BalanceConfig field without a term would be silently ignored: refuse it."""
    if dataclasses.is_dataclass(balance):
        known = {c.key for c in term_classes()}
        unknown = [f.name for f in dataclasses.fields(balance) if f.name not in known]
        if unknown:
            raise ValueError(f"model.moe.balance.{unknown[0]}: no balancing term has this key; "
                             "register one in archlab/nn/moe/balance.py")


def enabled_term_classes(balance) -> list[type[BalanceTerm]]:
    """The terms whose coefficient in ``balance`` (a BalanceConfig) is > 0, by name."""
    _check_keys(balance)
    return [c for c in term_classes() if getattr(balance, c.key) > 0]


def build_terms(cfg: ModelConfig) -> list[BalanceTerm]:
    """One instance of every enabled term, for one MoE layer of the model ``cfg``."""
    return [c(cfg) for c in enabled_term_classes(cfg.moe.balance)]


def validate_balance(m, prefix: str = "model") -> None:
    """Every term's rules on the ``model`` node ``m`` of an MoE recipe."""
    for c in term_classes():
        c.validate(m, prefix)
