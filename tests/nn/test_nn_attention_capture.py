"""Attention capture: for every attention variant, softmax(q k^T * scale + bias + mask) v written out
from the captured q, k, v (with the mask and bias built here) equals what the module returned.

Shape legend: B batch, S queries, T keys, H query heads, G key/value heads.
"""

from __future__ import annotations

import pytest
import torch

import archlab
from archlab.nn.attention import attention_class
from archlab.nn.attention.capture import capture_attention
from archlab.nn.attention.cross import CrossAttention
from archlab.nn.attention.mla import MultiHeadLatentAttention
from archlab.nn.positions import alibi_slopes

CASES = {  # name: (recipe, overrides)
    "mha": ("recipes/dense/tiny.yaml", []),
    "gqa": ("recipes/llama/tiny.yaml", []),
    "mqa": ("recipes/llama/tiny-mqa.yaml", []),
    "mla": ("recipes/deepseek/v3-tiny.yaml", []),
    "sliding_banded": ("recipes/mistral/tiny.yaml", ["model.attention.window=5"]),
    "sliding_short": ("recipes/mistral/tiny.yaml", ["model.attention.window=48"]),
    "alibi": ("recipes/dense/tiny-alibi.yaml", []),
    "bert": ("recipes/bert/tiny.yaml", []),
    "t5": ("recipes/t5/tiny.yaml", []),
}


def _project(mod, y_BHSD):
    """The module's own output projection of the heads' outputs."""
    if isinstance(mod, (MultiHeadLatentAttention, CrossAttention)):
        B, H, S, Dv = y_BHSD.shape
        return mod.wo(y_BHSD.transpose(1, 2).reshape(B, S, H * Dv))
    return mod.out(y_BHSD)


def _expected_allowed(cfg, mod, S: int, T: int) -> torch.Tensor:
    i, j = torch.arange(T - S, T)[:, None], torch.arange(T)[None, :]
    if isinstance(mod, CrossAttention) or not mod.causal:
        return torch.ones(S, T, dtype=torch.bool)
    window = getattr(mod, "window", None)
    return (i - j >= 0) & (i - j < window) if window is not None else i - j >= 0


def _expected_bias(model, cfg, name: str, S: int):
    if isinstance(model.get_submodule(name), CrossAttention):
        return None
    if cfg.position.type == "alibi":
        i, j = torch.arange(S)[:, None], torch.arange(S)[None, :]
        return -alibi_slopes(cfg.n_heads)[:, None, None] * (i - j)  # the masked future is never read
    if cfg.position.type == "relative":  # T5: the table of the stack this layer belongs to
        stack = model.encoder_positions if name.startswith("encoder") else model.positions
        pos = torch.arange(S)
        return stack.context(pos, pos).bias
    return None


@pytest.mark.parametrize("case", list(CASES))
def test_written_out_attention_equals_the_module_output(case):
    recipe, overrides = CASES[case]
    cfg = archlab.load_recipe(recipe, ["model.n_layers=2", *overrides])
    torch.manual_seed(0)
    model = archlab.build_model(cfg).eval()
    m = model.cfg
    S = 12
    ids = torch.randint(0, 200, (2, S))
    outputs: dict[str, list[torch.Tensor]] = {}
    hooks = []
    with capture_attention(model) as caps:
        for name in caps:
            hooks.append(model.get_submodule(name).register_forward_hook(
                lambda _m, _i, out, name=name: outputs.setdefault(name, []).append(out)))
        with torch.no_grad():
            if m.type == "encoder_decoder":
                model(ids, decoder_input_ids=torch.randint(0, 200, (2, S)))
            else:
                model(ids)
    for h in hooks:
        h.remove()
    assert caps and all(len(c.records) == 1 for c in caps.values()), {n: len(c.records) for n, c in caps.items()}
    for name, cap in caps.items():
        mod, rec = model.get_submodule(name), cap.records[0]
        H, G = rec.q.shape[1], rec.k.shape[1]
        allowed = _expected_allowed(m, mod, S, rec.k.shape[2])
        torch.testing.assert_close(rec.allowed, allowed)
        bias = _expected_bias(model, m, name, S)
        if bias is None:
            assert rec.bias is None
        else:
            torch.testing.assert_close(rec.bias, bias.float())
        k = rec.k.repeat_interleave(H // G, dim=1)
        v = rec.v.repeat_interleave(H // G, dim=1)
        logits = rec.q @ k.transpose(-1, -2) * rec.scale + (0 if bias is None else bias)
        probs = torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)
        torch.testing.assert_close(rec.probs, probs)
        with torch.no_grad():
            written_out = _project(mod, probs @ v)
        torch.testing.assert_close(written_out, outputs[name][0], atol=1e-5, rtol=1e-4)


def test_shared_kv_heads_are_stated():
    """GQA (4 heads, 2 K/V heads): heads 0, 1 read K/V head 0; MQA: every head reads head 0."""
    for recipe, expected in (("recipes/llama/tiny.yaml", [0, 0, 1, 1]), ("recipes/llama/tiny-mqa.yaml", [0] * 4)):
        cfg = archlab.load_recipe(recipe, ["model.n_layers=1"])
        model = archlab.build_model(cfg).eval()
        with capture_attention(model) as caps, torch.no_grad():
            model(torch.randint(0, 100, (1, 6)))
        assert next(iter(caps.values())).records[0].kv_head == expected


def test_capture_is_off_outside_the_block():
    cfg = archlab.load_recipe("recipes/llama/tiny.yaml", ["model.n_layers=1"])
    model = archlab.build_model(cfg).eval()
    with capture_attention(model) as caps:
        pass
    with torch.no_grad():
        model(torch.randint(0, 100, (1, 6)))
    assert all(not c.records for c in caps.values())
    assert all(getattr(mod, "capture", None) is None for mod in model.modules())
    assert attention_class(model.cfg).capture is None
