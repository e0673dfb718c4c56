"""Parameter counts from the config against the parameters of the built model."""

from __future__ import annotations

import pytest

import archlab
from archlab.costs import param_counts
from costs_cases import model_recipes, random_overrides, shrink


def _built_counts(cfg) -> dict[str, int]:
    """Counted on the module (meta device: no memory): total, embedding, routed experts, active."""
    model = archlab.build_model(cfg, device="meta")
    total = sum(p.numel() for p in model.parameters())  # tied weights appear once
    tables = [model.positions] + ([model.encoder_positions] if hasattr(model, "encoder_positions") else [])
    embedding = model.embed.weight.numel() + sum(p.numel() for t in tables for p in t.parameters())
    routed = inactive = 0
    for block in model.blocks:
        if block.is_moe:
            E, K = block.ffn.moe.num_experts, block.ffn.moe.top_k
            experts = sum(p.numel() for p in block.ffn.experts.parameters())
            routed += experts
            inactive += experts * (E - K) // E
    return {"total": total, "embedding": embedding, "routed_experts": routed, "active": total - inactive}


@pytest.mark.parametrize("path", model_recipes(), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_counts_match_the_built_model_for_every_recipe(path):
    cfg = archlab.load_recipe(path, shrink(path))
    counts = param_counts(cfg)
    built = _built_counts(cfg)
    assert {k: getattr(counts, k) for k in built} == built
    assert counts.non_embedding == counts.total - counts.embedding


@pytest.mark.parametrize("seed", range(8))
def test_counts_match_the_built_model_for_random_configs(seed):
    cfg = archlab.load_recipe(None, random_overrides(seed, moe=seed % 2 == 1))
    built = _built_counts(cfg)
    counts = param_counts(cfg)
    assert {k: getattr(counts, k) for k in built} == built


@pytest.mark.parametrize("over", ["head", "projection"])
def test_qk_norm_gains_match_the_built_model(over):
    """q/k norm gains: Dh each per head; H*Dh and G*Dh over the whole projections (OLMoE's)."""
    cfg = archlab.load_recipe("recipes/llama/tiny.yaml",
                              ["model.attention.qk_norm=true", f"model.attention.qk_norm_over={over}"])
    built = _built_counts(cfg)
    counts = param_counts(cfg)
    assert {k: getattr(counts, k) for k in built} == built
    plain = param_counts(archlab.load_recipe("recipes/llama/tiny.yaml")).total
    m = archlab.model_config(cfg)
    widths = (m.n_heads + m.kv_heads) * m.d_head if over == "projection" else 2 * m.d_head
    assert counts.total - plain == m.n_layers * widths


@pytest.mark.parametrize("bias", ["true", "false"])
def test_output_gate_projection_matches_the_built_model(bias):
    """The output gate adds W_g (D, H*Dh) and, with attention.bias, its H*Dh bias per layer."""
    base = [f"model.attention.bias={bias}", "model.attention.rotary_fraction=0.5"]
    cfg = archlab.load_recipe("recipes/llama/tiny.yaml", [*base, "model.attention.output_gate=true"])
    built = _built_counts(cfg)
    counts = param_counts(cfg)
    assert {k: getattr(counts, k) for k in built} == built
    m = archlab.model_config(cfg)
    gate = m.d_model * m.n_heads * m.d_head + (m.n_heads * m.d_head if bias == "true" else 0)
    assert counts.total - param_counts(archlab.load_recipe("recipes/llama/tiny.yaml", base)).total == m.n_layers * gate


def test_moe_recipes_match_their_dense_peer_in_active_parameters():
    """The Mixtral/DeepSeek recipes are sized to the LLaMA peer they name (plus the router)."""
    dense = param_counts(archlab.load_recipe("recipes/llama/tiny.yaml"))
    for name in ("mixtral", "deepseek"):
        recipe = archlab.load_recipe(f"recipes/{name}/tiny.yaml")
        moe = param_counts(recipe)
        m = archlab.model_config(recipe)
        routers = sum(m.d_model * m.moe.num_experts for i in range(m.n_layers) if m.is_moe_layer(i))
        assert moe.active == dense.total + routers
        assert moe.total > moe.active


def test_untied_head_is_not_embedding():
    tied = param_counts(archlab.load_recipe("recipes/dense/tiny.yaml"))
    untied = param_counts(archlab.load_recipe("recipes/dense/tiny.yaml", ["model.tie_embeddings=false"]))
    assert untied.total - tied.total == untied.lm_head == 8192 * 96
    assert untied.embedding == tied.embedding == 8192 * 96 + 1024 * 96  # tokens + learned positions


def test_counts_without_and_with_the_head_agree_for_tied_and_untied_models():
    """non_embedding_no_head leaves the LM head out and non_embedding_with_head counts its D x V
    matmul, tied or untied: the same number for both; non_embedding differs by the untied head."""
    tied = param_counts(archlab.load_recipe("recipes/dense/tiny.yaml"))
    untied = param_counts(archlab.load_recipe("recipes/dense/tiny.yaml", ["model.tie_embeddings=false"]))
    head = 8192 * 96
    assert tied.output_projection == untied.output_projection == head
    assert tied.non_embedding_no_head == untied.non_embedding_no_head == tied.non_embedding
    assert tied.non_embedding_with_head == untied.non_embedding_with_head == tied.non_embedding + head
    assert untied.non_embedding - tied.non_embedding == head
    assert tied.active_no_head == untied.active_no_head == tied.non_embedding_no_head  # dense: all active
    llama = param_counts(archlab.load_recipe("recipes/llama/tiny.yaml"))  # untied head
    assert llama.lm_head and llama.active_no_head == llama.active - llama.embedding - llama.lm_head
    d = untied.as_dict()
    assert d["non_embedding_no_head"] == untied.non_embedding_no_head and d["output_projection"] == head
