"""Routers: softmax/sigmoid top-k, renormalisation, route scale, groups, selection bias, jitter;
the benchmark-only forced uniform routing."""

import pytest
import torch
import torch.nn.functional as F

from archlab.config import RecipeError, load_recipe
from archlab.config.schema import BalanceConfig, FFNConfig, ModelConfig, MoEConfig, RouterConfig
from archlab.nn.component import ActShape
from archlab.nn.moe import MoELayer, routing_stats
from archlab.nn.moe.router import ROUTERS, Router, build_router, uniform_assignment, uniform_routing


def router(d=16, **kw):
    balance = BalanceConfig(**kw.pop("balance", {}))
    moe = MoEConfig(**{"num_experts": 8, "top_k": 2, **{k: kw.pop(k) for k in ("num_experts", "top_k") if k in kw}},
                    router=RouterConfig(**kw), balance=balance)
    return build_router(ModelConfig(d_model=d, moe=moe).moe, d_model=d)  # its own node and its site


def test_moe_router_registry_names():
    assert ROUTERS.names() == ["expert_choice", "sigmoid_topk", "softmax_topk"]
    assert all(ROUTERS.get(n).name == n for n in ROUTERS.names())


def test_moe_softmax_renormalised_equals_mixtral_softmax_over_selected_logits():
    r = router(type="softmax_topk", renormalize=True)
    x = torch.randn(10, 16)
    out = r(x)
    logits = x @ r.gate.weight.T
    top = torch.topk(logits, 2, dim=-1)
    torch.testing.assert_close(out.experts_NK, top.indices)
    torch.testing.assert_close(out.weights_NK, torch.softmax(top.values, dim=-1))
    torch.testing.assert_close(out.probs_NE, torch.softmax(logits, dim=-1))


def test_moe_softmax_without_renormalisation_keeps_the_probabilities_times_scale():
    r = router(type="softmax_topk", renormalize=False, route_scale=2.0)
    x = torch.randn(10, 16)
    out = r(x)
    p = torch.softmax(x @ r.gate.weight.T, dim=-1)
    torch.testing.assert_close(out.weights_NK, 2.0 * p.gather(1, out.experts_NK))
    assert (out.weights_NK.sum(-1) < 2.0).all()


def test_moe_sigmoid_router_normalised_and_scaled():
    r = router(type="sigmoid_topk", renormalize=True, route_scale=2.5)
    out = r(torch.randn(10, 16))
    torch.testing.assert_close(out.weights_NK.sum(-1), torch.full((10,), 2.5))
    torch.testing.assert_close(out.probs_NE.sum(-1), torch.ones(10))


def test_moe_group_limited_routing_by_hand():
    # 8 experts in 4 groups of 2. Softmax ranks a group by its best expert; keep 1 group.
    r = router(type="softmax_topk", n_groups=4, topk_groups=1)
    with torch.no_grad():
        r.gate.weight.copy_(torch.eye(8, 16))
    x = torch.zeros(1, 16)
    x[0, :8] = torch.tensor([5.0, 0.0, 4.9, 0.0, 0.0, 0.0, 0.0, 0.0])
    # global top-2 would be {0, 2}; only group 0 = {0, 1} is eligible
    assert sorted(r(x).experts_NK[0].tolist()) == [0, 1]
    # Sigmoid ranks a group by the sum of its two best scores; keep 2 groups.
    r2 = router(type="sigmoid_topk", n_groups=4, topk_groups=2)
    with torch.no_grad():
        r2.gate.weight.copy_(torch.eye(8, 16))
    x[0, :8] = torch.tensor([5.0, -5.0, 3.0, 3.0, 4.0, 3.9, -3.0, -3.0])
    # group sums: g0 = 1.000, g1 = 1.905, g2 = 1.962, g3 = 0.095 -> keep g1, g2; the global
    # top-2 would be {0, 4}, inside g1 and g2 it is {4, 5}
    assert sorted(r2(x).experts_NK[0].tolist()) == [4, 5]


def test_moe_group_limited_choices_stay_inside_the_kept_groups():
    r = router(type="sigmoid_topk", num_experts=16, top_k=4, n_groups=4, topk_groups=2)
    out = r(torch.randn(200, 16))
    groups = out.experts_NK // 4
    assert all(len(set(g.tolist())) <= 2 for g in groups)


def test_moe_selection_bias_changes_choice_not_weights():
    r = router(type="sigmoid_topk", balance=dict(bias_update_rate=1e-3))
    x = torch.randn(50, 16)
    before = r(x)
    r.expert_bias[3] = 100.0  # expert 3 always chosen
    after = r(x)
    assert (after.experts_NK == 3).any(dim=-1).all()
    s = torch.sigmoid(x @ r.gate.weight.T)
    w = s.gather(1, after.experts_NK)
    torch.testing.assert_close(after.weights_NK, w / w.sum(-1, keepdim=True))
    assert not torch.equal(before.experts_NK, after.experts_NK)


def test_moe_jitter_only_in_training():
    r = router(jitter=0.5)
    x = torch.randn(64, 16)
    r.eval()
    torch.testing.assert_close(r(x).logits_NE, r(x).logits_NE)
    r.train()
    assert not torch.allclose(r(x).logits_NE, r(x).logits_NE)


# ----------------------------------------------------------------------------- what a router states


def _shape(router_type, act=4, **balance) -> ActShape:
    moe = MoEConfig(num_experts=8, top_k=2, router=RouterConfig(type=router_type), balance=BalanceConfig(**balance))
    return ActShape(ModelConfig(d_model=16, moe=moe), batch=2, seq_len=8, act=act, mask=act, device="cpu")


def test_moe_router_saved_bytes_by_class():
    """The sigmoid router keeps the normaliser of its balancing probabilities (N fp32 values) only
    when a term reads them; softmax's probabilities are its scores. A bf16 model adds the fp32
    copy of the gate weight (D x E)."""
    n = 16
    soft, sig = ROUTERS.get("softmax_topk"), ROUTERS.get("sigmoid_topk")
    s = _shape("softmax_topk")
    assert soft.saved_bytes(s, probs_read=True) == soft.saved_bytes(s, probs_read=False)
    assert sig.saved_bytes(s, probs_read=True) - sig.saved_bytes(s, probs_read=False) == n * 4
    assert sig.saved_bytes(s, probs_read=False) == soft.saved_bytes(s, probs_read=False)
    # scores (N, E) fp32, ids (N, K) int64, renormalised weights (N, K) and their sum (N,) fp32
    assert soft.saved_bytes(s, probs_read=False) == n * 8 * 4 + n * 2 * 8 + n * 2 * 4 + n * 4
    bf16 = _shape("softmax_topk", act=2)
    assert soft.saved_bytes(bf16, probs_read=False) - soft.saved_bytes(s, probs_read=False) == 16 * 8 * 4


def test_moe_router_without_a_memory_model_makes_the_cost_model_raise(monkeypatch):
    from archlab.costs import activation_memory

    class NoMemoryModel(Router):  # a new router that states no saved bytes (the cost model builds nothing)
        name = "softmax_topk"

    monkeypatch.setitem(ROUTERS._entries, "softmax_topk", NoMemoryModel)
    cfg = load_recipe("recipes/mixtral/tiny.yaml", ["model.n_layers=1"])
    with pytest.raises(NotImplementedError, match="model.moe.router.type='softmax_topk': no activation memory model"):
        activation_memory(cfg, 2, 16, dtype="fp32", device="cpu")


@pytest.mark.parametrize("kw, message", [
    (dict(n_groups=3), r"model.moe.router.n_groups=3: must divide num_experts \(8\)"),
    (dict(n_groups=2, topk_groups=3), r"model.moe.router.topk_groups=3: must be <= n_groups \(2\)"),
    (dict(n_groups=8, topk_groups=1), r"model.moe.router.topk_groups=1: the kept groups hold 1 experts"),
    (dict(route_scale=0.0), r"model.moe.router.route_scale=0.0: must be a positive number"),
    (dict(jitter=1.0), r"model.moe.router.jitter=1.0: must lie in \[0, 1\)"),
])
def test_moe_router_validate_names_the_key(kw, message):
    def model(**router_kw) -> ModelConfig:
        return ModelConfig(d_model=16, moe=MoEConfig(num_experts=8, top_k=2, router=RouterConfig(**router_kw)))

    Router.validate(model(n_groups=4, topk_groups=2))
    bad = model(**kw)
    with pytest.raises(RecipeError, match=message):
        ROUTERS.get("softmax_topk").validate(bad)


def test_moe_unknown_router_type_lists_valid_names(root):
    with pytest.raises(RecipeError, match="sigmoid_topk, softmax_topk"):
        load_recipe(root / "recipes/mixtral/tiny.yaml", ["model.moe.router.type=bogus"])


# ----------------------------------------------------------------------------- forced uniform routing


def moe_layer(num_experts=8, top_k=2, **router_kw) -> MoELayer:
    balance = BalanceConfig(**router_kw.pop("balance", {"aux_loss_coeff": 0.01}))
    moe = MoEConfig(num_experts=num_experts, top_k=top_k, expert_hidden=24, router=RouterConfig(**router_kw),
                    balance=balance)
    return MoELayer(ModelConfig(d_model=32, ffn=FFNConfig(type="swiglu", bias=False), moe=moe)).train()


def test_moe_uniform_assignment_is_round_robin_over_slots():
    a = uniform_assignment(5, 4, 2)
    assert a.tolist() == [[0, 1], [2, 3], [0, 1], [2, 3], [0, 1]]
    b = uniform_assignment(7, 64, 6)
    assert all(len(set(row)) == 6 for row in b.tolist())  # distinct experts per token
    counts = torch.bincount(b.flatten(), minlength=64)
    assert int(counts.max() - counts.min()) <= 1


@pytest.mark.parametrize("kw", [
    dict(num_experts=8, top_k=2),
    dict(num_experts=16, top_k=4, type="sigmoid_topk", n_groups=4, topk_groups=2,
         balance=dict(bias_update_rate=1e-3)),
])
def test_moe_uniform_routing_gives_every_expert_exactly_equal_counts(kw):
    layer = moe_layer(**kw)
    if layer.router.expert_bias is not None:
        layer.router.expert_bias[3] = 100.0  # would send every token to expert 3: ignored when forced
    x = torch.randn(4, 16, 32)  # N*K divisible by E in both cases
    with uniform_routing(layer):
        assert layer.router.force_uniform
        layer(x)
    assert not layer.router.force_uniform  # restored on exit
    s = routing_stats(layer, lambda t: t)
    E, K = kw["num_experts"], kw["top_k"]
    assert s["moe/layer0/tokens_per_expert"] == [64 * K // E] * E
    assert s["moe/maxvio"] == 0.0 and s["moe/cv"] == 0.0
    layer(x)  # learned routing again: the large bias (or the learned gate) is back in charge
    assert routing_stats(layer, lambda t: t)["moe/maxvio"] > 0


@pytest.mark.parametrize("mode", ["grouped", "padded"])
def test_moe_uniform_routing_output_equals_reference_with_the_forced_assignment(mode):
    """Output and gradients are a real MoE computation: for each token, the router's renormalised
    softmax weights at its forced experts times those experts' SwiGLU outputs, computed by hand."""
    layer = moe_layer()
    layer.experts.mode = mode
    x = torch.randn(2, 12, 32)
    with uniform_routing(layer):
        y, aux = layer(x)
    x_ND = x.reshape(-1, 32)
    N, K = x_ND.shape[0], 2
    experts_NK = (torch.arange(N * K) % 8).view(N, K)
    p_NE = torch.softmax(x_ND @ layer.router.gate.weight.T, dim=-1)
    w_NK = p_NE.gather(1, experts_NK)
    w_NK = w_NK / w_NK.sum(-1, keepdim=True)
    w_up, w_down = layer.experts.w_up, layer.experts.w_down
    ref = torch.stack([
        sum(w_NK[n, k] * (_swiglu(x_ND[n] @ w_up[experts_NK[n, k]]) @ w_down[experts_NK[n, k]]) for k in range(K))
        for n in range(N)])
    torch.testing.assert_close(y.reshape(N, 32), ref)
    g = torch.randn_like(ref)
    grads = torch.autograd.grad((y.reshape(N, 32) * g).sum() + aux, [layer.router.gate.weight, w_up, w_down])
    ref_aux = 0.01 * 8 * torch.dot(torch.full((8,), 1 / 8), p_NE.mean(0))  # Switch loss with f_i = 1/E
    ref_grads = torch.autograd.grad((ref * g).sum() + ref_aux, [layer.router.gate.weight, w_up, w_down])
    torch.testing.assert_close(aux, ref_aux)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b)
    assert grads[0].abs().sum() > 0  # the router still learns through its gate weights


def _swiglu(h):
    gate, up = h.chunk(2)
    return F.silu(gate) * up


def test_a_router_receives_its_node_and_its_site():
    """Built from model.moe.router and its site (the width, the MoE layer's config), not the model config."""
    moe = MoEConfig(num_experts=6, top_k=2, router=RouterConfig(type="sigmoid_topk", route_scale=2.5))
    r = ROUTERS.get("sigmoid_topk")(moe.router, d_model=12, moe=moe)
    assert r.gate.weight.shape == (6, 12) and r.route_scale == 2.5
    assert Router.num_params(moe, d_model=12) == r.gate.weight.numel()
    assert Router.kept_slots(moe, 10) == 20 and Router.slots_per_token(moe) == 2
