"""The parallel block (``model.block.type: parallel``): its forward is x + attn(norm(x)) + ffn(norm'(x)),
one norm or two, parameters counted from the config, the KV cache and activation checkpointing
unchanged, and the recipes that make no sense refused by key.

Shape legend: B batch, S sequence, D model dim, V vocabulary.
"""

from __future__ import annotations

import pytest
import torch

import archlab
from archlab.config import RecipeError
from archlab.model.parallel_block import ParallelBlock

PARALLEL = ["model.n_layers=2", "model.block.type=parallel"]


def _model(path: str, *overrides: str):
    cfg = archlab.load_recipe(path, [*PARALLEL, *overrides])
    return cfg, archlab.build_model(cfg).eval()


@pytest.mark.parametrize("path, shared", [("recipes/dense/tiny.yaml", True), ("recipes/dense/tiny.yaml", False),
                                          ("recipes/llama/tiny.yaml", True), ("recipes/mixtral/tiny.yaml", False)])
def test_each_block_computes_the_parallel_equation(path, shared):
    """Each block's output against the equation written out on its own modules: both branches read
    the block's input (not the attention's output), one norm shared or one norm each."""
    cfg, model = _model(path, f"model.block.shared_norm={str(shared).lower()}")
    with torch.no_grad():
        for p in model.parameters():  # norms off their init values (ones would hide a swap of the two)
            if p.ndim == 1:
                p.add_(torch.randn_like(p) * 0.3)
    B, S, D = 2, 12, cfg.model.d_model
    x_BSD = torch.randn(B, S, D)
    pos = torch.arange(S)
    ctx = model.positions.context(pos, pos)
    for blk in model.blocks:
        assert isinstance(blk, ParallelBlock) and (blk.ffn_norm is None) == shared
        with torch.no_grad():
            out, _ = blk(x_BSD, ctx)
            h_BSD = blk.attn_norm(x_BSD)
            expected = x_BSD + blk.attn(h_BSD, ctx) + _ffn(blk, h_BSD if shared else blk.ffn_norm(x_BSD))
            after_attn = x_BSD + blk.attn(h_BSD, ctx)  # what a sequential block's FFN would read
            sequential = after_attn + _ffn(blk, blk.attn_norm(after_attn))
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
        assert not torch.allclose(out, sequential, atol=1e-4)


def _ffn(blk, x):
    y = blk.ffn(x)
    return y[0] if isinstance(y, tuple) else y  # an MoE layer returns (y, aux)


@pytest.mark.parametrize("shared, norms", [(True, 1), (False, 2)])
def test_parameters_are_counted_from_the_config(shared, norms):
    cfg, model = _model("recipes/mixtral/tiny.yaml", f"model.block.shared_norm={str(shared).lower()}")
    assert sum(p.numel() for p in model.parameters()) == archlab.num_params(cfg)
    seq = archlab.load_recipe("recipes/mixtral/tiny.yaml", ["model.n_layers=2"])
    per_norm = cfg.model.d_model  # RMSNorm: a weight only
    assert archlab.num_params(seq) - archlab.num_params(cfg) == 2 * (2 - norms) * per_norm


def test_kv_cache_decoding_equals_the_full_forward():
    _, model = _model("recipes/gptj/tiny.yaml")
    ids = torch.randint(0, 200, (2, 14))
    with torch.no_grad():
        full = model(ids).logits
        cache = model.new_kv_cache()
        first = model(ids[:, :9], kv_cache=cache).logits
        rest = [model(ids[:, t:t + 1], kv_cache=cache).logits for t in range(9, 14)]
    torch.testing.assert_close(torch.cat([first, *rest], dim=1), full)


@pytest.mark.parametrize("path", ["recipes/gptj/tiny.yaml", "recipes/deepseek/tiny.yaml"])
def test_checkpointing_gives_the_same_gradients(path):
    from archlab.costs.measure import training_loss

    cfg = archlab.load_recipe(path, [*PARALLEL, "model.dropout=0.1"])
    model = archlab.build_model(cfg).train()
    x = torch.randint(0, cfg.model.vocab_size, (2, 33))
    grads = {}
    for mode in ("none", "full", "selective"):
        model.checkpointing = mode
        model.zero_grad(set_to_none=True)
        torch.manual_seed(1)  # the same dropout masks in every mode
        training_loss(model, x).backward()
        grads[mode] = {n: p.grad.clone() for n, p in model.named_parameters()}
    for mode in ("full", "selective"):
        for n, g in grads[mode].items():
            torch.testing.assert_close(g, grads["none"][n], rtol=1e-6, atol=1e-8)


def test_mtp_modules_use_the_parallel_block():
    cfg = archlab.load_recipe("recipes/gptj/tiny.yaml", ["model.mtp_depth=1", "train.objective=mtp"])
    model = archlab.build_model(cfg)
    assert isinstance(model.mtp[0].block, ParallelBlock)


@pytest.mark.parametrize("overrides, message", [
    (["model.block.type=parallel", "model.norm.placement=post"],
     "model.block.type='parallel': the parallel block is pre-LN only (model.norm.placement=post)"),
    (["model.block.shared_norm=false"],
     "model.block.shared_norm=False: only used by block.type parallel; this recipe's block is sequential"),
    (["model.block.type=interleaved"], "model.block.type='interleaved': must be one of: parallel, sequential"),
])
def test_recipes_that_make_no_sense_are_refused_by_key(overrides, message):
    with pytest.raises(RecipeError) as err:
        archlab.load_recipe("recipes/dense/tiny.yaml", overrides)
    assert str(err.value).startswith(message), str(err.value)


@pytest.mark.parametrize("recipe", ["recipes/bert/tiny.yaml", "recipes/t5/tiny.yaml"])
def test_encoders_refuse_the_parallel_block(recipe):
    """The parallel layout is a decoder's (GPT-J, PaLM, GPT-NeoX): ``model.block`` is a decoder key."""
    with pytest.raises(RecipeError, match=r"model.block.type='parallel': only used by model.type decoder"):
        archlab.load_recipe(recipe, ["model.block.type=parallel", "model.norm.placement=pre"])
