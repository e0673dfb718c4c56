"""Export to ``DeepseekV3ForCausalLM``: full-model logits equal (fp32, CPU, default assert_close
tolerances) for random small configs and the v3 recipes, KV-cache generation equal to HF's, the
router equal to HF's, the folder loads with AutoModelForCausalLM, and what HF cannot express is
refused with the reason.

Shape legend: B batch, S sequence, V vocabulary, N tokens, E experts, K experts per token.
"""

import random
from pathlib import Path

import pytest
import torch

import archlab
from archlab.config.schema import (
    BalanceConfig,
    FFNConfig,
    ModelConfig,
    MoEConfig,
    NormConfig,
    PositionConfig,
    RopeScalingConfig,
    RouterConfig,
)
from archlab.hf import ADAPTERS, export_hf, find_adapter, to_hf_model
from archlab.hf.adapters.deepseek_v3 import DeepseekV3Adapter, rope_rows
from archlab.nn.attention import MLAConfig

V = 97
# HF builds a shared-expert MLP of width 0 when a model has no shared experts (exact: it adds zeros)
pytestmark = pytest.mark.filterwarnings("ignore:Initializing zero-element tensors is a no-op")


def only_if(read: bool, value, default):
    """``value`` where the chosen variant reads the key, else the key's default (archlab refuses a key
    that has no effect); the random draw is made either way, so the seeds give the same models."""
    return value if read else default


def deepseek(seed: int, moe: bool = True) -> ModelConfig:
    """A random small DeepSeek-V3 model: head dims, ranks, q_lora on/off, experts, groups, shared
    experts, dense first layers, router settings, biases, RoPE scaling."""
    rng = random.Random(seed)
    n_layers = rng.choice([2, 3])
    E = rng.choice([4, 8, 16])
    groups = rng.choice([g for g in (1, 2, 4) if E // g >= 2])
    top_k = rng.randint(1, 4)
    kept = rng.choice([k for k in range(1, groups + 1) if k * (E // groups) >= top_k])
    F = rng.choice([8, 16])
    scaling = rng.choice(["none", "linear", "yarn"])
    return ModelConfig(
        vocab_size=V, max_seq_len=64, d_model=rng.choice([32, 48]), n_layers=n_layers, n_heads=rng.choice([1, 2, 4]),
        norm=NormConfig(type="rmsnorm", eps=1e-6),
        position=PositionConfig(type="rope", rope_base=rng.choice([10000.0, 500.0]), rope_scaling=RopeScalingConfig(
            type=scaling, factor=only_if(scaling != "none", rng.choice([2.0, 4.0]), 1.0),
            original_max_seq_len=16 if scaling == "yarn" else None)),
        attention=MLAConfig(bias=rng.random() < 0.5, q_lora_rank=rng.choice([None, 8, 24]),
                                  kv_lora_rank=rng.choice([8, 16, 32]), qk_rope_head_dim=rng.choice([2, 4, 8]),
                                  qk_nope_head_dim=rng.choice([4, 8, 16]), v_head_dim=rng.choice([4, 8, 16])),
        ffn=FFNConfig(type="swiglu", bias=False, hidden=rng.choice([40, 64])),
        tie_embeddings=rng.random() < 0.3,
        moe=MoEConfig(
            num_experts=E, top_k=top_k, expert_hidden=F, n_shared_experts=(n_shared := rng.choice([0, 1, 2])),
            shared_hidden=only_if(n_shared > 0, rng.choice([None, 2 * F]), None),
            first_k_dense=rng.randint(0, n_layers - 1),
            router=RouterConfig(type="sigmoid_topk", renormalize=rng.random() < 0.7,
                                route_scale=rng.choice([1.0, 2.5]), n_groups=groups, topk_groups=kept),
            balance=BalanceConfig(bias_update_rate=rng.choice([0.0, 1e-3]), seq_aux_loss_coeff=1e-4),
        ) if moe else None,
    )


def randomised(c) -> torch.nn.Module:
    """Norm gains, biases and the routers' selection bias off their init values (ones/zeros would
    hide a swap); matrices x4 so that attention and routing are far from uniform."""
    model = archlab.build_model(c).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(torch.randn_like(p) * 0.3 + (1.0 if name.endswith("norm.weight") else 0.0))
            else:
                p.mul_(4.0)
        for m in model.modules():
            if getattr(m, "expert_bias", None) is not None:
                m.expert_bias.copy_(torch.randn_like(m.expert_bias) * 0.1)
    return model


def assert_same_logits(model, hf, S: int = 40) -> None:
    ids = torch.randint(0, model.cfg.vocab_size, (2, S))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids).logits)


@pytest.mark.parametrize("seed", range(8))
def test_logits_equal_after_export_for_random_configs(seed):
    model = randomised(deepseek(seed))
    hf = to_hf_model(model)
    assert type(hf).__name__ == "DeepseekV3ForCausalLM"
    assert hf.config.rope_interleave  # DeepSeek's own RoPE layout: rows permuted on export
    assert_same_logits(model, hf)
    assert sum(p.numel() for p in hf.parameters()) == archlab.num_params(model.cfg)


def test_dense_mla_model_exports_with_every_layer_dense():
    model = randomised(deepseek(3, moe=False))
    hf = to_hf_model(model)
    assert hf.config.first_k_dense_replace == model.cfg.n_layers
    assert_same_logits(model, hf)


@pytest.mark.parametrize("name", ["v3-tiny", "v3-mini"])
def test_the_v3_recipes_export_with_equal_logits(name):
    cfg = archlab.load_recipe(f"recipes/deepseek/{name}.yaml", ["model.n_layers=3"])
    model = randomised(archlab.model_config(cfg))
    hf = to_hf_model(model)
    c = hf.config
    m = model.cfg.moe
    assert (c.n_routed_experts, c.num_experts_per_tok, c.n_group, c.topk_group) == (
        m.num_experts, m.top_k, m.router.n_groups, m.router.topk_groups)
    assert c.routed_scaling_factor == m.router.route_scale and c.first_k_dense_replace == m.first_k_dense
    assert_same_logits(model, hf, S=24)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kv_cache_generation_equals_hf(seed):
    """Greedy decoding, archlab's absorbed latent cache against HF's DynamicCache."""
    model = randomised(deepseek(seed))
    hf = to_hf_model(model)
    prompt = torch.randint(0, V, (2, 6))
    ours = archlab.generate(model, prompt, 12, temperature=0)
    theirs = hf.generate(prompt, max_new_tokens=12, do_sample=False, attention_mask=torch.ones_like(prompt),
                         pad_token_id=0)
    assert ours.shape == (2, 18) and torch.equal(ours, theirs)


def test_router_chooses_the_experts_and_weights_hf_does():
    """archlab's sigmoid_topk (groups ranked by the sum of their two best biased scores, gates from
    the unbiased scores) against DeepseekV3TopkRouter, on the same weights and bias."""
    model = randomised(deepseek(5))
    hf = to_hf_model(model)
    layer = next(i for i, b in enumerate(model.blocks) if b.is_moe)
    ours, theirs = model.blocks[layer].ffn.router, hf.model.layers[layer].mlp.gate
    x_ND = torch.randn(256, model.cfg.d_model)
    with torch.no_grad():
        r = ours(x_ND)
        _, weights_NK, experts_NK = theirs(x_ND)
    order_ours, order_theirs = r.experts_NK.argsort(-1), experts_NK.argsort(-1)
    assert torch.equal(r.experts_NK.gather(1, order_ours), experts_NK.gather(1, order_theirs))
    torch.testing.assert_close(r.weights_NK.gather(1, order_ours), weights_NK.gather(1, order_theirs))


def test_rope_rows_take_rotate_half_pairs_to_interleaved_pairs():
    rows = rope_rows(8)
    assert rows.tolist() == [0, 4, 1, 5, 2, 6, 3, 7]  # HF row 2i <- i, 2i + 1 <- i + R/2


def test_exported_folder_loads_with_auto_model(tmp_path):
    from transformers import AutoModelForCausalLM

    model = randomised(archlab.model_config(archlab.load_recipe("recipes/deepseek/v3-tiny.yaml",
                                                                ["model.n_layers=2"])))
    out = export_hf(model, tmp_path / "hf")
    hf = AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(hf).__name__ == "DeepseekV3ForCausalLM"
    assert_same_logits(model, hf, S=16)


def _with(c: ModelConfig, **moe) -> ModelConfig:
    """``c`` with some MoE fields (or router fields, prefixed ``router_``) replaced."""
    router = {k[len("router_"):]: v for k, v in moe.items() if k.startswith("router_")}
    rest = {k: v for k, v in moe.items() if not k.startswith("router_")}
    m = c.moe
    new_router = RouterConfig(**{**m.router.__dict__, **router})
    return ModelConfig(**{**c.__dict__, "moe": MoEConfig(**{**m.__dict__, **rest, "router": new_router})})


def _refusals():
    c = deepseek(0)
    plain, mla = dict(c.__dict__), c.attention
    return [
        (_with(c, router_type="softmax_topk"), ["moe.router.type=softmax_topk", "sigmoid top-k"]),
        (_with(c, num_experts=4, top_k=2, router_n_groups=4, router_topk_groups=2),
         ["moe.router.n_groups=4", "two best scores", ">= 2 experts per group"]),
        (_with(c, capacity_factor=1.0), ["moe.capacity_factor", "dropless"]),
        (_with(c, every=2, first_k_dense=0), ["moe.every=2"]),
        (_with(c, n_shared_experts=1, shared_hidden=c.moe.expert_hidden + 4), ["shared-expert width", "multiple"]),
        (ModelConfig(**{**plain, "norm": NormConfig(type="rmsnorm", eps=1e-5)}), ["norm.eps=1e-05", "eps 1e-06"]),
        (ModelConfig(**{**plain, "norm": NormConfig(type="layernorm", eps=1e-6)}), ["norm.type=layernorm"]),
        (ModelConfig(**{**plain, "norm": NormConfig(type="rmsnorm", eps=1e-6, placement="post")}),
         ["norm.placement=post"]),
        (ModelConfig(**{**plain, "position": PositionConfig(type="rope", rope_scaling=RopeScalingConfig(type="ntk"))}),
         ["rope_scaling.type=ntk"]),
        (ModelConfig(**{**plain, "attention": MLAConfig(**{**mla.__dict__, "scale": 0.5})}),
         ["attention.scale=0.5"]),
        (ModelConfig(**{**plain, "ffn": FFNConfig(type="swiglu", bias=True, hidden=40)}), ["ffn.bias=true"]),
        (ModelConfig(**{**plain, "ffn": FFNConfig(type="gelu", bias=False, hidden=40)}), ["ffn.type=gelu"]),
        (ModelConfig(**{**plain, "parametrization": "mup", "mup_base_width": c.d_model // 2}),
         ["parametrization=mup at width multiplier 2"]),
    ]


@pytest.mark.parametrize("case", range(len(_refusals())))
def test_inexpressible_models_are_refused_with_the_reason(case):
    c, expected = _refusals()[case]
    why = ADAPTERS.get("deepseek_v3")().matches(c)
    assert why is not None
    for part in expected:
        assert part in why, why
    with pytest.raises(ValueError, match="no Hugging Face class can express"):
        find_adapter(c)


def test_mha_models_are_not_taken_and_mla_only_by_deepseek_v3():
    """The deepseek/tiny recipe (grouped-query attention) has no DeepSeek-V3 counterpart; an MLA
    model none other than DeepSeek-V3's."""
    mha = archlab.model_config(archlab.load_recipe("recipes/deepseek/tiny.yaml"))
    assert "attention.type=mha" in ADAPTERS.get("deepseek_v3")().matches(mha)
    c = deepseek(1)
    assert all(ADAPTERS.get(f)().matches(c) is not None for f in ADAPTERS.names() if f != "deepseek_v3")
    for family in ("gpt2", "llama", "mistral"):
        assert "attention.type=mla" in ADAPTERS.get(family)().matches(deepseek(1, moe=False)), family
    assert type(find_adapter(c)).__name__ == "DeepseekV3Adapter"


def test_the_exportable_recipes_it_names_are_the_deepseek_recipes_that_export():
    root = Path(__file__).resolve().parents[2]
    exportable = []
    for path in sorted((root / "recipes/deepseek").glob("*.yaml")):
        try:
            find_adapter(archlab.model_config(archlab.load_recipe(path)))
        except ValueError:
            continue
        exportable.append(f"recipes/deepseek/{path.name}")
    assert sorted(DeepseekV3Adapter.exportable_recipes) == exportable
    assert DeepseekV3Adapter.exportable_recipes[0] == "recipes/deepseek/v3-tiny.yaml"  # the one a refusal suggests
