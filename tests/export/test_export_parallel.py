"""The parallel block exported to GPTJForCausalLM (one shared norm) and GPTNeoXForCausalLM
(use_parallel_residual, two norms): logits equal on random weights (fp32, CPU, default assert_close
tolerances), KV-cache generation equal, the folder loads with AutoModelForCausalLM, and what
neither class can express refused with the reason.

Shape legend: B batch, S sequence, V vocabulary.
"""

import pytest
import torch
from test_export_hf import randomised

import archlab
from archlab.config.schema import AttentionConfig, BlockConfig, FFNConfig, ModelConfig, NormConfig, PositionConfig
from archlab.hf import export_hf, find_adapter, to_hf_model
from archlab.nn.norms import LayerNormConfig

V = 97


def parallel(shared: bool, **kw) -> ModelConfig:
    base = dict(vocab_size=V, max_seq_len=64, d_model=48, n_layers=2, n_heads=4,
                norm=NormConfig(type="layernorm"), position=PositionConfig(type="rope"), ffn=FFNConfig(type="gelu"),
                attention=AttentionConfig(bias=not shared), block=BlockConfig(type="parallel", shared_norm=shared),
                tie_embeddings=False)
    base.update(kw)
    return ModelConfig(**base)


PARITY = {  # name -> (config, HF class)
    "gptj": (parallel(True), "GPTJForCausalLM"),
    "gptj-gqa-tied": (parallel(True, n_kv_heads=2, tie_embeddings=True), "GPTJForCausalLM"),
    "gptj-relu-no-bias": (parallel(True, ffn=FFNConfig(type="relu", bias=False, hidden=64),
                                   norm=LayerNormConfig(bias=False, eps=1e-6)), "GPTJForCausalLM"),
    "neox": (parallel(False), "GPTNeoXForCausalLM"),
    "neox-mqa": (parallel(False, n_kv_heads=1), "GPTNeoXForCausalLM"),
    "neox-no-bias-base": (parallel(False, attention=AttentionConfig(bias=False),
                                   position=PositionConfig(type="rope", rope_base=50000.0)), "GPTNeoXForCausalLM"),
    "neox-tied-relu": (parallel(False, tie_embeddings=True, ffn=FFNConfig(type="relu")), "GPTNeoXForCausalLM"),
}


@pytest.mark.parametrize("name", list(PARITY))
def test_logits_equal_after_export(name):
    c, hf_class = PARITY[name]
    model = randomised(c)
    hf = to_hf_model(model)
    assert type(hf).__name__ == hf_class
    assert hf.config.tie_word_embeddings == c.tie_embeddings
    if hf_class == "GPTNeoXForCausalLM":
        assert hf.config.use_parallel_residual
    ids = torch.randint(0, V, (2, 40))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids).logits)


@pytest.mark.parametrize("name", ["gptj-gqa-tied", "neox"])
def test_hf_kv_cache_generation_matches_archlab(name):
    model = randomised(PARITY[name][0])
    hf = to_hf_model(model)
    prompt = torch.randint(0, V, (2, 6))
    ours = archlab.generate(model, prompt, 12, temperature=0)
    theirs = hf.generate(prompt, max_new_tokens=12, do_sample=False, attention_mask=torch.ones_like(prompt),
                         pad_token_id=0)
    assert torch.equal(ours, theirs)


def test_the_gptj_recipe_exports_and_loads_with_auto_model(tmp_path):
    from transformers import AutoModelForCausalLM

    cfg = archlab.load_recipe("recipes/gptj/tiny.yaml", ["model.vocab_size=300", "model.n_layers=2"])
    model = randomised(archlab.model_config(cfg))
    hf = AutoModelForCausalLM.from_pretrained(export_hf(model, tmp_path / "hf")).eval()
    assert type(hf).__name__ == "GPTJForCausalLM"
    ids = torch.randint(0, 300, (1, 30))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids).logits)


@pytest.mark.parametrize("c, expected", [
    (parallel(True, attention=AttentionConfig(bias=True)), ["gptj", "attention.bias=true", "gpt_neox",
                                                            "block.shared_norm=True", "two norms"]),
    (parallel(True, position=PositionConfig(type="rope", rope_base=5e5)), ["gptj", "rope_base=500000.0"]),
    (parallel(False, norm=NormConfig(type="rmsnorm")), ["gpt_neox", "norm.type=rmsnorm", "GPT-NeoX"]),
    (parallel(False, ffn=FFNConfig(type="swiglu")), ["gpt_neox", "ffn.type=swiglu", "not gated"]),
    (parallel(False, position=PositionConfig(type="learned")), ["gpt_neox", "position.type=learned"]),
    (parallel(False, norm=NormConfig(type="layernorm", placement="post")), ["placement=post"]),
])
def test_what_gptj_and_gpt_neox_cannot_express_is_refused_with_the_reason(c, expected):
    with pytest.raises(ValueError, match="no Hugging Face class can express") as err:
        find_adapter(c)
    for part in expected:
        assert part in str(err.value), str(err.value)


def test_a_sequential_family_never_takes_a_parallel_model():
    from archlab.hf import ADAPTERS

    c = parallel(False, position=PositionConfig(type="learned"))  # otherwise GPT-2's: learned, LayerNorm, GELU
    reason = ADAPTERS.get("gpt2")().matches(c)
    assert reason is not None and "block.type=parallel" in reason and "attention, then the FFN" in reason


def test_sequential_models_still_go_to_gpt2():
    c = parallel(True, block=BlockConfig(), position=PositionConfig(type="learned"),
                 attention=AttentionConfig(bias=True))
    assert find_adapter(c).hf_class_name == "GPT2LMHeadModel"
