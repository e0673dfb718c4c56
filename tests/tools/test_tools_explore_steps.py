"""The steps between the attention maps (tools/explore/steps.py): the residual stream, a block's norm,
output projection and feed-forward, and the logit lens, checked against the model's modules run one
block at a time here."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tools.explore import compute
from tools.explore.encode import decode
from tools.explore.load import ExploreError, load


def _blocks_by_hand(model, ids):
    """The residual stream entering block 0 and after each block, and each block's FFN input, by
    calling the modules one after another (pre-norm blocks)."""
    x_BSD = torch.tensor([ids])
    pos = torch.arange(len(ids))
    x = model.embed_tokens(x_BSD, pos)
    ctx = model.positions.context(pos, pos)
    xs, ffn_in = [x], []
    for b in model.blocks:
        h = x + b.attn(b.attn_norm(x), ctx)
        ffn_in.append(b.ffn_norm(h))
        x, _ = b(x, ctx)
        xs.append(x)
    return xs, ffn_in


@pytest.mark.parametrize("recipe, over", [("recipes/llama/tiny.yaml", []),
                                          ("recipes/vanilla/tiny.yaml", ["model.norm.placement=pre"])])
@torch.no_grad()
def test_residual_ffn_and_logit_lens_equal_the_modules(recipe, over):
    ex = load(Path(recipe), ["model.n_layers=2", *over])
    text = "the cat sat"
    an = compute.analyse(ex, text)
    ids = [tok["id"] for tok in an.data["tokens"]]
    if ex.model.cfg.norm.placement != "pre":
        pytest.fail(f"{recipe}: this test builds pre-norm blocks by hand")
    xs, ffn_in = _blocks_by_hand(ex.model, ids)
    norms = decode(an.data["residual"]["self"]["norm"])  # (L + 1, S)
    assert norms == pytest.approx(torch.stack([x[0].norm(dim=-1) for x in xs]).numpy(), rel=1e-4, abs=1e-5)
    for layer, b in enumerate(ex.model.blocks):
        d = compute.detail(an, "self", layer, 0)["block"]
        up = b.ffn.up_proj(ffn_in[layer])[0]
        act = b.ffn.activate(up[None])[0]
        assert decode(d["ffn"]["up"]) == pytest.approx(up.numpy(), abs=1e-5)
        assert decode(d["ffn"]["act"]) == pytest.approx(act.numpy(), abs=1e-5)
        assert decode(d["ffn"]["out"]) == pytest.approx(b.ffn(ffn_in[layer])[0].numpy(), abs=1e-5)
        assert decode(d["ffn"]["magnitude"]) == pytest.approx(act.abs().mean(0).numpy(), abs=1e-6)
        assert d["ffn"]["gated"] == (ex.model.cfg.ffn.type == "swiglu")
        assert decode(d["rms"]["attn_norm_in"]) == pytest.approx(xs[layer][0].pow(2).mean(-1).sqrt().numpy(), rel=1e-4)
    S = len(ids)
    for pos in (S - 1, 2):
        lens = an.data["lens"] if pos == S - 1 else compute.lens(an, ex, pos)
        lens_ids, lens_p = decode(lens["ids"]), decode(lens["probs"])  # (L, K)
        for layer in range(2):
            p = ex.model.head_logits(ex.model.final_norm(xs[layer + 1]))[0, pos].softmax(-1)
            top = p.topk(lens_ids.shape[-1])
            assert lens_p[layer] == pytest.approx(top.values.numpy(), abs=1e-6)
            assert (lens_ids[layer] == top.indices.numpy()).all()
        assert all(lens["names"][int(i)] == compute.token_text(ex, int(i)) for i in lens_ids.flatten())
    final = ex.model(torch.tensor([ids])).logits[0, -1].softmax(-1)  # the last block's lens is the output
    assert decode(an.data["lens"]["probs"])[-1] == pytest.approx(final.topk(5).values.numpy(), abs=1e-6)
    with pytest.raises(ExploreError, match="positions 0 to"):
        compute.lens(an, ex, S)


def test_the_hooks_leave_the_model_unchanged_and_moe_blocks_have_no_dense_ffn():
    ex = load(Path("recipes/deepseek/tiny.yaml"), ["model.n_layers=2"])
    ids = torch.tensor([list(b"abc")])
    with torch.no_grad():
        before = ex.model(ids).logits
    an = compute.analyse(ex, "abc")
    with torch.no_grad():
        assert torch.equal(ex.model(ids).logits, before)
    assert "ffn" in compute.detail(an, "self", 0, 0)["block"]  # the dense first layer
    assert "ffn" not in compute.detail(an, "self", 1, 0)["block"]  # MoE: the routing view instead
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in ex.model.modules())


def test_t5_has_both_stacks_residual_and_the_decoders_lens():
    t5 = compute.analyse(load(Path("recipes/t5/tiny.yaml"), ["model.n_layers=2"]), "a <extra_id_0> b").data
    assert set(t5["residual"]) == {"encoder", "self"}
    enc, dec = decode(t5["residual"]["encoder"]["norm"]), decode(t5["residual"]["self"]["norm"])
    assert enc.shape == (3, len(t5["tokens"])) and dec.shape == (3, len(t5["decoder_tokens"]))
    assert decode(t5["lens"]["probs"]).shape == (2, 5) and t5["lens"]["pos"] == len(t5["decoder_tokens"]) - 1
