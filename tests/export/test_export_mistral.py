"""Sliding-window attention exported to MistralForCausalLM: logits equal for sequences longer
than the window (fp32, CPU, default assert_close tolerances), KV-cache generation equal past the
window, and the settings Mistral cannot express refused with the reason.

Shape legend: B batch, S sequence, W window, V vocabulary.
"""

import pytest
import torch
from test_export_hf import randomised

import archlab
from archlab.config.schema import AttentionConfig, FFNConfig, ModelConfig, NormConfig, PositionConfig
from archlab.hf import export_hf, find_adapter, to_hf_model
from archlab.nn.attention import SlidingWindowConfig

V = 97


def mistral(window: int = 7, **kw) -> ModelConfig:
    attention = kw.pop("attention", SlidingWindowConfig(window=window, bias=False))
    base = dict(vocab_size=V, max_seq_len=128, d_model=48, n_layers=2, n_heads=4, n_kv_heads=2,
                norm=NormConfig(type="rmsnorm", eps=1e-6), position=PositionConfig(type="rope"),
                attention=attention, ffn=FFNConfig(type="swiglu", bias=False, hidden=80), tie_embeddings=False)
    base.update(kw)
    return ModelConfig(**base)


PARITY = {
    "w7-gqa": mistral(7),
    "w16-mqa": mistral(16, n_kv_heads=1),
    "w5-mha-tied": mistral(5, n_kv_heads=4, tie_embeddings=True),
    "w1": mistral(1),
    "w12-rope-base": mistral(12, position=PositionConfig(type="rope", rope_base=1e6), n_layers=3),
}


@pytest.mark.parametrize("name", list(PARITY))
def test_logits_equal_after_export_past_the_window(name):
    model = randomised(PARITY[name])
    hf = to_hf_model(model)
    assert type(hf).__name__ == "MistralForCausalLM"
    assert hf.config.sliding_window == PARITY[name].attention.window
    ids = torch.randint(0, V, (2, 50))  # several windows long
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids).logits)


@pytest.mark.parametrize("name", ["w7-gqa", "w5-mha-tied"])
def test_hf_kv_cache_generation_matches_archlab_past_the_window(name):
    model = randomised(PARITY[name])
    hf = to_hf_model(model)
    prompt = torch.randint(0, V, (2, 9))
    ours = archlab.generate(model, prompt, 25, temperature=0)
    theirs = hf.generate(prompt, max_new_tokens=25, do_sample=False, attention_mask=torch.ones_like(prompt),
                         pad_token_id=0)
    assert torch.equal(ours, theirs)


def test_exported_folder_loads_with_auto_model(tmp_path):
    from transformers import AutoModelForCausalLM

    model = randomised(PARITY["w7-gqa"])
    hf = AutoModelForCausalLM.from_pretrained(export_hf(model, tmp_path / "hf")).eval()
    ids = torch.randint(0, V, (1, 30))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids).logits)


@pytest.mark.parametrize("c, expected", [
    (mistral(attention=SlidingWindowConfig(window=8, global_every=2, bias=False)),
     ["mistral", "global_every=2"]),
    (mistral(attention=SlidingWindowConfig(window=8, bias=True)), ["mistral", "biases"]),
    (mistral(norm=NormConfig(type="layernorm")), ["mistral", "norm.type=layernorm"]),
    (mistral(position=PositionConfig(type="none")), ["position.type=none", "NoPE"]),
])
def test_what_mistral_cannot_express_is_refused_with_the_reason(c, expected):
    with pytest.raises(ValueError, match="no Hugging Face class can express") as err:
        find_adapter(c)
    for part in expected:
        assert part in str(err.value), str(err.value)


def test_full_attention_models_still_go_to_llama():
    c = mistral(attention=AttentionConfig(bias=False))  # type mha
    assert find_adapter(c).hf_class_name == "LlamaForCausalLM"
