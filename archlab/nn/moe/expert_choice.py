"""Expert-choice routing (Zhou et al. 2022, ``moe.router.type: expert_choice``): each expert takes its
top-C tokens instead of each token taking its top-K experts.

Shape legend: N tokens of the forward, D model dim, E routed experts, C capacity (tokens per expert).

    p = softmax(logits) over experts (N, E);  for each expert e: the C tokens with the largest p[:, e]
    C = ceil(N * capacity_factor / E), at most N;  y_n = sum over the experts e that took n of p[n, e] * expert_e(x_n)

A token gets 0 to E experts (``dropped_tokens``: those with none, carried by the residual and any shared
experts); every expert processes exactly C tokens, so the load is balanced by construction and no balancing
loss is needed: the Switch losses are constant under it (f_i = 1/E for every i, so E * sum_i f_i P_i = 1) and a
selection bias b_e, added to one expert's column, changes no top-C choice, so those keys are refused by name;
the router z-loss (on the logits) still acts and is allowed.

Non-causal: an expert's choice compares all N tokens of the micro-batch, so whether token t is processed
depends on tokens after t (and on other sequences of the batch). In a causal decoder this leaks information
from later positions into earlier outputs during training, and at generation (N = 1 per step, so C = 1:
every expert takes the one token) the routing differs from training. archlab builds it and warns; its
losses are not comparable with a causal model's as a language-modelling result.

The choice is expressed as the layer's usual dispatch with E slots per token (slot n*E + e = token n at
expert e): the E*C chosen slots are kept, expert-major, the others dropped before any expert runs, so the
experts compute exactly E*C rows. No Hugging Face class routes this way: no export.
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from archlab.errors import fail
from archlab.nn.moe.experts import Dispatch
from archlab.nn.moe.layer import MoEConfig
from archlab.nn.moe.router import FP32_BYTES, Router, RouterConfig, Routing, _register

if TYPE_CHECKING:
    from archlab.nn.component import ActShape

# balancing keys that do nothing under expert choice (module docstring): the key -> why
NO_EFFECT = {
    "aux_loss_coeff": "the Switch loss is constant (every expert takes C tokens: f_i = 1/E)",
    "global_aux_loss_coeff": "the Switch loss is constant (every expert takes C tokens: f_i = 1/E)",
    "seq_aux_loss_coeff": "the load is balanced by construction (each expert takes exactly C tokens)",
    "bias_update_rate": "a per-expert selection bias changes no expert's top-C tokens",
}
NON_CAUSAL = ("moe.router.type=expert_choice compares all tokens of a micro-batch: in a causal decoder the routing "
              "of a position depends on later positions (training sees the future; generation routes differently)")


def capacity(n_tokens: int, capacity_factor: float, num_experts: int) -> int:
    """C = ceil(N * capacity_factor / E), at least 1 and at most N (an expert takes a token once)."""
    return min(n_tokens, max(1, math.ceil(n_tokens * capacity_factor / num_experts)))


@_register("expert_choice")
class ExpertChoiceRouter(Router):
    """Each expert takes the C tokens with its largest softmax scores; gate weight = that score."""

    options = frozenset({"route_scale", "jitter"})  # no top-k: no groups, no renormalisation

    def __init__(self, config: RouterConfig, *, d_model: int, moe: MoEConfig, causal: bool = True):
        super().__init__(config, d_model=d_model, moe=moe, causal=causal)
        self.capacity_factor = moe.capacity_factor
        if causal:
            warnings.warn(NON_CAUSAL, stacklevel=2)

    @staticmethod
    def slots_per_token(moe: MoEConfig) -> int:
        return moe.num_experts

    @staticmethod
    def experts_per_token(moe: MoEConfig) -> float:
        """Mean expert passes per token: E*C / N = capacity_factor (exact when E divides N * capacity_factor)."""
        return float(moe.capacity_factor)

    @staticmethod
    def kept_slots(moe: MoEConfig, n_tokens: int) -> int:
        """Exactly E*C: every expert takes C tokens."""
        E = moe.num_experts
        return E * capacity(n_tokens, moe.capacity_factor, E)

    @classmethod
    def gathered_slots(cls, moe: MoEConfig, n_tokens: int) -> int:
        """N*E: every (token, expert) slot, taken or not (a slot not taken reads a zero row)."""
        return n_tokens * moe.num_experts

    @classmethod
    def validate(cls, m, prefix: str = "model") -> None:
        e, key = m.moe, f"{prefix}.moe"
        if e.capacity_factor is None or not 0 < e.capacity_factor <= e.num_experts:
            fail(f"{key}.capacity_factor", e.capacity_factor, f"expert_choice needs the mean experts per token, in "
                 f"(0, num_experts={e.num_experts}]: each expert takes C = ceil(tokens * capacity_factor / E)")
        for name in ("top_k", "min_capacity"):
            if getattr(e, name) != getattr(MoEConfig, name):
                fail(f"{key}.{name}", getattr(e, name), "not read by moe.router.type=expert_choice (experts choose "
                     "C = ceil(tokens * capacity_factor / E) tokens each; a token gets 0..E experts): leave it out")
        for name, why in NO_EFFECT.items():
            if getattr(e.balance, name) != 0:
                fail(f"{key}.balance.{name}", getattr(e.balance, name),
                     f"does nothing under moe.router.type=expert_choice: {why}; leave it at 0")
        if e.router.route_scale is None or e.router.route_scale <= 0:
            fail(f"{key}.router.route_scale", e.router.route_scale, "must be a positive number")
        if not 0.0 <= e.router.jitter < 1.0:
            fail(f"{key}.router.jitter", e.router.jitter, "must lie in [0, 1)")

    @classmethod
    def saved_bytes(cls, s: ActShape, *, probs_read: bool) -> float:
        """The softmax output, the chosen mask's float copy (the gate weights = p * mask), the (N, E) gate
        weights, the fp32 copy of the gate weight (non-fp32 model) and the jitter noise."""
        n, D, moe = s.n, s.cfg.d_model, s.cfg.moe
        E = moe.num_experts
        total = n * E * FP32_BYTES + n * E * FP32_BYTES
        if s.act != FP32_BYTES:
            total += D * E * FP32_BYTES
        if moe.router.jitter > 0:
            total += n * D * s.act
        return total

    def forward(self, x_ND: Tensor) -> Routing:
        if self.training and self.jitter > 0:
            x_ND = x_ND * torch.empty_like(x_ND).uniform_(1.0 - self.jitter, 1.0 + self.jitter)
        logits_NE = F.linear(x_ND.float(), self.gate.weight.float())
        probs_NE = torch.softmax(logits_NE, dim=-1)
        N, E = probs_NE.shape
        C = capacity(N, self.capacity_factor, E)
        tokens_EC = torch.topk(probs_NE.detach().t(), C, dim=1).indices  # each expert's top-C tokens
        chosen_NE = torch.zeros(N, E, dtype=probs_NE.dtype, device=probs_NE.device)
        chosen_NE[tokens_EC, torch.arange(E, device=probs_NE.device)[:, None]] = 1.0
        weights_NE = probs_NE * chosen_NE * self.route_scale  # 0 where the expert did not take the token
        experts_NE = torch.arange(E, device=probs_NE.device).expand(N, E)
        return Routing(experts_NE, weights_NE, probs_NE, logits_NE, chosen_NK=chosen_NE.bool())

    def dispatch(self, r: Routing, n_tokens: int) -> Dispatch:
        """The E*C chosen slots (n*E + e) grouped by expert, token order inside; the unchosen ones behind."""
        N, E = r.weights_NK.shape
        C = capacity(N, self.capacity_factor, E)
        chosen_S = r.chosen_NK.reshape(-1)
        slot = torch.arange(N * E, device=chosen_S.device)
        key_S = torch.where(chosen_S, (slot % E) * N + slot // E, E * N + slot)  # expert-major, then the rest
        slot_S = torch.argsort(key_S)
        counts_E = torch.full((E,), C, dtype=torch.int64, device=chosen_S.device)
        dropped = torch.tensor(N * E - E * C, dtype=torch.int64, device=chosen_S.device)
        return Dispatch(slot_S, counts_E, dropped, r.weights_NK, capacity=C)
