"""The encoder-decoder (``model.type: encoder_decoder``, T5): the encoder sees both sides, the decoder only its
past and the whole encoder output; the cache reproduces the uncached logits; the parts are where the
docstring says; what it cannot run is refused by name.

Shape legend: B batch, M encoder positions, S decoder positions, V vocabulary.
"""

import pytest
import torch

import archlab
from archlab.errors import RecipeError
from archlab.model import EncoderDecoder, generate_seq2seq


def t5(*overrides: str):
    cfg = archlab.load_recipe("recipes/t5/tiny.yaml", ["model.n_layers=2", "model.vocab_size=300", *overrides])
    torch.manual_seed(0)
    model = archlab.build_model(cfg).eval()
    with torch.no_grad():  # off the unit-scale table's regime, where every logit favours the input id
        model.embed.weight.mul_(0.1)
    return model


def test_the_recipe_builds_an_encoder_decoder_with_both_stacks():
    model = t5()
    assert isinstance(model, EncoderDecoder)
    assert len(model.encoder_blocks) == len(model.blocks) == 2
    assert not model.encoder_blocks[0].attn.causal and model.blocks[0].attn.causal
    assert not model.encoder_positions.causal and model.positions.causal
    assert sum(p.numel() for p in model.parameters()) == archlab.num_params(model.cfg)


def test_encoder_positions_see_both_sides_and_decoder_positions_only_the_past():
    model = t5()
    ids, dec = torch.randint(0, 290, (1, 20)), torch.randint(0, 290, (1, 9))
    with torch.no_grad():
        base = model(ids, dec).logits
        later_input = ids.clone()
        later_input[0, -1] = (ids[0, -1] + 1) % 290  # the last encoder id: every decoder position reads it
        assert not torch.allclose(model(later_input, dec).logits[0, 0], base[0, 0])
        later_target = dec.clone()
        later_target[0, -1] = (dec[0, -1] + 1) % 290  # the last decoder id: no earlier position reads it
        changed = model(ids, later_target).logits
    torch.testing.assert_close(changed[0, :-1], base[0, :-1])
    assert not torch.allclose(changed[0, -1], base[0, -1])


@pytest.mark.parametrize("overrides", [[], ["model.n_kv_heads=1"], ["model.position.type=rope"]])
def test_cached_decoding_reproduces_the_uncached_logits(overrides):
    model = t5(*overrides)
    ids, dec = torch.randint(0, 290, (2, 25)), torch.randint(0, 290, (2, 10))
    with torch.no_grad():
        full = model(ids, dec).logits
        cache = model.new_kv_cache(ids)
        first = model(None, dec[:, :4], kv_cache=cache).logits
        steps = [model(None, dec[:, i:i + 1], kv_cache=cache).logits for i in range(4, 10)]
    torch.testing.assert_close(torch.cat([first, *steps], dim=1), full)
    assert cache.length == 10 and all(layer.k.shape[2] == 25 for layer in cache.cross)


def test_greedy_generation_equals_argmax_decoding_without_a_cache():
    model = t5()
    ids = torch.randint(0, 290, (2, 18))
    out = generate_seq2seq(model, ids, 8, temperature=0)
    assert out.shape == (2, 9) and bool((out[:, 0] == model.cfg.vocab_size - 1).all())  # the start id
    dec = out[:, :1]
    with torch.no_grad():
        for _ in range(8):
            dec = torch.cat([dec, model(ids, dec).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(dec, out)


def test_checkpointed_training_forwards_give_the_same_gradients():
    grads = {}
    for mode in ("none", "full", "selective"):
        model = t5().train()
        model.checkpointing = mode
        torch.manual_seed(1)
        ids, dec = torch.randint(0, 290, (2, 20)), torch.randint(0, 290, (2, 7))
        model(ids, dec, targets=dec).loss.backward()
        grads[mode] = torch.cat([p.grad.flatten() for p in model.parameters()])
    torch.testing.assert_close(grads["full"], grads["none"])
    torch.testing.assert_close(grads["selective"], grads["none"])


def test_the_decoder_inputs_are_required():
    with pytest.raises(ValueError, match="decoder_input_ids"):
        t5()(torch.randint(0, 290, (1, 5)))


@pytest.mark.parametrize("overrides, key", [
    (["model.position.type=learned"], "model.position.type"),
    (["model.position.type=alibi"], "model.position.type"),
    (["model.attention.type=sliding_window", "model.attention.window=8", "model.position.type=rope"],
     "model.attention.type"),
    (["model.mtp_depth=1"], "model.mtp_depth"),
    (["train.objective=causal_lm"], "train.objective"),
    (["train.objective=mlm"], "train.objective"),
    (["train.objective.noise_density=0.6"], "train.objective.noise_density"),
    (["train.eval_context_multipliers=[1,2]"], "train.eval_context_multipliers"),
])
def test_what_an_encoder_decoder_cannot_run_is_refused_by_name(overrides, key):
    with pytest.raises(RecipeError, match=key.replace(".", r"\.")):
        archlab.load_recipe("recipes/t5/tiny.yaml", overrides)
