"""Export to Hugging Face: logits equal after export (fp32, CPU, default assert_close tolerances),
the folder loads with AutoModelForCausalLM, and inexpressible models are refused with the reason.

Shape legend: B batch, S sequence, V vocabulary.
"""

import pytest
import torch

import archlab
from archlab.config.schema import (
    AttentionConfig,
    FFNConfig,
    ModelConfig,
    NormConfig,
    PositionConfig,
    RopeScalingConfig,
)
from archlab.hf import ADAPTERS, export_hf, find_adapter, to_hf_model
from archlab.nn.attention import MHAConfig
from archlab.nn.norms import LayerNormConfig

V = 97


def gpt(**kw) -> ModelConfig:
    base = dict(vocab_size=V, max_seq_len=64, d_model=48, n_layers=2, n_heads=4,
                norm=NormConfig(type="layernorm"), position=PositionConfig(type="learned"), ffn=FFNConfig(type="gelu"))
    base.update(kw)
    return ModelConfig(**base)


def llama(scaling: str = "none", **kw) -> ModelConfig:
    sc = RopeScalingConfig(type=scaling, factor=1.0 if scaling == "none" else 4.0,
                           original_max_seq_len=16 if scaling == "yarn" else None)
    base = dict(vocab_size=V, max_seq_len=64, d_model=48, n_layers=2, n_heads=4, n_kv_heads=2,
                norm=NormConfig(type="rmsnorm", eps=1e-6), position=PositionConfig(type="rope", rope_scaling=sc),
                attention=AttentionConfig(bias=False), ffn=FFNConfig(type="swiglu", bias=False, hidden=80),
                tie_embeddings=False)
    base.update(kw)
    return ModelConfig(**base)


PARITY = {
    "gpt2": gpt(),
    "gpt2-gqa": gpt(n_kv_heads=2),
    "gpt2-mqa-untied": gpt(n_kv_heads=1, tie_embeddings=False),
    "gpt2-no-bias": gpt(attention=AttentionConfig(bias=False), ffn=FFNConfig(type="gelu", bias=False),
                        norm=LayerNormConfig(bias=False)),
    "gpt2-relu": gpt(ffn=FFNConfig(type="relu", hidden=64), norm=NormConfig(type="layernorm", eps=1e-6)),
    "llama-gqa": llama(),
    "llama-mqa": llama(n_kv_heads=1),
    "llama-mha-tied": llama(n_kv_heads=4, tie_embeddings=True),
    "llama-rope-linear": llama("linear"),
    "llama-rope-yarn": llama("yarn"),
    "llama-bias-base": llama(attention=AttentionConfig(bias=True), ffn=FFNConfig(type="swiglu", bias=True),
                             position=PositionConfig(type="rope", rope_base=500000.0)),
    "llama-mup-at-base-width": llama(parametrization="mup", mup_base_width=48),  # m = 1: standard exactly
}


def randomised(c: ModelConfig) -> torch.nn.Module:
    """A model whose norms and biases are not at their init values (ones/zeros would hide a swap)."""
    model = archlab.build_model(c).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(torch.randn_like(p) * 0.3 + (1.0 if name.endswith("norm.weight") else 0.0))
    return model


@pytest.mark.parametrize("name", list(PARITY))
def test_logits_equal_after_export(name):
    c = PARITY[name]
    model = randomised(c)
    hf = to_hf_model(model)
    expected_cls = "GPT2LMHeadModel" if name.startswith("gpt2") else "LlamaForCausalLM"
    assert type(hf).__name__ == expected_cls
    ids = torch.randint(0, V, (2, 40))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids).logits)
    assert sum(p.numel() for p in hf.parameters()) >= archlab.num_params(c)  # GQA -> MHA grows GPT-2


@pytest.mark.parametrize("name", ["gpt2-gqa", "llama-rope-yarn"])
def test_hf_kv_cache_generation_matches_archlab(name):
    model = randomised(PARITY[name])
    hf = to_hf_model(model)
    prompt = torch.randint(0, V, (2, 6))
    ours = archlab.generate(model, prompt, 10, temperature=0)
    theirs = hf.generate(prompt, max_new_tokens=10, do_sample=False, attention_mask=torch.ones_like(prompt),
                         pad_token_id=0)
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("name", ["gpt2-mqa-untied", "llama-gqa"])
def test_exported_folder_loads_with_auto_model(name, tmp_path):
    from transformers import AutoModelForCausalLM

    model = randomised(PARITY[name])
    out = export_hf(model, tmp_path / "hf")
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name != "hf"]  # no temporary folder left behind
    hf = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.randint(0, V, (1, 30))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids).logits)
    with pytest.raises(FileExistsError, match="already exists"):
        export_hf(model, out)
    export_hf(model, out, overwrite=True)


REFUSED = [
    (gpt(position=PositionConfig(type="alibi")), ["gpt2", "position.type=alibi", "llama", "norm.type=layernorm"]),
    (gpt(norm=NormConfig(type="layernorm", placement="post")), ["placement=post", "pre-LN"]),
    (llama("ntk"), ["rope_scaling.type=ntk", "no static NTK"]),
    (llama(norm=NormConfig(type="rmsnorm", placement="post")), ["placement=post"]),
    (llama(attention=MHAConfig(bias=False, qk_norm=True)), ["qk_norm"]),
    (llama(attention=AttentionConfig(bias=False, scale=1.0)), ["attention.scale=1.0"]),
    (gpt(ffn=FFNConfig(type="swiglu")), ["gpt2", "ffn.type=swiglu", "not gated"]),
    (llama(ffn=FFNConfig(type="gelu")), ["llama", "ffn.type=gelu", "SwiGLU"]),
    (llama(position=PositionConfig(type="sinusoidal")), ["position.type=sinusoidal", "no Hugging Face decoder"]),
    (llama(parametrization="mup", mup_base_width=24), ["parametrization=mup at width multiplier 2", "readout"]),
    (gpt(parametrization="mup", mup_base_width=96), ["gpt2", "width multiplier 0.5", "attention scale"]),
    (gpt(scale_embeddings=True), ["gpt2", "scale_embeddings=true", "sqrt(d_model)", "llama"]),
    (llama(scale_embeddings=True), ["llama", "scale_embeddings=true", "MixtralForCausalLM"]),
]


@pytest.mark.parametrize("c,expected", REFUSED)
def test_inexpressible_models_are_refused_with_the_reason(c, expected):
    with pytest.raises(ValueError, match="no Hugging Face class can express") as err:
        find_adapter(c)
    for part in expected:
        assert part in str(err.value), str(err.value)


def test_moe_models_are_not_taken_by_dense_exporters():
    from archlab.config.schema import MoEConfig

    c = llama(moe=MoEConfig(num_experts=4, top_k=2, expert_hidden=32))
    assert ADAPTERS.get("gpt2")().matches(c) is not None
    assert "MoE" in ADAPTERS.get("llama")().matches(c)


def test_mup_moe_models_are_refused_too():
    from archlab.config.schema import MoEConfig

    c = llama(moe=MoEConfig(num_experts=4, top_k=2, expert_hidden=32), parametrization="mup", mup_base_width=24)
    with pytest.raises(ValueError, match="no Hugging Face class can express") as err:
        find_adapter(c)
    (mixtral,) = [line for line in str(err.value).splitlines() if "MixtralForCausalLM" in line]
    assert "parametrization=mup at width multiplier 2" in mixtral, str(err.value)
