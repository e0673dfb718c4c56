"""Export to ``BertForMaskedLM``: logits equal (fp32, CPU, default assert_close tolerances) for random
small encoders and the bert recipes, the folder loads with ``from_pretrained``, and what BERT cannot
express is refused with the reason (a decoder's exporters refuse an encoder, and the other way round).

Shape legend: B batch, S sequence, V vocabulary.
"""

import random

import pytest
import torch

import archlab
from archlab.config.schema import FFNConfig, ModelConfig, NormConfig, PositionConfig
from archlab.hf import export_hf, find_adapter, to_hf_model
from archlab.nn.attention import MHAConfig
from archlab.nn.norms import LayerNormConfig

V = 101


def encoder(seed: int) -> ModelConfig:
    """A random small BERT: widths, heads (GQA/MQA too), GELU or ReLU, biases on or off, tied or not,
    the output bias on or off, the norm's eps."""
    rng = random.Random(seed)
    n_heads = rng.choice([1, 2, 4])
    return ModelConfig(
        type="encoder", vocab_size=V, max_seq_len=48, d_model=rng.choice([32, 48]), n_layers=rng.choice([1, 2, 3]),
        n_heads=n_heads, n_kv_heads=rng.choice([None, *[g for g in (1, 2) if n_heads % g == 0]]),
        norm=LayerNormConfig(placement="post", eps=rng.choice([1e-12, 1e-5]), bias=rng.random() < 0.7),
        position=PositionConfig(type="learned"),
        attention=MHAConfig(bias=rng.random() < 0.7),
        ffn=FFNConfig(type=rng.choice(["gelu", "relu"]), bias=rng.random() < 0.7, hidden=rng.choice([None, 40])),
        tie_embeddings=rng.random() < 0.7, embed_norm=True, head_transform=True, head_bias=rng.random() < 0.7,
    )


def randomised(c) -> torch.nn.Module:
    """Norm gains and every bias (the output bias included) off their init values (ones/zeros would hide
    a swap); matrices x4 so that attention is far from uniform."""
    model = archlab.build_model(c).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(torch.randn_like(p) * 0.3 + (1.0 if "norm.weight" in name else 0.0))
            else:
                p.mul_(4.0)
    return model


def assert_same_logits(model, hf, S: int = 40) -> float:
    ids = torch.randint(0, model.cfg.vocab_size, (2, S))
    with torch.no_grad():
        theirs, ours = hf(ids).logits, model(ids).logits
    torch.testing.assert_close(theirs, ours)
    return float((theirs - ours).abs().max())


@pytest.mark.parametrize("seed", range(8))
def test_logits_equal_after_export_for_random_configs(seed):
    model = randomised(encoder(seed))
    hf = to_hf_model(model)
    assert type(hf).__name__ == "BertForMaskedLM"
    assert_same_logits(model, hf)


def test_every_position_sees_the_whole_window_in_both():
    """Changing the last token changes the first position's logits (no causal mask) in archlab and HF alike."""
    model = randomised(encoder(1))
    hf = to_hf_model(model)
    ids = torch.randint(0, V, (1, 12))
    other = ids.clone()
    other[0, -1] = (ids[0, -1] + 1) % V
    with torch.no_grad():
        for net in (model, hf):
            assert not torch.allclose(net(ids).logits[0, 0], net(other).logits[0, 0])


@pytest.mark.parametrize("name", ["tiny", "mini"])
def test_the_bert_recipes_export_with_equal_logits(name):
    cfg = archlab.load_recipe(f"recipes/bert/{name}.yaml", ["model.n_layers=2", "model.vocab_size=300"])
    model = randomised(archlab.model_config(cfg))
    hf = to_hf_model(model)
    assert hf.config.hidden_act == "gelu_new" and hf.config.layer_norm_eps == 1e-12
    assert_same_logits(model, hf, S=32)
    # every bias present, MHA: HF's only extra parameters are the one-row token-type table (zeros)
    assert sum(p.numel() for p in hf.parameters()) == archlab.num_params(model.cfg) + model.cfg.d_model


def test_the_exported_folder_loads_with_from_pretrained(tmp_path):
    from transformers import AutoModelForMaskedLM

    model = randomised(encoder(2))
    out = export_hf(model, tmp_path / "bert")
    hf = AutoModelForMaskedLM.from_pretrained(out).eval()
    assert type(hf).__name__ == "BertForMaskedLM"
    assert_same_logits(model, hf)


def _variant(**changes) -> ModelConfig:
    c = encoder(0)
    for key, value in changes.items():
        setattr(c, key, value)
    return c


@pytest.mark.parametrize("cfg, reason", [
    (_variant(norm=NormConfig(type="layernorm", placement="pre")), "norm.placement=pre: BERT is post-LN"),
    (_variant(embed_norm=False), "embed_norm=false: BERT always normalises the summed embeddings"),
    (_variant(head_transform=False), "head_transform=false: BERT's MLM head always has"),
    (_variant(position=PositionConfig(type="rope")), "position.type=rope: RoPE: GPT-2 and BERT have learned"),
    (_variant(norm=NormConfig(type="rmsnorm", placement="post")), "norm.type=rmsnorm: RMSNorm: GPT-2 and BERT use"),
    (_variant(attention=MHAConfig(qk_norm=True)), "attention.qk_norm=true: BERT has no per-head q/k norm"),
])
def test_what_bert_cannot_express_is_refused_with_the_reason(cfg, reason):
    with pytest.raises(ValueError) as err:
        find_adapter(cfg)
    assert f"bert (BertForMaskedLM): {reason}" in str(err.value), str(err.value)


def test_a_decoder_is_not_exported_as_bert_nor_an_encoder_as_a_decoder():
    decoder = archlab.model_config(archlab.load_recipe("recipes/dense/tiny.yaml", ["model.vocab_size=300"]))
    assert type(find_adapter(decoder)).__name__ == "GPT2Adapter"
    with pytest.raises(ValueError) as err:
        find_adapter(_variant(norm=NormConfig(type="layernorm", placement="pre")))
    msg = str(err.value)
    assert "gpt2 (GPT2LMHeadModel): model.type=encoder: an encoder (bidirectional attention)" in msg, msg
    assert "llama (LlamaForCausalLM): model.type=encoder" in msg, msg
    decoder.norm.placement = "post"
    with pytest.raises(ValueError, match=r"bert \(BertForMaskedLM\): model.type=decoder: a causal decoder"):
        find_adapter(decoder)
