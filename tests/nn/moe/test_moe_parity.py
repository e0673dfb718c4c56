"""Parity with Hugging Face ``transformers`` (fp32, CPU): the MoE blocks of DeepSeek-V3 and
Mixtral with the same weights, and whole Mixtral / Qwen3-MoE models after export."""

import pytest
import torch

from archlab import build_model, load_recipe
from archlab.config.schema import (
    BalanceConfig,
    FFNConfig,
    ModelConfig,
    MoEConfig,
    NormConfig,
    PositionConfig,
    RouterConfig,
)
from archlab.hf import export_hf, find_adapter, to_hf_model
from archlab.hf.adapters.mixtral import MixtralAdapter
from archlab.hf.adapters.qwen3_moe import Qwen3MoeAdapter
from archlab.nn.moe import MoELayer


def moe_cfg(d=64, **moe) -> ModelConfig:
    router = RouterConfig(**moe.pop("router", {}))
    balance = BalanceConfig(**moe.pop("balance", {}))
    return ModelConfig(d_model=d, n_heads=4, ffn=FFNConfig(type="swiglu", bias=False),
                       moe=MoEConfig(**moe, router=router, balance=balance))


def load_hf_experts(hf_experts, layer: MoELayer) -> None:
    with torch.no_grad():
        hf_experts.gate_up_proj.copy_(layer.experts.w_up.transpose(1, 2))
        hf_experts.down_proj.copy_(layer.experts.w_down.transpose(1, 2))


def test_moe_block_equals_hf_deepseek_v3_moe():
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

    cfg = moe_cfg(num_experts=16, top_k=4, expert_hidden=32, n_shared_experts=2,
                  router=dict(type="sigmoid_topk", n_groups=4, topk_groups=2, route_scale=2.5),
                  balance=dict(bias_update_rate=1e-3))
    layer = MoELayer(cfg).eval()
    with torch.no_grad():
        layer.router.expert_bias.copy_(torch.randn(16) * 0.1)  # a trained-looking correction bias
    hf_cfg = DeepseekV3Config(hidden_size=64, moe_intermediate_size=32, n_routed_experts=16, num_experts_per_tok=4,
                              n_shared_experts=2, n_group=4, topk_group=2, norm_topk_prob=True,
                              routed_scaling_factor=2.5, hidden_act="silu")
    hf = DeepseekV3MoE(hf_cfg).eval()
    with torch.no_grad():
        hf.gate.weight.copy_(layer.router.gate.weight)
        hf.gate.e_score_correction_bias.copy_(layer.router.expert_bias)
        load_hf_experts(hf.experts, layer)
        gate, up = layer.shared.gate_up.weight.chunk(2, dim=0)
        hf.shared_experts.gate_proj.weight.copy_(gate)
        hf.shared_experts.up_proj.weight.copy_(up)
        hf.shared_experts.down_proj.weight.copy_(layer.shared.down.weight)
    x = torch.randn(3, 10, 64)
    y, _ = layer(x)
    torch.testing.assert_close(y, hf(x), rtol=1e-5, atol=1e-6)
    # the bias matters: without it the choice (and the output) differs
    with torch.no_grad():
        hf.gate.e_score_correction_bias.zero_()
    assert not torch.allclose(y, hf(x), atol=1e-4)


def test_moe_block_equals_hf_mixtral_sparse_moe_block():
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    cfg = moe_cfg(num_experts=8, top_k=2, expert_hidden=48)
    layer = MoELayer(cfg).eval()
    hf = MixtralSparseMoeBlock(MixtralConfig(hidden_size=64, intermediate_size=48, num_local_experts=8,
                                             num_experts_per_tok=2)).eval()
    with torch.no_grad():
        hf.gate.weight.copy_(layer.router.gate.weight)
        load_hf_experts(hf.experts, layer)
    x = torch.randn(2, 12, 64)
    torch.testing.assert_close(layer(x)[0], hf(x), rtol=1e-5, atol=1e-6)


def _assert_same_logits(model, hf):
    ids = torch.randint(0, model.cfg.vocab_size, (2, 24))
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, hf(ids).logits, rtol=1e-4, atol=1e-5)


def test_moe_mixtral_tiny_exports_to_mixtral_with_equal_logits(root, tmp_path):
    from transformers import AutoModelForCausalLM

    cfg = load_recipe(root / "recipes/mixtral/tiny.yaml", ["model.n_layers=2", "model.vocab_size=512"])
    model = build_model(cfg)
    assert isinstance(find_adapter(model.cfg), MixtralAdapter)
    hf = to_hf_model(model)
    assert type(hf).__name__ == "MixtralForCausalLM"
    _assert_same_logits(model, hf)
    folder = export_hf(model, tmp_path / "mixtral")
    _assert_same_logits(model, AutoModelForCausalLM.from_pretrained(folder).eval())


def test_moe_qwen3_moe_full_model_parity():
    cfg = ModelConfig(vocab_size=300, max_seq_len=64, d_model=64, n_layers=3, n_heads=4, n_kv_heads=2,
                      norm=NormConfig(type="rmsnorm", eps=1e-6), position=PositionConfig(type="rope"),
                      ffn=FFNConfig(type="swiglu", bias=False), tie_embeddings=False,
                      moe=MoEConfig(num_experts=8, top_k=3, expert_hidden=32, first_k_dense=1,
                                    router=RouterConfig(renormalize=False)))
    cfg.attention.bias = False
    cfg.attention.qk_norm = True
    model = build_model(cfg)
    with torch.no_grad():  # non-trivial norm weights, so that a mis-mapped norm would show
        for n, p in model.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 1.5)
    assert isinstance(find_adapter(model.cfg), Qwen3MoeAdapter)
    hf = to_hf_model(model)
    assert hf.config.mlp_only_layers == [0] and hf.config.norm_topk_prob is False
    _assert_same_logits(model, hf)


def test_moe_deepseek_recipe_has_no_hf_exporter_and_says_why(root):
    cfg = load_recipe(root / "recipes/deepseek/tiny.yaml")
    model = build_model(cfg, device="meta")
    with pytest.raises(ValueError, match="sigmoid_topk"):
        find_adapter(model.cfg)
