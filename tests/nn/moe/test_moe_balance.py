"""Balancing losses against hand computations and HF Mixtral's loss; the aux-loss-free bias
update and its effect on a skewed router."""

import math

import torch

from archlab.config.schema import BalanceConfig
from archlab.nn.moe.balance import balance_losses, seq_aux_loss, switch_aux_loss, update_bias, z_loss


def test_moe_switch_aux_loss_by_hand():
    # N=2 tokens, E=3 experts, K=2. Token 0 -> {0, 1}, token 1 -> {0, 2}.
    probs = torch.tensor([[0.5, 0.3, 0.2], [0.6, 0.1, 0.3]])
    experts = torch.tensor([[0, 1], [0, 2]])
    # f = counts / (K*N) = [2, 1, 1] / 4; P = [0.55, 0.2, 0.25]
    # E * sum f P = 3 * (0.5*0.55 + 0.25*0.2 + 0.25*0.25) = 3 * 0.3875 = 1.1625
    torch.testing.assert_close(switch_aux_loss(probs, experts), torch.tensor(1.1625))


def test_moe_switch_aux_loss_is_one_when_balanced_for_any_k():
    for K in (1, 2, 4):
        E, N = 8, 64
        probs = torch.full((N, E), 1.0 / E)
        experts = (torch.arange(N * K) % E).view(N, K)
        torch.testing.assert_close(switch_aux_loss(probs, experts), torch.tensor(1.0))


def test_moe_switch_aux_loss_is_hf_mixtral_loss_divided_by_k():
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    E, K, N = 8, 2, 40
    logits = torch.randn(N, E)
    probs = torch.softmax(logits, -1)
    experts = torch.topk(probs, K, dim=-1).indices
    hf = load_balancing_loss_func((logits,), num_experts=E, top_k=K)
    torch.testing.assert_close(switch_aux_loss(probs, experts) * K, hf)


def test_moe_seq_aux_loss_by_hand_and_equals_switch_for_one_sequence():
    probs = torch.softmax(torch.randn(12, 4), -1)
    experts = torch.topk(probs, 2, dim=-1).indices
    torch.testing.assert_close(seq_aux_loss(probs, experts, batch=1), switch_aux_loss(probs, experts))
    # two sequences of 6: the mean of the per-sequence values, not the whole-batch value
    per_seq = [switch_aux_loss(probs[i * 6:(i + 1) * 6], experts[i * 6:(i + 1) * 6]) for i in range(2)]
    torch.testing.assert_close(seq_aux_loss(probs, experts, batch=2), (per_seq[0] + per_seq[1]) / 2)


def test_moe_z_loss_by_hand():
    logits = torch.tensor([[0.0, 0.0], [1.0, 2.0]])
    expected = (math.log(2) ** 2 + math.log(math.e + math.e**2) ** 2) / 2
    torch.testing.assert_close(z_loss(logits), torch.tensor(expected))


def test_moe_balance_losses_only_enabled_terms_and_coefficients():
    probs = torch.softmax(torch.randn(8, 4), -1)
    logits = torch.randn(8, 4)
    experts = torch.topk(probs, 2, dim=-1).indices
    assert balance_losses(BalanceConfig(), probs, logits, experts, 2) == {}
    t = balance_losses(BalanceConfig(aux_loss_coeff=0.1, z_loss_coeff=0.01), probs, logits, experts, 2)
    assert sorted(t) == ["aux_loss", "z_loss"]
    torch.testing.assert_close(t["z_loss"], 0.01 * z_loss(logits))


def test_moe_aux_loss_gradient_pushes_probability_away_from_overloaded_expert():
    logits = torch.zeros(16, 4, requires_grad=True)
    experts = torch.zeros(16, 1, dtype=torch.long)  # everything went to expert 0
    switch_aux_loss(torch.softmax(logits, -1), experts).backward()
    assert (logits.grad[:, 0] > 0).all() and (logits.grad[:, 1:] < 0).all()


def test_moe_update_bias_sign_step_and_recentre():
    bias = torch.zeros(4)
    update_bias(bias, torch.tensor([10.0, 0.0, 5.0, 5.0]), rate=0.1)
    # sign(mean - c) = [-1, +1, 0, 0] * 0.1; mean already 0
    torch.testing.assert_close(bias, torch.tensor([-0.1, 0.1, 0.0, 0.0]))
    update_bias(bias, torch.tensor([0.0, 10.0, 0.0, 0.0]), rate=0.1)
    # + [0.1, -0.1, 0.1, 0.1] -> [0, 0, 0.1, 0.1] -> recentred by 0.05
    torch.testing.assert_close(bias, torch.tensor([-0.05, -0.05, 0.05, 0.05]))
