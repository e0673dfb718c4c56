"""Balancing terms: the registry against the recipe keys, the losses against hand computations
and HF Mixtral's loss, the aux-loss-free bias update, and the global-batch auxiliary loss in one
process (running counts over micro-batches, reset per step, evaluation, activation checkpointing,
its saved bytes). Its 1 process x 2 micro-batches = 2 processes x 1 equalities:
tests/parallel/test_parallel_balance.py."""

import dataclasses
import math

import pytest
import torch

import archlab
from archlab.config.schema import BalanceConfig, FFNConfig, ModelConfig, MoEConfig
from archlab.costs import activation_memory
from archlab.costs.measure import saved_activation_bytes
from archlab.errors import RecipeError
from archlab.nn.component import ActShape
from archlab.nn.moe import MoELayer, moe_layers, routing_stats, start_step
from archlab.nn.moe.balance import (
    BALANCE_TERMS,
    BalanceTerm,
    GlobalAuxLoss,
    build_terms,
    seq_aux_loss,
    switch_aux_loss,
    switch_loss,
    term_classes,
    update_bias,
    validate_balance,
    z_loss,
)


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


def _moe_cfg(num_experts=4, top_k=2, **balance) -> ModelConfig:
    moe = MoEConfig(num_experts=num_experts, top_k=top_k, expert_hidden=8, balance=BalanceConfig(**balance))
    return ModelConfig(d_model=16, ffn=FFNConfig(type="swiglu", bias=False), moe=moe)


def test_moe_only_enabled_terms_are_built_with_their_coefficients():
    from archlab.nn.moe.router import Routing

    probs = torch.softmax(torch.randn(8, 4), -1)
    logits = torch.randn(8, 4)
    experts = torch.topk(probs, 2, dim=-1).indices
    r = Routing(experts, probs.gather(1, experts), probs, logits)
    assert build_terms(_moe_cfg()) == []
    terms = build_terms(_moe_cfg(aux_loss_coeff=0.1, z_loss_coeff=0.01))
    assert [t.name for t in terms] == ["aux_loss", "z_loss"]
    losses = {t.name: t.loss(r, 2, training=True, recomputing=False) for t in terms}
    torch.testing.assert_close(losses["z_loss"], 0.01 * z_loss(logits))
    torch.testing.assert_close(losses["aux_loss"], 0.1 * switch_aux_loss(probs, experts))


# ----------------------------------------------------------------------------- the registry


def test_moe_every_balance_key_has_exactly_one_term_and_every_term_a_key():
    keys = [f.name for f in dataclasses.fields(BalanceConfig)]
    term_keys = [c.key for c in term_classes()]
    assert sorted(term_keys) == sorted(keys)  # one term per key, one key per term (no duplicates)
    assert len(set(term_keys)) == len(term_keys)
    for c in term_classes():
        assert BALANCE_TERMS.get(c.name) is c
        assert issubclass(c, BalanceTerm)
    assert BALANCE_TERMS.names() == ["aux_loss", "expert_bias", "global_aux_loss", "seq_aux_loss", "z_loss"]


def test_moe_every_term_has_a_memory_model_and_the_base_refuses_to_guess():
    s = ActShape(_moe_cfg(), batch=2, seq_len=8, act=4, mask=4, device="cpu")
    for c in term_classes():
        assert c.saved_bytes(s) >= 0
    with pytest.raises(NotImplementedError, match="no activation memory model"):
        BalanceTerm.saved_bytes(s)


def test_moe_a_term_without_a_memory_model_makes_the_cost_model_raise(monkeypatch):
    class NoMemoryModel(BalanceTerm):
        key, name, reads_probs = "z_loss_coeff", "z_loss", False

    monkeypatch.setitem(BALANCE_TERMS._entries, "z_loss", NoMemoryModel)
    cfg = archlab.load_recipe("recipes/mixtral/tiny.yaml", ["model.n_layers=1", "model.moe.balance.z_loss_coeff=0.01"])
    with pytest.raises(NotImplementedError, match=r"model.moe.balance.z_loss_coeff \(z_loss\): no activation memory"):
        activation_memory(cfg, 2, 16, dtype="fp32", device="cpu")


@pytest.mark.parametrize("key", [f.name for f in dataclasses.fields(BalanceConfig)])
def test_moe_each_term_refuses_a_negative_coefficient_by_its_key(key):
    validate_balance(_moe_cfg(**{key: 0.0}))
    validate_balance(_moe_cfg(**{key: 0.5}))
    with pytest.raises(RecipeError, match=rf"model.moe.balance.{key}=-0.1: must be >= 0"):
        validate_balance(_moe_cfg(**{key: -0.1}))


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


# ----------------------------------------------------------------------------- global-batch auxiliary loss


def _layer(**balance) -> MoELayer:
    torch.manual_seed(0)
    return MoELayer(_moe_cfg(num_experts=8, **balance)).train()


def _global(layer: MoELayer) -> GlobalAuxLoss:
    (term,) = [t for t in layer.balance_terms if isinstance(t, GlobalAuxLoss)]
    return term


def test_moe_global_aux_loss_of_one_micro_batch_in_one_process_is_the_switch_loss():
    """f from the step's counts = f from the micro-batch's own counts: value and gradient."""
    x = torch.randn(2, 12, 16)
    glob, micro = _layer(global_aux_loss_coeff=0.1), _layer(aux_loss_coeff=0.1)
    start_step(glob)
    _, aux_g = glob(x)
    _, aux_m = micro(x)
    torch.testing.assert_close(aux_g, aux_m)
    aux_g.backward()
    aux_m.backward()
    torch.testing.assert_close(glob.router.gate.weight.grad, micro.router.gate.weight.grad)
    assert glob.router.gate.weight.grad.abs().sum() > 0


def test_moe_global_aux_loss_sums_counts_over_the_micro_batches_of_a_step_and_restarts_each_step():
    layer = _layer(global_aux_loss_coeff=0.1)
    term = _global(layer)
    x1, x2 = torch.randn(2, 12, 16), torch.randn(1, 20, 16)  # micro-batches of 24 and 20 tokens
    e1 = layer.router(x1.reshape(-1, 16)).experts_NK
    r2 = layer.router(x2.reshape(-1, 16))
    c1, c2 = torch.bincount(e1.flatten(), minlength=8), torch.bincount(r2.experts_NK.flatten(), minlength=8)
    start_step(layer)
    layer(x1)
    torch.testing.assert_close(term.last_f_E, c1.double() / (2 * 24))  # micro-batch 1: its own counts
    _, aux2 = layer(x2)
    f_E = (c1 + c2).double() / (2 * 44)  # micro-batch 2: the counts of both, over all 44 tokens
    assert torch.equal(term.step_counts, torch.cat([c1 + c2, torch.tensor([44])]).double())
    torch.testing.assert_close(term.last_f_E, f_E)
    torch.testing.assert_close(aux2, 0.1 * 8 * torch.dot(f_E.float(), r2.probs_NE.mean(0)))
    assert abs(term.last_f_E.sum().item() - 1.0) < 1e-12
    start_step(layer)  # the next step starts from zero
    layer(x2)
    assert torch.equal(term.step_counts, torch.cat([c2, torch.tensor([20])]).double())


def test_moe_global_aux_loss_refuses_a_training_forward_outside_a_step():
    layer = _layer(global_aux_loss_coeff=0.1)
    with pytest.raises(RuntimeError, match=r"call archlab.nn.moe.start_step\(model\)"):
        layer(torch.randn(1, 8, 16))


def test_moe_global_aux_loss_in_evaluation_uses_the_forward_own_counts_and_records_nothing():
    layer = _layer(global_aux_loss_coeff=0.1)
    start_step(layer)
    layer(torch.randn(1, 8, 16))
    counts = _global(layer).step_counts.clone()
    x = torch.randn(2, 8, 16)
    layer.eval()
    with torch.no_grad():
        _, aux = layer(x)
        r = layer.router(x.reshape(-1, 16))
    torch.testing.assert_close(aux, 0.1 * switch_aux_loss(r.probs_NE, r.experts_NK))
    assert torch.equal(_global(layer).step_counts, counts)


def test_moe_global_aux_loss_is_reported_in_the_routing_statistics():
    layer = _layer(global_aux_loss_coeff=0.1, z_loss_coeff=0.01)
    start_step(layer)
    x1, x2 = torch.randn(1, 8, 16), torch.randn(1, 8, 16)
    with torch.no_grad():
        layer(x1)
        g1 = 0.1 * switch_loss(layer.router(x1.reshape(-1, 16)).probs_NE, _global(layer).last_f_E)
        layer(x2)
        g2 = 0.1 * switch_loss(layer.router(x2.reshape(-1, 16)).probs_NE, _global(layer).last_f_E)
    s = routing_stats(layer, lambda t: t)
    assert s["moe/layer0/global_aux_loss"] == pytest.approx(float(g1 + g2) / 2, rel=1e-6)
    assert "moe/layer0/z_loss" in s and "moe/layer0/aux_loss" not in s


def _two_micro_batches(mode: str) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Gradients and final step counts of one step of 2 micro-batches through a 2-layer MoE model."""
    cfg = archlab.load_recipe("recipes/mixtral/tiny.yaml", [
        "model.n_layers=2", "model.moe.balance.aux_loss_coeff=0.0", "model.moe.balance.global_aux_loss_coeff=0.1"])
    torch.manual_seed(0)
    model = archlab.build_model(cfg).train()
    model.checkpointing = mode
    g = torch.Generator().manual_seed(1)
    start_step(model)
    for _ in range(2):
        x_BS1 = torch.randint(0, cfg.model.vocab_size, (2, 17), generator=g)
        out = model(x_BS1[:, :-1], targets=x_BS1[:, 1:])
        ((out.loss + out.aux_loss) / 2).backward()
    counts = [_global(layer).step_counts for layer in moe_layers(model)]
    return [p.grad for p in model.parameters()], counts


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_moe_global_aux_loss_under_activation_checkpointing_counts_once_and_keeps_the_gradients(mode):
    """The recomputed forward in backward reuses the first forward's fractions: the step's counts
    are those of the tokens routed (2 micro-batches x 32 tokens), and the gradients equal those
    without checkpointing."""
    ref_grads, ref_counts = _two_micro_batches("none")
    grads, counts = _two_micro_batches(mode)
    for c, rc in zip(counts, ref_counts):
        assert torch.equal(c, rc) and c[-1] == 64 and c[:-1].sum() == 64 * 2
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("router", ["softmax_topk", "sigmoid_topk"])
@pytest.mark.parametrize("mode", ["none", "full", "selective"])
def test_moe_global_aux_loss_saved_bytes_match_the_saved_tensors(router, mode):
    """The cost model asks the router and each term; with every loss term on, what they say equals
    the bytes the real forward keeps for backward."""
    cfg = archlab.load_recipe("recipes/mixtral/tiny.yaml", [
        "model.n_layers=1", f"model.moe.router.type={router}", "model.moe.balance.global_aux_loss_coeff=0.01",
        "model.moe.balance.seq_aux_loss_coeff=0.01", "model.moe.balance.z_loss_coeff=0.001"])
    only_global = archlab.load_recipe("recipes/mixtral/tiny.yaml", [
        "model.n_layers=1", f"model.moe.router.type={router}", "model.moe.balance.aux_loss_coeff=0.0",
        "model.moe.balance.global_aux_loss_coeff=0.01"])
    for c in (cfg, only_global):
        model = archlab.build_model(c).train()
        model.checkpointing = mode
        start_step(model)
        x_BS1 = torch.randint(0, c.model.vocab_size, (2, 33))
        est = activation_memory(c, 2, 32, dtype="fp32", device="cpu", checkpointing=mode)
        assert est.total == saved_activation_bytes(model, x_BS1)["total"]
