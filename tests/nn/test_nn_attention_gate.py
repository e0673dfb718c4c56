"""mha's ``attention.output_gate`` (the output times sigmoid(x W_g) per channel of each head) and
``attention.rotary_fraction`` (RoPE on the first share of each head): the math, the cache, the refusals."""

from __future__ import annotations

import pytest
import torch

import archlab
from archlab.errors import RecipeError

SMALL = ["model.vocab_size=300", "model.max_seq_len=64", "model.d_model=32", "model.n_layers=2", "model.n_heads=4",
         "model.n_kv_heads=2", "model.position.type=rope", "train.seq_len=32"]


def build(*overrides: str):
    torch.manual_seed(0)
    return archlab.build_model(archlab.load_recipe(None, [*SMALL, *overrides])).eval()


def test_the_gate_multiplies_the_heads_by_sigmoid_of_its_projection():
    model = build("model.attention.output_gate=true")
    attn = model.blocks[0].attn
    x = torch.randn(2, 9, 32)
    y = torch.randn(2, 4, 9, 8)  # (B, H, S, Dh)
    heads = y.transpose(1, 2).reshape(2, 9, 32)
    with torch.no_grad():
        torch.testing.assert_close(attn.out(y, x), attn.wo(heads * torch.sigmoid(attn.wgate(x))))
    assert build().blocks[0].attn.wgate is None  # off by default: no tensor


def test_partial_rope_rotates_the_first_channels_only():
    model = build("model.attention.rotary_fraction=0.25")
    attn = model.blocks[0].attn
    x = torch.randn(1, 7, 32)
    pos = torch.arange(7)
    ctx = model.positions.context(pos, pos)
    with torch.no_grad():
        q, k, _ = attn.qkv(x, ctx)
        raw = attn.wqkv(x).view(1, 7, 8, 8).transpose(1, 2)  # (B, H + 2G, S, Dh)
    assert model.cfg.rotary_dim == 2
    torch.testing.assert_close(q[..., 2:], raw[:, :4, :, 2:])  # unrotated past the first 2 channels
    assert not torch.allclose(q[:, :, 1:, :2], raw[:, :4, 1:, :2])  # rotated (position 0 is not)


def test_generation_with_the_cache_equals_the_full_forward():
    model = build("model.attention.output_gate=true", "model.attention.rotary_fraction=0.5",
                  "model.attention.qk_norm=true")
    prompt = torch.randint(0, 300, (2, 5))
    out = archlab.generate(model, prompt, 6, temperature=0)
    with torch.no_grad():
        greedy = model(out[:, :-1]).logits[:, prompt.shape[1] - 1:].argmax(-1)
    assert torch.equal(greedy, out[:, prompt.shape[1]:])


@pytest.mark.parametrize("overrides, message", [
    (["model.attention.type=gated_deltanet", "model.position.type=none", "model.attention.output_gate=true"],
     r"model.attention.output_gate=True: not a key of attention.type gated_deltanet"),
    (["model.attention.type=sliding_window", "model.attention.window=8", "model.attention.output_gate=true"],
     r"model.attention.output_gate=True: the output gate is mha's only"),
    (["model.attention.type=sliding_window", "model.attention.window=8", "model.attention.rotary_fraction=0.5"],
     r"model.attention.rotary_fraction=0.5: partial RoPE is mha's only"),
    (["model.attention.rotary_fraction=0.3"], r"model.attention.rotary_fraction=0.3: must lie in \(0, 1\] and rotate "
                                              r"whole channels"),
    (["model.attention.rotary_fraction=0.125"], r"model.attention.rotary_fraction=0.125: rope rotates pairs of "
                                                r"channels: the rotated part of the head dim \(8\) = 1 must be even"),
    (["model.position.type=none", "model.attention.rotary_fraction=0.5"],
     r"model.attention.rotary_fraction=0.5: only used when the position rotates q and k"),
])
def test_a_setting_that_does_nothing_or_cannot_be_is_refused_by_name(overrides, message):
    with pytest.raises(RecipeError, match=message):
        archlab.load_recipe(None, [*SMALL, *overrides])
