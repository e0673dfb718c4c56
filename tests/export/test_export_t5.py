"""Export to ``T5ForConditionalGeneration``: logits equal (fp32, CPU, default assert_close tolerances) for random
small encoder-decoders and the t5 recipes, greedy generation with the cross-attention cache equal to HF's
``generate``, the folder loads with ``from_pretrained``, and what T5 cannot express is refused with the reason.

Shape legend: B batch, M encoder positions, S decoder positions, V vocabulary.
"""

import random

import pytest
import torch

import archlab
from archlab.config.schema import FFNConfig, ModelConfig, NormConfig, PositionConfig
from archlab.hf import export_hf, find_adapter, to_hf_model
from archlab.model import generate_seq2seq
from archlab.nn.attention import MHAConfig
from archlab.nn.ffn import SwiGLUConfig

V = 101


def encoder_decoder(seed: int) -> ModelConfig:
    """A random small T5: widths, layers, heads (GQA/MQA too), buckets and their reach, FFN width, eps and
    the attention's score scale."""
    rng = random.Random(seed)
    n_heads = rng.choice([1, 2, 4])
    buckets = rng.choice([8, 16, 32])
    return ModelConfig(
        type="encoder_decoder", vocab_size=V, d_model=rng.choice([32, 48]), n_layers=rng.choice([1, 2, 3]),
        n_heads=n_heads, n_kv_heads=rng.choice([None, *[g for g in (1, 2) if n_heads % g == 0]]),
        norm=NormConfig(type="rmsnorm", placement="pre", eps=rng.choice([1e-6, 1e-5])),
        position=PositionConfig(type="relative", relative_buckets=buckets,
                                relative_max_distance=rng.choice([buckets, 4 * buckets])),
        attention=MHAConfig(bias=False, scale=rng.choice([None, 1.0, 0.3])),
        ffn=FFNConfig(type="relu", bias=False, hidden=rng.choice([None, 40])), tie_embeddings=True,
    )


def randomised(c) -> torch.nn.Module:
    """Every parameter redrawn at 0.2 (norm gains around 1): attention far from uniform, the bias tables and
    gains off their init values, and logits not dominated by the unit-scale token table."""
    model = archlab.build_model(c).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * 0.2 + (1.0 if "norm.weight" in name else 0.0))
    return model


def assert_same_logits(model, hf, M: int = 40, S: int = 17) -> float:
    ids = torch.randint(0, model.cfg.vocab_size, (2, M))
    dec = torch.randint(0, model.cfg.vocab_size, (2, S))
    with torch.no_grad():
        theirs, ours = hf(input_ids=ids, decoder_input_ids=dec).logits, model(ids, dec).logits
    torch.testing.assert_close(theirs, ours)
    return float((theirs - ours).abs().max())


@pytest.mark.parametrize("seed", range(8))
def test_logits_equal_after_export_for_random_configs(seed):
    model = randomised(encoder_decoder(seed))
    hf = to_hf_model(model)
    assert type(hf).__name__ == "T5ForConditionalGeneration"
    assert_same_logits(model, hf, M=rng_len(seed), S=9 + seed)


def rng_len(seed: int) -> int:
    """Encoder lengths past the buckets' reach too (offsets that share the last log bucket)."""
    return [12, 40, 150, 33, 64, 200, 7, 90][seed]


@pytest.mark.parametrize("seed", [0, 3, 5])
def test_greedy_generation_with_the_cross_attention_cache_equals_hf_generate(seed):
    model = randomised(encoder_decoder(seed))
    hf = to_hf_model(model)
    ids = torch.randint(0, V, (3, 25))
    ours = generate_seq2seq(model, ids, 15, temperature=0)
    theirs = hf.generate(input_ids=ids, max_new_tokens=15, min_new_tokens=15, do_sample=False)
    assert torch.equal(ours, theirs)
    assert len(set(ours[:, 1:].flatten().tolist())) > 2  # not a constant sequence both would agree on trivially


@pytest.mark.parametrize("name", ["tiny", "mini"])
def test_the_t5_recipes_export_with_equal_logits(name):
    cfg = archlab.load_recipe(f"recipes/t5/{name}.yaml", ["model.n_layers=2", "model.vocab_size=300"])
    model = randomised(archlab.model_config(cfg))
    hf = to_hf_model(model)
    assert hf.config.feed_forward_proj == "relu" and hf.config.relative_attention_num_buckets == 32
    assert_same_logits(model, hf, M=120, S=25)
    # MHA, no biases: the same parameters (HF's shared table counted once)
    assert sum(p.numel() for p in hf.parameters()) == archlab.num_params(model.cfg)


def test_the_exported_folder_loads_with_from_pretrained(tmp_path):
    from transformers import AutoModelForSeq2SeqLM

    model = randomised(encoder_decoder(2))
    out = export_hf(model, tmp_path / "t5")
    hf = AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    assert type(hf).__name__ == "T5ForConditionalGeneration"
    assert_same_logits(model, hf)


def _variant(**changes) -> ModelConfig:
    c = encoder_decoder(0)
    for key, value in changes.items():
        setattr(c, key, value)
    return c


@pytest.mark.parametrize("cfg, reason", [
    (_variant(norm=NormConfig(type="rmsnorm", placement="post")), "norm.placement=post: T5 is pre-LN"),
    (_variant(norm=NormConfig(type="layernorm", placement="pre")), "norm.type=layernorm: LayerNorm with a mean"),
    (_variant(tie_embeddings=False), "tie_embeddings=false: transformers' T5 always ties"),
    (_variant(attention=MHAConfig(bias=True)), "attention.bias / ffn.bias: T5's projections have no biases"),
    (_variant(position=PositionConfig(type="rope")), "position.type=rope: RoPE: GPT-2 and BERT"),
    (_variant(ffn=SwiGLUConfig(bias=False)), "ffn.type=swiglu: SwiGLU"),
])
def test_what_t5_cannot_express_is_refused_with_the_reason(cfg, reason):
    with pytest.raises(ValueError) as err:
        find_adapter(cfg)
    assert f"t5 (T5ForConditionalGeneration): {reason}" in str(err.value), str(err.value)


def test_a_decoder_or_an_encoder_is_not_exported_as_t5():
    decoder = archlab.model_config(archlab.load_recipe("recipes/dense/tiny.yaml", ["model.vocab_size=300"]))
    decoder.norm.placement = "post"
    with pytest.raises(ValueError, match=r"t5 \(T5ForConditionalGeneration\): model.type=decoder: a causal decoder"):
        find_adapter(decoder)
    with pytest.raises(ValueError) as err:
        find_adapter(_variant(norm=NormConfig(type="rmsnorm", placement="post")))
    assert "gpt2 (GPT2LMHeadModel): model.type=encoder_decoder: an encoder-decoder" in str(err.value)
