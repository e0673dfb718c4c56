"""The explorer on models whose blocks mix token mixers: the Gated DeltaNet / attention hybrid
(recipes/hybrid/tiny.yaml, 3:1) and the pure Gated DeltaNet decoder (recipes/gdn/tiny.yaml). The flow
names each block's mixer; a Gated DeltaNet block opens as its fixed-size state (no attention map)."""

from __future__ import annotations

from pathlib import Path

import pytest

from archlab.nn.attention import attention_class, layer_type
from tests.tools.test_tools_explore_browser import browser, chromium  # noqa: F401, F811  (fixtures)
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


def test_the_hybrid_page_names_the_mixers_and_explains_a_gdn_block(browser):  # noqa: F811
    """The flow shows each block's mixer; clicking a Gated DeltaNet block opens its state (in English and
    Chinese), the maps view lists only the attention block; no console errors."""
    from tests.tools.test_tools_explore_browser import _serve

    ex = load(Path(HYBRID))
    url, server, thread = _serve([ex])
    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    try:
        page.goto(url)
        page.wait_for_selector(".bar")
        page.fill("#prompt", PROMPT)
        page.click("#analyze")
        page.wait_for_function("t => Explore.text === t && document.querySelector('.inside-panel')", arg=PROMPT)
        mixers = page.eval_on_selector_all(".flow-block", "gs => gs.map((g) => [g.dataset.mixer, g.textContent])")
        assert [m for m, _ in mixers] == ["gated_deltanet"] * 3 + ["mha"]
        assert all(m in text for m, text in mixers)
        page.wait_for_selector(".maps-panel .head-map")  # opens on the attention block, 3
        page.click('.flow-block[data-layer="1"]')
        page.wait_for_selector('.gdn-panel[data-layer="1"]')
        panel = page.locator(".gdn-panel")
        own = attention_class(ex.model.cfg, 1).kv_cache_bytes(ex.model.cfg, len(ex.codec.encode(PROMPT)), layer=1,
                                                               dtype_bytes=DTYPE_BYTES)
        assert float(panel.get_attribute("data-state-bytes")) == own
        assert "Gated DeltaNet" in panel.inner_text() and "fixed-size state" in panel.inner_text()
        assert "Norm before the Gated DeltaNet mixer" in panel.locator(".norm-step h3").inner_text()
        assert page.locator(".maps-panel .head-map").count() == 0
        assert "no attention map" in page.locator(".maps-none").inner_text()
        options = page.eval_on_selector_all(".layer-select option", "os => os.map((o) => o.value)")
        assert [o for o in options if o] == ["3"]
        page.select_option("#lang", "zh")
        page.wait_for_selector(".gdn-panel")
        assert "固定大小的状态" in page.locator(".gdn-explain").inner_text()
        assert "没有注意力图" in page.locator(".maps-none").inner_text()
        assert not errors, errors
    finally:
        page.close()
        server.should_exit = True
        thread.join(timeout=10)


def test_the_pure_gdn_page_opens_without_any_attention_layer(browser):  # noqa: F811
    from tests.tools.test_tools_explore_browser import _serve

    url, server, thread = _serve([load(Path(GDN))])
    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    try:
        page.goto(url)
        page.wait_for_selector('.gdn-panel[data-layer="0"]')
        assert page.locator(".flow-gdn").count() == 4
        assert "Every block of this model is Gated DeltaNet" in page.locator(".maps-none").inner_text()
        page.click('.flow-block[data-layer="2"]')
        page.wait_for_selector('.gdn-panel[data-layer="2"]')
        assert page.locator(".kv-layer[data-mixer=gated_deltanet]").count() == 4
        assert not errors, errors
    finally:
        page.close()
        server.should_exit = True
        thread.join(timeout=10)



@pytest.mark.parametrize("n, label", [(16, "\u00b7because"), (40, "\u00b7isinstance"), (128, "ab"),
                                      (3, "\u00b7return")])
def test_line_chart_token_labels_do_not_overlap(browser, n, label):  # noqa: F811
    """A line chart (the norm charts under a block) labels every k-th position, k chosen so that the widest label
    fits: drawn in the page with n long labels, no two of its labels meet."""
    from tests.tools.test_tools_explore_browser import _serve

    url, server, thread = _serve([load(Path(HYBRID))])
    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    try:
        page.goto(url)
        page.wait_for_selector(".bar")
        ticks = page.evaluate("""([n, label]) => {
            const fig = lineChart([{name: "RMS in", values: new Float32Array(n).fill(1)}], Array(n).fill(label),
                                  {title: "t", yLabel: "RMS"});
            document.body.appendChild(fig);
            return Array.from(fig.querySelectorAll(".tick"))
                .map((t) => { const b = t.getBBox(); return [b.x, b.x + b.width]; });
        }""", [n, label])
        assert len(ticks) >= min(n, 2)
        assert all(right <= next_left for (_, right), (next_left, _) in zip(ticks, ticks[1:])), ticks
    finally:
        page.close()
        server.should_exit = True
        thread.join(timeout=10)
