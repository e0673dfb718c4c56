"""Routing telemetry against hand counts on MoE layers whose routing is forced: tokens per expert
(min, max, std), dead experts over the statistics window, dropped slots and dropped tokens under a
capacity, MaxVio percentiles across layers; and the router trace capture, eager and compiled.

Forcing the routing: the gate is the identity on the first E features (gate.weight[e, e] = 1,
all else 0), so a token's router logits are its first E features, which the test writes."""

import math

import pytest
import torch

from archlab.config.schema import BalanceConfig, FFNConfig, ModelConfig, MoEConfig, NormConfig, RouterConfig
from archlab.nn.moe import MoELayer, routing_stats, start_trace, stop_trace, take_trace
from archlab.nn.moe.experts import capacity_for, dispatch
from archlab.nn.moe.stats import layer_percentiles

D = 16


def identity(t):
    return t


def forced_layer(E=4, K=2, **moe) -> MoELayer:
    m = MoEConfig(num_experts=E, top_k=K, expert_hidden=8, router=RouterConfig(**moe.pop("router", {})),
                  balance=BalanceConfig(**moe.pop("balance", {})), **moe)
    cfg = ModelConfig(vocab_size=32, max_seq_len=16, d_model=D, n_layers=1, n_heads=2,
                      norm=NormConfig(type="rmsnorm"), ffn=FFNConfig(type="swiglu", bias=False), moe=m)
    layer = MoELayer(cfg).train()
    with torch.no_grad():
        layer.router.gate.weight.zero_()
        layer.router.gate.weight[:, :E] = torch.eye(E)
    return layer


def tokens_choosing(choices: list[tuple[int, ...]], E: int) -> torch.Tensor:
    """(1, N, D) inputs whose router logits rank the experts of ``choices[n]`` first, in that
    order (logits 8, 4, 2, ... for the 1st, 2nd, 3rd choice; 0 for the rest)."""
    x = torch.zeros(1, len(choices), D)
    for n, chosen in enumerate(choices):
        for rank, e in enumerate(chosen):
            x[0, n, e] = 8.0 / 2 ** rank
    return x


def stats(layer: MoELayer) -> dict:
    s = routing_stats(torch.nn.ModuleDict({"0": layer}), identity)
    return {k.split("/", 2)[-1]: v for k, v in s.items() if k.startswith("moe/layer0/")}


def test_tokens_per_expert_min_max_std_and_dead_match_hand_counts():
    layer = forced_layer(E=4, K=1)
    layer(tokens_choosing([(0,), (0,), (0,), (1,), (1,), (2,)], E=4))  # counts [3, 2, 1, 0]
    s = stats(layer)
    assert s["tokens_per_expert"] == [3, 2, 1, 0]
    assert (s["tokens_per_expert_min"], s["tokens_per_expert_max"]) == (0, 3)
    assert s["tokens_per_expert_std"] == pytest.approx(math.sqrt(((3 - 1.5) ** 2 + 0.5 ** 2 * 2 + 1.5 ** 2) / 4))
    assert s["dead_experts"] == 1  # expert 3
    assert s["maxvio"] == pytest.approx((3 - 1.5) / 1.5)
    assert s["dropped_slots"] == 0 and s["dropped_tokens"] == 0  # dropless


def test_dead_experts_count_over_the_whole_window_and_restart_after_a_read():
    layer = forced_layer(E=4, K=1)
    layer(tokens_choosing([(0,), (1,)], E=4))  # alone: experts 2 and 3 dead
    layer(tokens_choosing([(2,), (2,)], E=4))  # alone: experts 0, 1 and 3 dead
    s = stats(layer)
    assert s["tokens_per_expert"] == [1, 1, 2, 0] and s["dead_experts"] == 1  # only 3 saw no token in the window
    layer(tokens_choosing([(3,), (3,), (3,)], E=4))  # the next window starts empty
    s = stats(layer)
    assert s["tokens_per_expert"] == [0, 0, 0, 3] and s["dead_experts"] == 3
    assert s["tokens_per_expert_std"] == pytest.approx(math.sqrt(3 * 0.75 ** 2 + 2.25 ** 2) / 2)


def test_starved_experts_are_named_beside_the_dead_ones():
    """Starved: 0 < tokens < 10% of the mean over experts. 40 tokens over 4 experts (mean 10): 1 token is not
    under 10% of it; of 50 (mean 12.5) it is."""
    layer = forced_layer(E=4, K=1)
    layer(tokens_choosing([(0,)] * 38 + [(1,)] + [(2,)], E=4))  # counts [38, 1, 1, 0]: mean 10
    s = stats(layer)
    assert s["dead_expert_ids"] == [3] and s["starved_expert_ids"] == [] and s["starved_experts"] == 0
    layer(tokens_choosing([(0,)] * 44 + [(1,)] * 4 + [(2,)] + [(3,)], E=4))  # [44, 4, 1, 1]: mean 12.5
    s = stats(layer)
    assert s["tokens_per_expert"] == [44, 4, 1, 1] and s["starved_expert_ids"] == [2, 3] and s["dead_experts"] == 0
    both = torch.nn.ModuleDict({"0": forced_layer(E=4, K=1), "1": forced_layer(E=4, K=1)})
    both["0"](tokens_choosing([(0,)] * 49 + [(1,)], E=4))  # [49, 1, 0, 0]: 1 < 0.1 * 12.5, starved; 2 dead
    both["1"](tokens_choosing([(0,)] * 10 + [(1,)] * 10 + [(2,)] * 10 + [(3,)] * 10, E=4))
    total = routing_stats(both, identity)
    assert total["moe/layer0/starved_expert_ids"] == [1] and total["moe/layer0/dead_expert_ids"] == [2, 3]
    assert total["moe/starved_experts"] == 1 and total["moe/dead_experts"] == 2


# tokens 0-3 choose (0, 1), tokens 4-7 choose (2, 0); capacity ceil(8 * 2 / 4 * 0.5) = 2 per expert, kept in
# token order: expert 0 keeps tokens 0, 1; expert 1 tokens 0, 1; expert 2 tokens 4, 5; expert 3 is never chosen
CHOICES = [(0, 1)] * 4 + [(2, 0)] * 4
DROPPED_NK = [[False, False]] * 2 + [[True, True]] * 2 + [[False, True]] * 2 + [[True, True]] * 2


def test_dropped_slots_and_tokens_under_a_capacity():
    layer = forced_layer(E=4, K=2, capacity_factor=0.5, min_capacity=1)
    x = tokens_choosing(CHOICES, E=4)
    r = layer.router(x[0])
    assert r.experts_NK.tolist() == [list(c) for c in CHOICES]
    d = dispatch(r.experts_NK, r.weights_NK, 4, capacity_for(8, layer.moe))
    assert d.capacity == 2 and d.dropped_NK().tolist() == DROPPED_NK
    layer(x)
    s = stats(layer)
    assert s["tokens_per_expert"] == [2, 2, 2, 0] and s["dead_experts"] == 1
    assert s["dropped_slots"] == 16 - 6 and s["dropped_fraction"] == pytest.approx(10 / 16)
    assert s["dropped_tokens"] == 4  # tokens 2, 3, 6, 7 lost both slots; 4 and 5 kept one
    assert s["maxvio"] == pytest.approx((2 - 1.5) / 1.5)
    dropless = forced_layer(E=4, K=2)
    dropless(x)
    s = stats(dropless)
    assert s["tokens_per_expert"] == [8, 4, 4, 0] and s["dropped_slots"] == 0 and s["dropped_tokens"] == 0


def test_maxvio_percentiles_across_layers():
    assert layer_percentiles([3.0, 0.0, 10.0, 1.0]) == pytest.approx(
        {"maxvio_p50": 2.0,  # sorted 0, 1, 3, 10: position 0.5 * 3 = 1.5
         "maxvio_p90": 3.0 + 0.7 * 7.0,  # position 2.7
         "maxvio_p95": 3.0 + 0.85 * 7.0,  # position 2.85
         "maxvio_max": 10.0})
    assert layer_percentiles([0.25]) == {"maxvio_p50": 0.25, "maxvio_p90": 0.25, "maxvio_p95": 0.25,
                                         "maxvio_max": 0.25}
    assert layer_percentiles([]) == {}
    # three layers with forced loads: MaxVio 0, 1 and 3 (E=4, K=1, 4 tokens each)
    routes = [[(0,), (1,), (2,), (3,)], [(0,), (0,), (1,), (2,)], [(1,)] * 4]
    layers = torch.nn.ModuleDict({str(i): forced_layer(E=4, K=1) for i in range(3)})
    for i, route in enumerate(routes):
        layers[str(i)](tokens_choosing(route, E=4))
    s = routing_stats(layers, identity)
    assert [s[f"moe/layer{i}/maxvio"] for i in range(3)] == pytest.approx([0.0, 1.0, 3.0])
    assert s["moe/maxvio_p50"] == pytest.approx(1.0)
    assert s["moe/maxvio_p90"] == pytest.approx(1.0 + 0.8 * 2.0)  # position 1.8
    assert s["moe/maxvio_p95"] == pytest.approx(1.0 + 0.9 * 2.0)
    assert s["moe/maxvio_max"] == pytest.approx(3.0) and s["moe/maxvio"] == pytest.approx(4 / 3)
    assert s["moe/dead_experts"] == 0 + 1 + 3 and s["moe/dropped_tokens"] == 0


def traced_forward(layer: MoELayer, x: torch.Tensor, index: torch.Tensor, fn=None) -> dict:
    model = torch.nn.ModuleDict({"0": layer})
    start_trace(model, index)
    (fn if fn is not None else layer)(x)
    stop_trace(model)
    return take_trace(model)


def test_trace_capture_of_forced_routing():
    layer = forced_layer(E=4, K=2, capacity_factor=0.5, min_capacity=1)
    x = tokens_choosing(CHOICES, E=4)
    t = traced_forward(layer, x, torch.tensor([1, 2, 5]))
    assert t["layers"] == ["layer0"] and t["token_index"].tolist() == [1, 2, 5]
    assert t["experts"].shape == (3, 1, 2) and t["logits"].shape == (3, 1, 4)
    assert t["experts"][:, 0].tolist() == [[0, 1], [0, 1], [2, 0]]
    assert t["dropped"][:, 0].tolist() == [DROPPED_NK[1], DROPPED_NK[2], DROPPED_NK[5]]
    torch.testing.assert_close(t["logits"][:, 0], x[0, [1, 2, 5], :4])
    p = torch.softmax(x[0, [1, 2, 5], :4], dim=-1)
    top = p.gather(1, t["experts"][:, 0])
    torch.testing.assert_close(t["weights"][:, 0], top / top.sum(dim=1, keepdim=True))  # renormalised
    assert "expert_bias" not in t
    layer(x)  # not tracing any more: the buffers keep the traced forward
    model = torch.nn.ModuleDict({"0": layer})
    assert take_trace(model)["token_index"].tolist() == [1, 2, 5]


def test_trace_needs_a_training_forward():
    layer = forced_layer(E=4, K=2).eval()
    with torch.no_grad():
        assert traced_forward(layer, tokens_choosing(CHOICES, E=4), torch.tensor([0])) is None


def test_trace_compiles_in_one_graph_and_equals_eager():
    layer = forced_layer(E=4, K=2, capacity_factor=0.5, min_capacity=1, balance=dict(bias_update_rate=0.01))
    layer.router.expert_bias.copy_(torch.tensor([0.0, 0.5, -0.5, 0.0]))
    x = tokens_choosing(CHOICES, E=4) + 0.01 * torch.randn(1, 8, D)
    index = torch.tensor([0, 3, 4, 7])
    eager = traced_forward(layer, x, index)
    compiled = traced_forward(layer, x, index, torch.compile(layer, fullgraph=True, backend="aot_eager"))
    for key in ("experts", "weights", "dropped", "logits", "token_index", "expert_bias"):
        torch.testing.assert_close(compiled[key], eager[key])
    assert eager["expert_bias"].shape == (1, 4)
