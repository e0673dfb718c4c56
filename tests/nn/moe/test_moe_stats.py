"""Routing statistics and the model-level helpers the trainer calls: routing_stats, balance_step."""

import json

import pytest
import torch

from archlab.config.schema import (
    BalanceConfig,
    FFNConfig,
    ModelConfig,
    MoEConfig,
    NormConfig,
    PositionConfig,
    RouterConfig,
)
from archlab.model.build import build_model
from archlab.nn.moe import MoELayer, balance_step, moe_layers, routing_stats


def identity(t):
    return t


def make_model(**moe):
    router = RouterConfig(**moe.pop("router", {}))
    balance = BalanceConfig(**moe.pop("balance", {}))
    m = MoEConfig(**{"num_experts": 8, "top_k": 2, "expert_hidden": 16, **moe}, router=router, balance=balance)
    cfg = ModelConfig(vocab_size=64, max_seq_len=32, d_model=32, n_layers=3, n_heads=4, norm=NormConfig(type="rmsnorm"),
                      position=PositionConfig(type="rope"), ffn=FFNConfig(type="swiglu", bias=False), moe=m)
    return build_model(cfg)


def test_moe_stats_keys_invariant_and_reset():
    model = make_model(first_k_dense=1, capacity_factor=0.75, min_capacity=1,
                       balance=dict(aux_loss_coeff=0.01, z_loss_coeff=1e-3))
    ids = torch.randint(0, 64, (4, 16))
    model.train()
    model(ids)
    model(ids)
    s = routing_stats(model, identity)
    json.dumps(s)  # JSON-serialisable
    assert not any(k.startswith("moe/layer0/") for k in s)  # layer 0 is dense
    for layer in ("layer1", "layer2"):
        p = f"moe/{layer}/"
        counts = s[p + "tokens_per_expert"]
        assert len(counts) == 8 and s[p + "tokens"] == 2 * 4 * 16
        assert sum(counts) == s[p + "tokens"] * 2 - s[p + "dropped_slots"]
        assert s[p + "dropped_slots"] > 0 and s[p + "dropped_fraction"] == s[p + "dropped_slots"] / (128 * 2)
        assert abs(sum(s[p + "load_fraction"]) - 1) < 1e-9
        mean = sum(counts) / 8
        assert s[p + "maxvio"] == pytest.approx((max(counts) - mean) / mean)
        assert 0 < s[p + "router_entropy"] <= torch.log(torch.tensor(8.0)).item() + 1e-6
        assert s[p + "aux_loss"] > 0 and s[p + "z_loss"] > 0 and p + "seq_aux_loss" not in s
        assert p + "bias" not in s
    assert routing_stats(model, identity) == {}  # reset


def test_moe_stats_eval_forwards_do_not_count():
    model = make_model()
    ids = torch.randint(0, 64, (2, 8))
    model.train()
    model(ids)
    model.eval()
    with torch.no_grad():
        model(ids)
        model(torch.randint(0, 64, (5, 8)))
    s = routing_stats(model, identity)
    assert s["moe/layer0/tokens"] == 16 and sum(s["moe/layer0/tokens_per_expert"]) == 32
    model.eval()
    model(ids)
    assert routing_stats(model, identity) == {}


def test_moe_stats_are_summed_over_ranks():
    model = make_model()
    model.train()
    model(torch.randint(0, 64, (2, 8)))
    local = [layer.stats.window.clone() for layer in moe_layers(model)]
    two_ranks = routing_stats(model, lambda t: 2 * t)  # as if a second rank saw the same tokens
    for i, w in enumerate(local):
        assert two_ranks[f"moe/layer{i}/tokens"] == 2 * w[8].item()
        assert two_ranks[f"moe/layer{i}/tokens_per_expert"] == [int(2 * c) for c in w[:8].tolist()]


def test_moe_stats_broken_bookkeeping_raises():
    model = make_model()
    model.train()
    model(torch.randint(0, 64, (2, 8)))
    moe_layers(model)[0].stats.window[0] += 1
    with pytest.raises(RuntimeError, match="bookkeeping"):
        routing_stats(model, identity)


def test_moe_balance_step_uses_global_counts_and_resets():
    model = make_model(router=dict(type="sigmoid_topk"), balance=dict(bias_update_rate=0.1))
    model.train()
    model(torch.randint(0, 64, (2, 8)))
    other_rank = torch.tensor([100.0, 0, 0, 0, 0, 0, 0, 0], dtype=torch.float64)
    balance_step(model, lambda t: t + other_rank)  # global counts dominated by expert 0
    for layer in moe_layers(model):
        b = layer.router.expert_bias
        assert b[0] < 0 and torch.all(b[1:] > b[0])
        assert abs(b.sum().item()) < 1e-6
        assert layer.stats.step_counts_E.sum() == 0
    s = routing_stats(model, identity)
    assert len(s["moe/layer0/bias"]) == 8


def test_moe_balance_step_without_rate_only_resets():
    model = make_model()
    model.train()
    model(torch.randint(0, 64, (2, 8)))
    calls = []
    balance_step(model, lambda t: calls.append(t) or t)
    assert calls == []
    assert all(layer.stats.step_counts_E.sum() == 0 for layer in moe_layers(model))
    assert all(layer.router.expert_bias is None for layer in moe_layers(model))


def test_moe_bias_balancing_removes_a_router_skew():
    """Aux-loss-free balancing alone (no gradient) brings a strongly skewed router to balance."""
    torch.manual_seed(0)
    cfg = make_model(router=dict(type="sigmoid_topk"), balance=dict(bias_update_rate=0.02)).cfg
    layer = MoELayer(cfg)
    with torch.no_grad():
        layer.router.gate.weight[:, 0] = torch.linspace(2.0, -2.0, 8)  # expert 0 favoured
    model = torch.nn.ModuleDict({"0": layer}).train()

    def maxvio_after(steps):
        for _ in range(steps):
            x = torch.randn(4, 16, 32)
            x[..., 0] = 1.5
            with torch.no_grad():
                layer(x)
            balance_step(model, identity)
        return routing_stats(model, identity)["moe/layer0/maxvio"]

    skewed = maxvio_after(1)
    balanced = maxvio_after(200)
    balanced = maxvio_after(20)  # statistics of the last 20 steps only
    assert skewed > 1.0 and balanced < 0.3, (skewed, balanced)
