"""Load-balancing losses on the router's decisions; each is on when its coefficient is > 0.

Shape legend: B batch, S sequence, N = B*S tokens, E experts, K experts per token.

Switch normalisation used by archlab (Megatron-Core's, not HF Mixtral's):

    f_i = c_i / (K * N)                   share of the N*K routed slots that chose expert i
    P_i = mean over tokens of p_i         mean router probability of expert i
    L_aux = coeff * E * sum_i f_i * P_i

so sum_i f_i = 1 and a perfectly balanced router gives L_aux = coeff for every K. HF Mixtral's
``load_balancing_loss_func`` omits the division by K (its value is K times larger). The counts
``c_i`` are the router's choices before capacity dropping.

Sequence-wise loss (DeepSeek-V3): the same quantity per sequence, averaged over the B sequences.
Router z-loss (ST-MoE): coeff * mean over tokens of logsumexp(logits)^2.
"""

from __future__ import annotations

import torch
from torch import Tensor


def expert_counts(experts: Tensor, num_experts: int) -> Tensor:
    """int64 (E,): how many entries of ``experts`` (expert ids, any shape) name each expert.
    ``torch.bincount(experts, minlength=E)`` in value, but of a length fixed by E: bincount's
    length depends on the largest id, a data-dependent shape torch.compile cannot trace."""
    ids = experts.reshape(-1)
    return torch.zeros(num_experts, dtype=torch.int64, device=ids.device).scatter_add_(
        0, ids, torch.ones_like(ids, dtype=torch.int64))


def switch_aux_loss(probs_NE: Tensor, experts_NK: Tensor) -> Tensor:
    """E * sum_i f_i P_i over all N tokens (without the coefficient)."""
    N, E = probs_NE.shape
    K = experts_NK.shape[1]
    with torch.no_grad():
        f_E = expert_counts(experts_NK, E).to(probs_NE.dtype) / (K * N)
    return E * torch.dot(f_E, probs_NE.mean(dim=0))


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


def balance_losses(balance, probs_NE: Tensor, logits_NE: Tensor, experts_NK: Tensor, batch: int) -> dict[str, Tensor]:
    """The enabled, coefficient-weighted terms by name: aux_loss, seq_aux_loss, z_loss."""
    terms: dict[str, Tensor] = {}
    if balance.aux_loss_coeff > 0:
        terms["aux_loss"] = balance.aux_loss_coeff * switch_aux_loss(probs_NE, experts_NK)
    if balance.seq_aux_loss_coeff > 0:
        terms["seq_aux_loss"] = balance.seq_aux_loss_coeff * seq_aux_loss(probs_NE, experts_NK, batch)
    if balance.z_loss_coeff > 0:
        terms["z_loss"] = balance.z_loss_coeff * z_loss(logits_NE)
    return terms


@torch.no_grad()
def update_bias(bias_E: Tensor, counts_E: Tensor, rate: float) -> None:
    """Aux-loss-free step: b_i += u * sign(mean(c) - c_i) (under-loaded experts become more
    attractive), then re-centred to mean 0 as torchtitan does (a shift of all b changes no
    top-k choice, and keeps b bounded)."""
    c = counts_E.to(bias_E.dtype)
    bias_E.add_(rate * torch.sign(c.mean() - c))
    bias_E.sub_(bias_E.mean())
