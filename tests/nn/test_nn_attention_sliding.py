"""Sliding-window attention: the banded path against a dense band mask, the layer pattern, the
rolling KV cache (generation equal to the full forward, memory flat past the window), FLOPs
against FlopCounterMode, and the rules a recipe must follow.

Shape legend: B batch, S sequence, W window, V vocabulary.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import archlab
from archlab.config import RecipeError
from archlab.costs import forward_flops, kv_cache_bytes
from archlab.costs.measure import measured_flops
from archlab.nn.attention.sliding import SlidingWindowAttention

RECIPE = "recipes/mistral/tiny.yaml"


def _model(*overrides: str, layers: int = 3):
    cfg = archlab.load_recipe(RECIPE, [f"model.n_layers={layers}", *overrides])
    torch.manual_seed(0)
    return cfg, archlab.build_model(cfg).eval()


def _dense_band_forward(self, x, ctx, cache=None):
    """Reference: every query against every key, with the band 0 <= i - j < W as a dense mask."""
    q, k, v = self.qkv(x, ctx)
    S = x.shape[1]
    i, j = torch.arange(S)[:, None], torch.arange(S)[None, :]
    window = self.window if self.window is not None else S
    mask = (i - j >= 0) & (i - j < window)
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale, enable_gqa=True)
    return self.out(y)


@pytest.mark.parametrize("window, S, kv", [(5, 23, 2), (8, 32, 1), (7, 7, 4), (16, 9, 2), (1, 12, 2), (3, 40, 4)])
def test_banded_path_equals_a_dense_band_mask(window, S, kv, monkeypatch):
    """Blocks of W queries against 2W keys give the same logits as the full masked square
    (S multiple of W or not, S <= W, GQA/MQA/MHA, W = 1)."""
    cfg, model = _model(f"model.attention.window={window}", f"model.n_kv_heads={kv}")
    ids = torch.randint(0, cfg.model.vocab_size, (2, S))
    with torch.no_grad():
        banded = model(ids).logits
        monkeypatch.setattr(SlidingWindowAttention, "forward", _dense_band_forward)
        reference = model(ids).logits
    torch.testing.assert_close(banded, reference)


def test_window_changes_what_a_query_sees():
    """A token more than W positions back has no effect on a 1-layer windowed model; a closer one has."""
    cfg, model = _model("model.attention.window=4", layers=1)
    ids = torch.randint(0, cfg.model.vocab_size, (1, 12))
    far, near = ids.clone(), ids.clone()
    far[0, 2] = (far[0, 2] + 1) % cfg.model.vocab_size  # 9 positions before the last query
    near[0, 9] = (near[0, 9] + 1) % cfg.model.vocab_size
    with torch.no_grad():
        base, f, n = model(ids).logits[0, -1], model(far).logits[0, -1], model(near).logits[0, -1]
    torch.testing.assert_close(f, base)
    assert (n - base).abs().max() > 1e-4


def test_causal_for_every_window():
    cfg, model = _model("model.attention.window=6")
    ids = torch.randint(0, cfg.model.vocab_size, (2, 30))
    changed = ids.clone()
    changed[:, 20:] = torch.randint(0, cfg.model.vocab_size, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits[:, :20], model(changed).logits[:, :20])


def test_layer_pattern_every_nth_layer_global():
    _, model = _model("model.attention.window=8", "model.attention.global_every=3", layers=6)
    assert [b.attn.window for b in model.blocks] == [8, 8, None, 8, 8, None]
    _, local = _model("model.attention.window=8", layers=3)
    assert [b.attn.window for b in local.blocks] == [8, 8, 8]


@pytest.mark.parametrize("pattern", ["model.attention.global_every=0", "model.attention.global_every=2"])
def test_generation_with_the_rolling_cache_equals_the_full_forward(pattern):
    """Prefill, then one token at a time and then chunks: equal logits to the full forward."""
    cfg, model = _model("model.attention.window=5", pattern)
    ids = torch.randint(0, cfg.model.vocab_size, (2, 26))
    with torch.no_grad():
        full = model(ids).logits
        cache = model.new_kv_cache()
        steps = [model(ids[:, :7], kv_cache=cache).logits]
        steps += [model(ids[:, t:t + 1], kv_cache=cache).logits for t in range(7, 18)]
        steps += [model(ids[:, 18:21], kv_cache=cache).logits, model(ids[:, 21:], kv_cache=cache).logits]
    torch.testing.assert_close(torch.cat(steps, dim=1), full)
    assert cache.length == 26


def test_cache_memory_stays_flat_past_the_window():
    """A local layer holds at most W - 1 positions however long generation goes on; a global
    layer keeps them all; the cost model says exactly what is held."""
    cfg, model = _model("model.attention.window=6", "model.attention.global_every=3")
    cache = model.new_kv_cache()
    held = []
    with torch.no_grad():
        model(torch.randint(0, 100, (3, 4)), kv_cache=cache)
        for _ in range(30):
            model(torch.randint(0, 100, (3, 1)), kv_cache=cache)
            held.append([layer.k.nbytes + layer.v.nbytes for layer in cache.layers])
    local = [h[0] for h in held]
    assert local[-1] == local[10] and max(local) == local[-1]  # flat once the window is full
    assert [layer.stored for layer in cache.layers] == [5, 5, 34]
    assert held[-1][2] > held[10][2]  # the global layer grows
    assert kv_cache_bytes(cfg, batch=3, context=34, dtype="fp32") == sum(held[-1])


@pytest.mark.parametrize("S", [12, 40, 64])
def test_banded_flops_match_flop_counter(S):
    """Q K^T and P V count the banded work, nb * 2W * W keys-by-queries per sequence, not S x S."""
    cfg, model = _model("model.attention.window=12", layers=2)
    model.train()
    ids = torch.randint(0, cfg.model.vocab_size, (1, S + 1))
    counted = measured_flops(model, ids, backward=False, loss="logits")
    attn = sum(v for k, v in counted.items() if k.endswith("attn") and k.count(".") == 3)  # Decoder.blocks.i.attn
    est = forward_flops(cfg, S)
    assert attn == pytest.approx((est.qkv_proj + est.out_proj + est.attention) * S, rel=1e-9)
    if S > 12:
        full = forward_flops(archlab.load_recipe(RECIPE, ["model.n_layers=2", "model.attention.type=mha",
                                                        "model.attention.window=null"]), S)
        assert est.attention < full.attention


@pytest.mark.parametrize("override, message", [
    ("model.attention.window=0", "window=0: sliding_window needs a window of at least 1"),
    ("model.attention.window=null", "window=None: sliding_window needs a window"),
    ("model.attention.global_every=-1", "global_every=-1: must be >= 0"),
    ("model.position.type=alibi", "no additive score bias (ALiBi, relative)"),
])
def test_invalid_windows_are_refused_by_name(override, message):
    with pytest.raises(RecipeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        archlab.load_recipe(RECIPE, [override])


def test_a_window_longer_than_the_context_is_full_attention():
    cfg, model = _model("model.attention.window=5000")  # > max_seq_len: allowed
    _, full = _model("model.attention.type=mha", "model.attention.window=null")
    full.load_state_dict(model.state_dict())
    ids = torch.randint(0, cfg.model.vocab_size, (2, 20))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, full(ids).logits)
