"""The explorer on models whose blocks mix token mixers: the Gated DeltaNet / attention hybrid
(recipes/hybrid/tiny.yaml, 3:1) and the pure Gated DeltaNet decoder (recipes/gdn/tiny.yaml). The flow
names each block's mixer; a Gated DeltaNet block opens as its fixed-size state (no attention map)."""

from __future__ import annotations

from pathlib import Path

import pytest

from archlab.nn.attention import attention_class, layer_type
from tools.explore import compute
from tools.explore.export import page_data
from tools.explore.kvcache import DTYPE_BYTES
from tools.explore.load import ExploreError, load

HYBRID, GDN = "recipes/hybrid/tiny.yaml", "recipes/gdn/tiny.yaml"
PROMPT = "def add(a, b): return a + b"


@pytest.fixture(scope="module", params=[HYBRID, GDN])
def analysed(request):
    ex = load(Path(request.param))
    return ex, compute.analyse(ex, PROMPT)


def test_the_flow_names_each_blocks_own_mixer(analysed):
    ex, an = analysed
    cfg = ex.model.cfg
    blocks = an.data["flow"]["stacks"][0]["blocks"]
    assert [b["attention"] for b in blocks] == [layer_type(cfg, i) for i in range(cfg.n_layers)]
    assert [b["attention"] for b in blocks] == [b.attn.type_name for b in ex.model.blocks]
    assert an.data["mixers"]["self"] == [layer_type(cfg, i) for i in range(cfg.n_layers)]


def test_the_attention_type_is_the_pattern_not_the_default():
    ex = load(Path(HYBRID))
    an = compute.analyse(ex, PROMPT)
    assert an.data["attention_type"] == "hybrid: gated_deltanet x3, mha x1"
    assert an.data["kv_cache"]["attention"] == "hybrid"
    assert an.data["kv_cache"]["mixers"] == ["gated_deltanet"] * 3 + ["mha"]
    assert compute.analyse(load(Path(GDN)), PROMPT).data["attention_type"] == "gated_deltanet"


def test_only_attention_layers_have_maps(analysed):
    ex, an = analysed
    attn = [i for i, b in enumerate(ex.model.blocks) if b.attn.type_name != "gated_deltanet"]
    assert [v["layer"] for v in an.data["attention"].get("self", [])] == attn


def test_a_gdn_blocks_detail_is_its_state_in_the_layers_own_bytes(analysed):
    ex, an = analysed
    cfg, S = ex.model.cfg, len(an.data["tokens"])
    for i, b in enumerate(ex.model.blocks):
        d = compute.detail(an, "self", i, 0)
        assert d["layer"] == i and d["block"]["rms"]  # the block's norms, projection and FFN are still there
        if b.attn.type_name == "gated_deltanet":
            own = attention_class(cfg, i).kv_cache_bytes(cfg, S, layer=i, dtype_bytes=DTYPE_BYTES)
            assert d["mixer"] == "gated_deltanet" and d["state_bytes"] == own == an.data["kv_cache"]["prefill"][i]
            assert "probs" not in d and "concat" in d["block"]
        else:
            assert "probs" in d and "mixer" not in d
    with pytest.raises(ExploreError):
        compute.detail(an, "self", cfg.n_layers, 0)


def test_the_offline_page_holds_every_blocks_detail_by_its_number():
    ex = load(Path(HYBRID))
    run = page_data([ex], PROMPT)["runs"][0]
    assert sorted(run["details"]["self"]) == [0, 1, 2, 3]
    assert run["details"]["self"][0][0]["mixer"] == "gated_deltanet"
    assert len(run["details"]["self"][3]) == ex.model.cfg.n_heads
