"""The encoder (``model.type: encoder``): the decoder's stack with bidirectional attention, BERT's parts
as options only it reads, no KV cache; components that cannot run without the causal mask are refused
by name.

Shape legend: B batch, S sequence, V vocabulary.
"""

from __future__ import annotations

import pytest
import torch

import archlab
from archlab import RecipeError
from archlab.costs import forward_flops
from archlab.model import Decoder, Encoder, build_model
from archlab.nn.attention import ATTENTIONS, build_attention
from archlab.nn.positions import POSITIONS

SMALL = ["model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.vocab_size=300"]
BERT = "recipes/bert/tiny.yaml"


def bert(*overrides: str):
    return archlab.load_recipe(BERT, [*SMALL, *overrides])


def _first_position_logits(model, ids):
    with torch.no_grad():
        return model(ids).logits[0, 0]


@pytest.mark.parametrize("position", ["learned", "rope", "sinusoidal"])
def test_every_position_sees_both_sides_in_an_encoder_and_only_the_past_in_a_decoder(position):
    enc = bert(f"model.position.type={position}")
    dec = archlab.load_recipe("recipes/dense/tiny.yaml", [*SMALL, f"model.position.type={position}"])
    ids = torch.randint(0, 299, (1, 10))
    later = ids.clone()
    later[0, -1] = (ids[0, -1] + 1) % 299
    for cfg, sees_later in ((enc, True), (dec, False)):
        torch.manual_seed(0)
        model = build_model(cfg).eval()
        changed = not torch.equal(_first_position_logits(model, ids), _first_position_logits(model, later))
        assert changed == sees_later, (cfg.model.type, position)


def test_the_encoder_is_the_decoders_stack_with_its_attention_unmasked():
    """Same weights, same outputs when the decoder's attention layers are switched to causal=False."""
    cfg = bert("model.embed_norm=false", "model.head_transform=false", "model.head_bias=false")
    torch.manual_seed(0)
    enc = build_model(cfg).eval()
    mcfg = archlab.model_config(cfg)
    dec = Decoder(mcfg).eval()
    dec.load_state_dict(enc.state_dict())
    for block in dec.blocks:
        block.attn.causal = False
    ids = torch.randint(0, 299, (2, 12))
    with torch.no_grad():
        assert torch.equal(dec(ids).logits, enc(ids).logits)
        for block in dec.blocks:
            block.attn.causal = True
        assert not torch.allclose(dec(ids).logits, enc(ids).logits)


def test_berts_parts_are_built_counted_and_used():
    cfg = bert()
    model = build_model(cfg)
    assert isinstance(model, Encoder) and model.embed_norm is not None and model.head_transform is not None
    assert model.head_bias.shape == (300,) and not model.head_bias.any()  # zero init, as BERT
    assert sum(p.numel() for p in model.parameters()) == archlab.num_params(cfg)
    bare = build_model(bert("model.embed_norm=false", "model.head_transform=false", "model.head_bias=false"))
    D, V = 32, 300
    assert archlab.num_params(cfg) - sum(p.numel() for p in bare.parameters()) == 2 * D + (D * D + D + 2 * D) + V
    with torch.no_grad():  # the output bias reaches the logits
        ids = torch.randint(0, 299, (1, 6))
        before = model(ids).logits
        model.head_bias.fill_(1.0)
        torch.testing.assert_close(model(ids).logits, before + 1.0)


def test_an_encoder_has_no_kv_cache_and_does_not_generate():
    model = build_model(bert())
    ids = torch.randint(0, 299, (1, 4))
    with pytest.raises(ValueError, match="model.type=encoder: an encoder attends to both sides"):
        model.new_kv_cache()
    with pytest.raises(ValueError, match="no KV cache to extend"):
        archlab.generate(model, ids, 3)
    assert archlab.costs.kv_cache_bytes(archlab.model_config(bert()), batch=1, context=8) == 0.0  # keeps none


def test_the_full_square_is_useful_in_an_encoder():
    S = 64
    enc = forward_flops(archlab.model_config(bert()), S)
    dec = forward_flops(archlab.model_config(archlab.load_recipe("recipes/dense/tiny.yaml", SMALL)), S)
    assert enc.attention == dec.attention > 0  # the same square counted either way
    assert enc.attention_causal_useful == enc.attention
    assert dec.attention_causal_useful == pytest.approx(dec.attention * (S + 1) / (2 * S))


def test_each_attention_and_position_states_whether_it_runs_without_the_mask():
    assert {n for n in ATTENTIONS.names() if ATTENTIONS.get(n).supports_bidirectional} == {"mha"}
    assert {n for n in POSITIONS.names() if not POSITIONS.get(n).supports_bidirectional} == {"alibi"}
    cfg = archlab.model_config(archlab.load_recipe("recipes/mistral/tiny.yaml", SMALL))
    with pytest.raises(ValueError, match="causal=False: the window looks back only"):
        build_attention(cfg, layer=0, causal=False)


@pytest.mark.parametrize("overrides, message", [
    (["model.attention.type=sliding_window", "model.attention.window=8"],
     r"^model.attention.type='sliding_window': model.type=encoder needs bidirectional attention: the window looks "
     r"back only"),
    (["model.attention.type=mla", "model.position.type=rope", "model.attention.kv_lora_rank=16",
      "model.attention.qk_rope_head_dim=4", "model.attention.qk_nope_head_dim=8", "model.attention.v_head_dim=8"],
     r"^model.attention.type='mla': model.type=encoder needs bidirectional attention: its absorbed decoding path"),
    (["model.position.type=alibi"], r"^model.position.type='alibi': model.type=encoder needs a position encoding "
                                    r"that works without the causal mask: ALiBi's bias here is the causal form"),
    (["model.parametrization=mup"], r"^model.parametrization='mup': model.type=encoder is verified under standard"),
    (["model.ffn.type=swiglu"], r"^model.head_transform=True: the head transform applies the FFN's activation"),
    (["model.mtp_depth=1"], r"^model.mtp_depth=1: only used by model.type decoder; this recipe's model type is "
                            r"encoder$"),
    (["train.objective=causal_lm"], r"^train.objective='causal_lm': model.type=encoder sees both sides"),
    (["model.type=transformer"], r"^model.type='transformer': must be one of: decoder, encoder, encoder_decoder$"),
])
def test_what_an_encoder_cannot_have_is_refused_by_name(overrides, message):
    with pytest.raises(RecipeError, match=message):
        bert(*overrides)


@pytest.mark.parametrize("key", ["embed_norm", "head_transform", "head_bias"])
def test_berts_options_are_refused_on_a_decoder(key):
    with pytest.raises(RecipeError, match=rf"^model.{key}=True: only used by model.type encoder; this recipe's "
                                          r"model type is decoder$"):
        archlab.load_recipe("recipes/dense/tiny.yaml", [*SMALL, f"model.{key}=true"])


def test_a_nope_encoder_is_a_bag_of_tokens():
    """Valid, as an ablation: without positions and without the mask, permuting the input permutes the output."""
    torch.manual_seed(0)
    model = build_model(bert("model.position.type=none")).eval()
    ids = torch.randint(0, 299, (1, 8))
    perm = torch.randperm(8)
    with torch.no_grad():
        torch.testing.assert_close(model(ids[:, perm]).logits, model(ids).logits[:, perm])
