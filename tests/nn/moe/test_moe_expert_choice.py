"""Expert-choice routing: every expert takes exactly C tokens, its C highest-scoring ones; the layer's
output equals a dense per-expert computation; routing statistics and the trace say who took what; the
balancing keys that would do nothing, and the top-k keys it never reads, are refused by name.

Shape legend: N tokens, D model dim, E experts, C capacity.
"""

import math

import pytest
import torch

import archlab
from archlab.config import RecipeError
from archlab.config.schema import ModelConfig, MoEConfig, RouterConfig
from archlab.nn.moe import MoELayer, routing_stats, start_trace, take_trace
from archlab.nn.moe.expert_choice import NON_CAUSAL, ExpertChoiceRouter, capacity

RECIPE = "recipes/expert_choice/tiny.yaml"


def layer(E=8, factor=2.0, **moe) -> MoELayer:
    cfg = ModelConfig(type="encoder", d_model=16, moe=MoEConfig(num_experts=E, expert_hidden=16, capacity_factor=factor,
                                                                router=RouterConfig(type="expert_choice"), **moe))
    return MoELayer(cfg)  # built outside a decoder: no causality warning


@pytest.mark.parametrize("n, factor, E", [(24, 2.0, 8), (10, 1.0, 4), (7, 1.5, 4), (5, 4.0, 4)])
def test_each_expert_takes_exactly_its_capacity_and_its_top_scores(n, factor, E):
    lay = layer(E, factor)
    x_ND = torch.randn(n, 16)
    r = lay.router(x_ND)
    C = capacity(n, factor, E)
    assert C == min(n, math.ceil(n * factor / E))
    taken_NE = r.chosen_NK
    assert taken_NE.sum(dim=0).tolist() == [C] * E  # exactly C tokens per expert
    probs_NE = torch.softmax(x_ND @ lay.router.gate.weight.T, dim=-1)
    torch.testing.assert_close(r.probs_NE, probs_NE)
    for e in range(E):  # its C tokens are those with its C largest scores
        chosen = probs_NE[taken_NE[:, e], e]
        others = probs_NE[~taken_NE[:, e], e]
        assert others.numel() == 0 or chosen.min() >= others.max()
    torch.testing.assert_close(r.weights_NK, probs_NE * taken_NE)  # gate = the score where taken, else 0
    d = lay.router.dispatch(r, n)
    assert d.counts_E.tolist() == [C] * E and int(d.dropped) == n * E - E * C


def test_output_equals_a_dense_reference():
    """y_n = sum over the experts e that took token n of p[n, e] * expert_e(x_n), each expert run on every
    token with its own weights, then masked."""
    lay = layer(8, 2.0, n_shared_experts=1).train()
    x_BSD = torch.randn(2, 12, 16)
    y_BSD, aux = lay(x_BSD)
    x_ND = x_BSD.reshape(-1, 16)
    r = lay.router(x_ND)
    w_up, w_down, act = lay.experts.w_up, lay.experts.w_down, lay.experts.act
    ref = sum((r.weights_NK[:, e, None] * (act(x_ND @ w_up[e]) @ w_down[e])) for e in range(8))
    ref = ref + lay.shared(x_ND)
    torch.testing.assert_close(y_BSD.reshape(-1, 16), ref)
    assert aux == 0  # no balancing term: balanced by construction


def test_routing_statistics_and_the_trace_say_who_took_what():
    lay = layer(4, 1.0).train()
    x_BSD = torch.randn(1, 16, 16)
    model = torch.nn.ModuleList([lay])
    start_trace(model, torch.arange(16))
    lay(x_BSD)
    trace = take_trace(model)
    s = routing_stats(model, lambda t: t)
    r = lay.router(x_BSD.reshape(-1, 16))
    lost = int((~r.chosen_NK).all(dim=1).sum())  # tokens no expert took
    assert s["moe/layer0/tokens_per_expert"] == [4, 4, 4, 4] and s["moe/layer0/maxvio"] == 0.0
    assert s["moe/layer0/dropped_tokens"] == s["moe/dropped_tokens"] == lost
    assert s["moe/layer0/top_k"] == 4  # a token may get every expert
    # the per-token view: for each traced token, which of the E experts took it, with its gate weight
    assert trace["experts"].shape == (16, 1, 4) and torch.equal(trace["dropped"][:, 0], ~r.chosen_NK)
    torch.testing.assert_close(trace["weights"][:, 0], r.weights_NK.detach())


def test_a_decoder_warns_that_the_routing_is_not_causal():
    cfg = archlab.load_recipe(RECIPE, ["model.n_layers=1"])
    with pytest.warns(UserWarning, match="routing of a position depends on later positions"):
        model = archlab.build_model(cfg)
    assert isinstance(model.blocks[0].ffn.router, ExpertChoiceRouter) and "causal decoder" in NON_CAUSAL
    ids = torch.randint(0, 200, (1, 16))
    with torch.no_grad():
        before = model(ids).logits[0, :8]
        ids[0, 12:] = (ids[0, 12:] + 1) % 200  # change later tokens only
        after = model(ids).logits[0, :8]
    assert not torch.allclose(before, after)  # earlier outputs moved: information flowed backwards


@pytest.mark.parametrize("overrides, message", [
    (["model.moe.balance.aux_loss_coeff=0.01"], "model.moe.balance.aux_loss_coeff=0.01: does nothing under "
                                                "moe.router.type=expert_choice: the Switch loss is constant"),
    (["model.moe.balance.global_aux_loss_coeff=0.01"], "model.moe.balance.global_aux_loss_coeff=0.01: does nothing"),
    (["model.moe.balance.seq_aux_loss_coeff=0.01"], "model.moe.balance.seq_aux_loss_coeff=0.01: does nothing"),
    (["model.moe.balance.bias_update_rate=0.001"], "model.moe.balance.bias_update_rate=0.001: does nothing under "
                                                   "moe.router.type=expert_choice: a per-expert selection bias"),
    (["model.moe.top_k=1"], "model.moe.top_k=1: not read by moe.router.type=expert_choice"),
    (["model.moe.min_capacity=1"], "model.moe.min_capacity=1: not read by moe.router.type=expert_choice"),
    (["model.moe.capacity_factor=null"], "model.moe.capacity_factor=None: expert_choice needs the mean experts"),
    (["model.moe.capacity_factor=9.0"], "model.moe.capacity_factor=9.0: expert_choice needs"),
    (["model.moe.router.n_groups=2"], "model.moe.router.n_groups=2: only used by moe.router.type sigmoid_topk, "
                                      "softmax_topk"),
])
def test_keys_that_would_do_nothing_are_refused_by_name(overrides, message):
    with pytest.raises(RecipeError) as err:
        archlab.load_recipe(RECIPE, overrides)
    assert str(err.value).startswith(message), str(err.value)


def test_z_loss_still_acts_and_is_allowed():
    cfg = archlab.load_recipe(RECIPE, ["model.n_layers=1", "model.moe.balance.z_loss_coeff=0.001"])
    with pytest.warns(UserWarning):
        model = archlab.build_model(cfg).train()
    assert model(torch.randint(0, 200, (2, 16))).aux_loss > 0


def test_no_hugging_face_class_routes_by_expert_choice():
    from archlab.hf import find_adapter

    with pytest.raises(ValueError, match="no Hugging Face class can express"):
        find_adapter(archlab.model_config(archlab.load_recipe(RECIPE)))
