"""Qwen3-Next both ways (``archlab/hf/adapters/qwen3_next.py``): a random tiny ``Qwen3NextForCausalLM`` (pure
Gated DeltaNet, the hybrid, pure gated attention; dense MLPs) imports with its logits, exports back tensor for
tensor; an archlab hybrid exports with its logits and greedy cached generation; MoE layers and what the class
lacks are refused by name.

On the CPU without the hub kernels (no network) transformers runs its torch reference of the conv and the
chunked gated delta rule, as archlab's ``gdn_kernels: torch`` does. Logits agree to ~1e-5 in fp32 (the two
chunked forms sum in different orders), hence ``atol=5e-5``.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

import archlab
from archlab.hf import ADAPTERS, export_hf, find_adapter, to_hf_model
from archlab.train.checkpoint import load_model

transformers = pytest.importorskip("transformers")

V = 300  # >= archlab's 260 for a recipe without a tokenizer file
TOL = dict(atol=5e-5, rtol=1e-5)
LAYER_TYPES = {
    "gdn": ["linear_attention"] * 2,
    "hybrid": ["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 2,
    "attention": ["full_attention"] * 2,
}
ZERO_CENTRED = ("input_layernorm", "post_attention_layernorm", "model.norm", "q_norm", "k_norm")


def hf_config(layer_types: list[str], **kw):
    base = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=len(layer_types),
                layer_types=layer_types, mlp_only_layers=list(range(len(layer_types))), linear_num_key_heads=2,
                linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=6, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, max_position_embeddings=64, rms_norm_eps=1e-6)
    return transformers.Qwen3NextConfig(**{**base, **kw})


def random_hf(config, seed: int = 0):
    """Every tensor drawn (the zero-centred norms' w around 0, so their gains 1 + w around 1)."""
    torch.manual_seed(seed)
    hf = transformers.Qwen3NextForCausalLM(config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    return hf


def logits(model_or_hf, ids, hf: bool = False):
    with torch.no_grad():
        return model_or_hf(ids, use_cache=False).logits if hf else model_or_hf(ids).logits


@pytest.mark.parametrize("name", list(LAYER_TYPES))
def test_import_keeps_the_logits_and_export_gives_back_the_tensors(name, tmp_path):
    hf = random_hf(hf_config(LAYER_TYPES[name]))
    hf.save_pretrained(tmp_path / "hf")
    model, _ = load_model(archlab.from_hf(tmp_path / "hf", tmp_path / "run"))
    ids = torch.randint(0, V, (2, 23))
    theirs, ours = logits(hf, ids, hf=True), logits(model, ids)
    torch.testing.assert_close(ours, theirs, **TOL)
    print(f"{name}: max |logit diff| {float((theirs - ours).abs().max()):.2e}")

    out = export_hf(model, tmp_path / "back")
    before, after = load_file(str(tmp_path / "hf" / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert sorted(before) == sorted(after)
    for key in before:  # a zero-centred gain is stored as 1 + w: one float32 rounding of it
        if any(part in key for part in ZERO_CENTRED) and "linear_attn" not in key:
            torch.testing.assert_close(after[key], before[key], atol=2.5e-7, rtol=0)
        else:
            assert torch.equal(after[key], before[key]), key
    back = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert back.config.layer_types == LAYER_TYPES[name]
    torch.testing.assert_close(logits(back, ids, hf=True), ours, **TOL)


def test_the_hybrid_imports_as_a_layer_pattern_with_gated_partial_rope_attention(tmp_path):
    random_hf(hf_config(LAYER_TYPES["hybrid"])).save_pretrained(tmp_path / "hf")
    model, _ = load_model(archlab.from_hf(tmp_path / "hf", tmp_path / "run"))
    m = model.cfg
    assert list(m.layers.pattern) == ["gated_deltanet"] * 3 + ["mha"]
    a = m.attention
    assert (a.output_gate, a.rotary_fraction, a.qk_norm, a.qk_norm_over) == (True, 0.25, True, "head")
    assert (a.gdn_k_heads, a.gdn_v_heads, a.gdn_k_head_dim, a.gdn_v_head_dim) == (2, 4, 8, 6)
    assert m.position.type == "rope" and m.rotary_dim == 2  # a quarter of the head dim 8


def hybrid_recipe(extra: tuple[str, ...] = ()):
    return archlab.load_recipe("recipes/hybrid/qwen3-next-tiny.yaml",
                               ["model.vocab_size=300", "model.d_model=64", "model.n_layers=8",
                                "model.attention.gdn_chunk_size=8", "model.attention.gdn_kernels=torch", *extra])


def randomised(cfg):
    torch.manual_seed(0)
    model = archlab.build_model(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            gain = p.ndim == 1 and "norm" in name
            p.copy_(1.0 + 0.2 * torch.randn_like(p) if gain else 0.2 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("extra", [(), ("model.tie_embeddings=true", "model.attention.rotary_fraction=0.5")])
def test_an_archlab_hybrid_exports_with_its_logits(extra):
    model = randomised(hybrid_recipe(extra))
    assert find_adapter(model.cfg).family == "qwen3_next"
    hf = to_hf_model(model)
    assert type(hf).__name__ == "Qwen3NextForCausalLM"
    assert hf.config.layer_types == (["linear_attention"] * 3 + ["full_attention"]) * 2
    assert hf.config.mlp_only_layers == list(range(8))
    ids = torch.randint(0, 300, (2, 21))
    torch.testing.assert_close(logits(hf, ids, hf=True), logits(model, ids), **TOL)


def test_hf_cached_generation_matches_archlab():
    """Greedy decoding with each side's cache: Gated DeltaNet states and conv inputs, gated attention's K/V."""
    model = randomised(hybrid_recipe())
    hf = to_hf_model(model)
    prompt = torch.randint(0, 300, (2, 9))
    ours = archlab.generate(model, prompt, 12, temperature=0)
    theirs = hf.generate(prompt, max_new_tokens=12, do_sample=False, attention_mask=torch.ones_like(prompt),
                         pad_token_id=0)
    assert torch.equal(ours, theirs)


def test_the_state_dict_round_trips_exactly():
    """to_hf, the HF storage (w = gain - 1) and back: every archlab entry read from the entry it was written to."""
    model = randomised(hybrid_recipe())
    adapter = ADAPTERS.get("qwen3_next")()
    stored = adapter.finish_hf({k: v.detach().clone() for k, v in adapter.to_hf(model).items()})
    assert torch.equal(stored["model.norm.weight"], model.final_norm.weight.detach() - 1)
    copy = archlab.build_model(model.cfg)
    adapter.from_hf(copy, adapter.prepare_hf(stored, {}))
    mine, theirs = model.state_dict(), copy.state_dict()
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)


def test_moe_layers_are_refused_on_import_naming_the_shared_expert_gate(tmp_path):
    config = hf_config(LAYER_TYPES["gdn"], mlp_only_layers=[0], num_experts=4, num_experts_per_tok=2,
                       moe_intermediate_size=16, shared_expert_intermediate_size=16)
    config.save_pretrained(tmp_path / "hf")
    with pytest.raises(ValueError, match=r"config.json: mlp_only_layers=\[0\]: archlab supports dense MLPs only "
                                         r".*shared_expert_gate") as err:
        archlab.from_hf(tmp_path / "hf", tmp_path / "run")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("key, value, rule", [
    ("attention_bias", True, "attention_bias=false"),
    ("hidden_act", "gelu", "hidden_act='silu'"),
    ("layer_types", ["linear_attention", "sliding_attention"], "linear_attention or full_attention"),
])
def test_a_key_archlab_cannot_express_is_refused_by_name(key, value, rule, tmp_path):
    config = hf_config(LAYER_TYPES["gdn"])
    setattr(config, key, value)
    config.save_pretrained(tmp_path / "hf")
    with pytest.raises(ValueError, match=rf"config.json: {key}=.*archlab supports .*{rule}"):
        archlab.from_hf(tmp_path / "hf", tmp_path / "run")


@pytest.mark.parametrize("extra, reason", [
    (("model.attention.output_gate=false",), "attention.output_gate=false: Qwen3-Next gates"),
    (("model.attention.qk_norm=false",), "attention.qk_norm: Qwen3-Next normalises q and k per head"),
    (("model.moe.num_experts=4", "model.moe.expert_hidden=16"), "shared_expert_gate"),
    (("model.ffn.bias=true",), "ffn.bias=true"),
])
def test_what_qwen3_next_cannot_express_is_refused_with_the_reason(extra, reason):
    cfg = archlab.model_config(hybrid_recipe(extra))
    why = ADAPTERS.get("qwen3_next")().matches(cfg)
    assert why is not None and reason in why
    with pytest.raises(ValueError, match="no Hugging Face class can express"):
        find_adapter(cfg)


def test_no_other_family_exports_a_gated_or_partly_rotated_attention():
    """A LLaMA recipe with the output gate or partial RoPE (no q/k norm) is not silently a LlamaForCausalLM."""
    for over, reason in (("model.attention.output_gate=true", "attention.output_gate=true"),
                         ("model.attention.rotary_fraction=0.5", "attention.rotary_fraction=0.5")):
        cfg = archlab.model_config(archlab.load_recipe("recipes/llama/tiny.yaml", [over]))
        assert reason in ADAPTERS.get("llama")().matches(cfg)
        with pytest.raises(ValueError, match="no Hugging Face class can express"):
            find_adapter(cfg)
