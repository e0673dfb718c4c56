"""The KV-cache view (tools/explore/kvcache.py): its bytes equal what a real prefill and one decoded
token store in the model's own KV cache, for the run and for every variant at the same width."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import archlab
from tools.explore.kvcache import _variants, kv_view
from tools.explore.load import load


@torch.no_grad()
def _cache_bytes(model, S: int) -> tuple[list[int], list[int]]:
    """Per layer: bytes held after a prefill of S tokens, and what one more decoded token adds."""
    cache = model.new_kv_cache()
    model(torch.zeros(1, S, dtype=torch.long), kv_cache=cache)
    held = [lc.k.nbytes + lc.v.nbytes for lc in cache.layers]
    model(torch.zeros(1, 1, dtype=torch.long), kv_cache=cache)
    return held, [lc.k.nbytes + lc.v.nbytes - h for lc, h in zip(cache.layers, held)]


@pytest.mark.parametrize("recipe, S", [("recipes/llama/tiny.yaml", 20), ("recipes/mistral/tiny.yaml", 60),
                                        ("recipes/deepseek/v3-tiny.yaml", 20)])
def test_the_runs_cache_is_what_prefill_and_decoding_store(recipe, S):
    ex = load(Path(recipe), ["model.n_layers=2"])
    kv = kv_view(ex.model.cfg, S, ex.max_len)
    prefill, step = _cache_bytes(ex.model, S)
    assert kv["prefill"] == prefill and kv["per_token"] == step
    if ex.model.cfg.attention.type == "sliding_window":
        assert step == [0, 0]  # S past the window: the rolling buffer is full


def test_every_variant_row_is_what_that_model_stores():
    cfg = load(Path("recipes/llama/tiny.yaml"), ["model.n_layers=2"]).model.cfg
    S = 80  # past the sliding-window row's 64 positions
    rows = {r["name"]: r for r in kv_view(cfg, S, 1024)["variants"]}
    assert list(rows) == ["MHA", "GQA", "MQA", "MLA", "sliding window"]
    for name, _, vcfg in _variants(cfg):
        torch.manual_seed(0)
        prefill, step = _cache_bytes(archlab.build_model(vcfg).eval(), S)
        assert rows[name]["prefill"] == sum(prefill) and rows[name]["per_token"] == sum(step), name
    assert rows["MHA"]["prefill"] == 2 * rows["GQA"]["prefill"] == 4 * rows["MQA"]["prefill"]  # 4 heads, 2 kv heads
