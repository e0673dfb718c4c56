"""FLOPs per token from the config against FlopCounterMode on the built model."""

from __future__ import annotations

import pytest
import torch

import archlab
from archlab.costs import forward_flops, forward_flops_per_token, training_flops, training_flops_per_token
from archlab.costs.flops import ffn_flops
from archlab.costs.measure import flops_by_component, measured_flops
from archlab.objectives import objective_for
from costs_cases import model_recipes, random_overrides, shrink

B, S = 1, 16
RECIPES = model_recipes()


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_flops_match_flop_counter_for_every_recipe(path):
    """Training total within 1%, and each forward component within 1%."""
    cfg = archlab.load_recipe(path, shrink(path))
    model = archlab.build_model(cfg).train()
    # the trainer's window: S inputs and the ids the objective needs past them (causal LM 1, masked LM 0)
    ids = torch.randint(0, cfg.model.vocab_size - objective_for(cfg).reserved_ids(cfg),
                          (B, S + objective_for(cfg).window_ahead))
    measured = measured_flops(model, ids)["total"] / (B * S)  # the fused LM-head loss, as the trainer
    assert training_flops_per_token(archlab.model_config(cfg), S) == pytest.approx(measured, rel=0.01)
    # per component on the logits path: the fused loss runs the head's backward matmuls in its forward
    parts = flops_by_component(measured_flops(model, ids, backward=False, loss="logits"))
    est = forward_flops(cfg, S)
    for name, value in parts.items():
        expected = est.attention if name == "attention" else getattr(est, name)
        assert expected == pytest.approx(value / (B * S), rel=0.01, abs=1e-9), name


@pytest.mark.parametrize("seed", range(6))
def test_random_configs_match_flop_counter(seed):
    """Random dense and MoE models (routers, groups, shared experts, dense-first layers...)."""
    cfg = archlab.load_recipe(None, random_overrides(seed, moe=seed % 2 == 1))
    model = archlab.build_model(cfg).train()
    ids = torch.randint(0, cfg.model.vocab_size, (B, S + 1))
    total = measured_flops(model, ids)["total"] / (B * S)
    assert training_flops_per_token(cfg, S) == pytest.approx(total, rel=0.01)
    parts = flops_by_component(measured_flops(model, ids, backward=False, loss="logits"))
    est = forward_flops(cfg, S)
    assert est.experts == pytest.approx(parts["experts"] / (B * S), rel=0.01, abs=1e-9)
    assert est.attention == pytest.approx(parts["attention"] / (B * S), rel=0.01)


@pytest.mark.parametrize("overrides", [["model.attention.output_gate=true"],
                                       ["model.attention.output_gate=true", "model.attention.rotary_fraction=0.25"]])
def test_output_gate_flops_match_flop_counter(overrides):
    """The gate's projection is one more (D, H*Dh) matmul; its sigmoid and product, and partial RoPE, are
    elementwise."""
    cfg = archlab.load_recipe("recipes/llama/tiny.yaml", ["model.n_layers=2", *overrides])
    model = archlab.build_model(cfg).train()
    ids = torch.randint(0, cfg.model.vocab_size, (B, S + 1))
    assert training_flops_per_token(cfg, S) == pytest.approx(measured_flops(model, ids)["total"] / (B * S), rel=0.01)
    parts = flops_by_component(measured_flops(model, ids, backward=False, loss="logits"))
    est = forward_flops(cfg, S)
    for name in ("attention", "qkv_proj", "out_proj"):
        assert getattr(est, name) == pytest.approx(parts[name] / (B * S), rel=0.01), name
    m = archlab.model_config(cfg)
    plain = forward_flops(archlab.load_recipe("recipes/llama/tiny.yaml", ["model.n_layers=2"]), S).qkv_proj
    assert est.qkv_proj - plain == pytest.approx(m.n_layers * 2 * m.d_model * m.n_heads * m.d_head)


def test_capacity_dropping_removes_exactly_the_dropped_slots():
    """With a capacity, the measured count is the dropless estimate minus the dropped slots'
    expert FLOPs (read from the layers' routing statistics)."""
    cfg = archlab.load_recipe("recipes/mixtral/tiny.yaml", ["model.moe.capacity_factor=0.5", "model.n_layers=2"])
    model = archlab.build_model(cfg).train()
    ids = torch.randint(0, cfg.model.vocab_size, (2, 33))
    measured = measured_flops(model, ids)["total"]
    dropped = sum(b.ffn.stats.read(lambda t: t, [])["dropped_slots"] for b in model.blocks)
    assert dropped > 0
    m = cfg.model
    slot = 3 * ffn_flops(m, m.moe.expert_hidden)
    assert measured == pytest.approx(training_flops_per_token(cfg, 32) * 64 - dropped * slot, rel=1e-6)


def test_attention_counts_the_full_square_and_reports_the_causal_part():
    cfg = archlab.model_config(archlab.load_recipe("recipes/llama/tiny.yaml"))
    for seq in (16, 128, 1024):
        f = forward_flops(cfg, seq)
        assert f.attn_scores == f.attn_values == 2 * seq * cfg.n_heads * cfg.d_head * cfg.n_layers
        assert f.attention_causal_useful == pytest.approx(f.attention * (seq + 1) / (2 * seq))
        assert f.total == pytest.approx(sum(f.components().values()))
    # only attention depends on the context
    a, b = forward_flops(cfg, 128), forward_flops(cfg, 256)
    assert b.total - a.total == pytest.approx(a.attention)


def test_training_is_three_forwards_and_accepts_recipe_or_model_config():
    recipe = archlab.load_recipe("recipes/deepseek/tiny.yaml")
    cfg = archlab.model_config(recipe)
    train = training_flops_per_token(recipe, 64)
    assert train == training_flops_per_token(cfg, 64) == 3 * forward_flops_per_token(cfg, 64)
    t = training_flops(cfg, 64)
    assert t.router == 3 * forward_flops(cfg, 64).router > 0
    # MoE counts the K routed experts, not all E: fewer FLOPs than its parameter count suggests
    assert forward_flops(cfg, 64).experts < 2 * archlab.num_params(cfg)


@pytest.mark.parametrize("seq_len", [0, -3])
def test_bad_seq_len_is_rejected(seq_len):
    with pytest.raises(ValueError, match="seq_len"):
        forward_flops(archlab.model_config(archlab.load_recipe("recipes/dense/tiny.yaml")), seq_len)


@pytest.mark.parametrize("name, overrides", [("dense/tiny", ["model.block.shared_norm=false"]),
                                             ("deepseek/tiny", []),
                                             ("gptj/tiny", ["model.mtp_depth=1", "train.objective=mtp"])])
def test_parallel_block_flops_match_flop_counter(name, overrides):
    """The parallel block runs the sequential block's matmuls: the same estimate, equal to the count."""
    cfg = archlab.load_recipe(f"recipes/{name}.yaml", ["model.n_layers=2", "model.block.type=parallel", *overrides])
    model = archlab.build_model(cfg).train()
    ids = torch.randint(0, cfg.model.vocab_size, (B, S + objective_for(cfg).window_ahead))
    assert training_flops_per_token(cfg, S) == pytest.approx(measured_flops(model, ids)["total"] / (B * S), rel=1e-9)
    others = [o for o in overrides if not o.startswith("model.block.")]
    sequential = archlab.load_recipe(f"recipes/{name}.yaml",
                                     ["model.n_layers=2", *others, "model.block.type=sequential"])
    assert training_flops_per_token(sequential, S) == training_flops_per_token(cfg, S)


@pytest.mark.parametrize("factor", [1.0, 2.0, 4.0])
def test_expert_choice_flops_are_capacity_factor_expert_passes_per_token(factor):
    """E*C rows through the experts: capacity_factor passes per token when E divides N * capacity_factor."""
    cfg = archlab.load_recipe("recipes/expert_choice/tiny.yaml",
                              ["model.n_layers=2", f"model.moe.capacity_factor={factor}"])
    model = archlab.build_model(cfg).train()
    ids = torch.randint(0, cfg.model.vocab_size, (B, S + 1))
    assert training_flops_per_token(cfg, S) == pytest.approx(measured_flops(model, ids)["total"] / (B * S), rel=1e-9)
    m = cfg.model
    assert forward_flops(cfg, S).experts == 2 * factor * ffn_flops(m, m.moe.expert_hidden)
