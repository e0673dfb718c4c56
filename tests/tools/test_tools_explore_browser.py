"""The explorer in a real browser: Debian's chromium driven by playwright. A missing chromium is installed
with apt-get when the tests run as root (as on a fresh Debian machine); otherwise it, or a missing playwright,
fails these tests at once with the command that installs it (never a silent skip)."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest
import torch

from archlab.model.generate import filter_logits
from archlab.nn.attention.capture import capture_attention
from archlab.nn.moe.capture import capture_routing
from tools.explore.load import load

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--no-first-run"]
PROMPT = "def add(a, b): return a + b"
INSTALL = "apt-get update && apt-get install -y chromium"


def chromium_action(present: bool, uid: int, apt_get: bool) -> tuple[str, str]:
    """What to do before the browser tests: ("ready", ""), ("install", the command to run) as root with
    apt-get, or ("fail", the one line to show)."""
    if present:
        return "ready", ""
    if uid != 0:
        return "fail", f"{CHROMIUM} is missing; run as root: {INSTALL}"
    if not apt_get:
        return "fail", f"{CHROMIUM} is missing and there is no apt-get to install it (Debian's chromium package)"
    return "install", INSTALL


@pytest.fixture(scope="session")
def chromium():
    """Debian's chromium, installed first where it is missing and the tests run as root."""
    action, text = chromium_action(Path(CHROMIUM).is_file(), os.getuid(), shutil.which("apt-get") is not None)
    if action == "fail":
        pytest.fail(text)
    if action == "install":
        done = subprocess.run(["bash", "-c", text], capture_output=True, text=True,
                              env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        if done.returncode != 0 or not Path(CHROMIUM).is_file():
            last = (done.stderr or done.stdout).strip().splitlines()[-1:]
            pytest.fail(f"{text} failed (exit {done.returncode}): {last}")
    return CHROMIUM


@pytest.fixture(scope="module")
def browser(chromium):
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("playwright is missing: pip install -e '.[test]' (playwright==1.65.2)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, headless=True, args=ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def served():
    """The explorer on a free loopback port, serving a tiny Mixtral at random init."""
    from tools.explore.server import Explorer, bind, make_server

    runs = [load(Path("recipes/mixtral/tiny.yaml"), ["model.n_layers=2"])]
    sock = bind("127.0.0.1", 0)
    server = make_server(Explorer(runs), "127.0.0.1")
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/", runs[0]
    server.should_exit = True
    thread.join(timeout=10)


def _serve(runs):
    from tools.explore.server import Explorer, bind, make_server

    sock = bind("127.0.0.1", 0)
    server = make_server(Explorer(runs), "127.0.0.1")
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    return f"http://127.0.0.1:{sock.getsockname()[1]}/", server, thread


@pytest.fixture(scope="module")
def pair():
    """Two decoders of the same structure side by side: LLaMA (dense) and Mixtral (MoE), 2 blocks each."""
    runs = [load(Path("recipes/llama/tiny.yaml"), ["model.n_layers=2"]),
            load(Path("recipes/mixtral/tiny.yaml"), ["model.n_layers=2"])]
    url, server, thread = _serve(runs)
    yield url, runs
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def bert_pair():
    """BERT beside LLaMA (both byte tokens, 2 blocks)."""
    runs = [load(Path("recipes/bert/tiny.yaml"), ["model.n_layers=2"]),
            load(Path("recipes/llama/tiny.yaml"), ["model.n_layers=2"])]
    url, server, thread = _serve(runs)
    yield url, runs
    server.should_exit = True
    thread.join(timeout=10)


def _run(page, url, text):
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    page.wait_for_selector(".bar")
    page.fill("#prompt", text)
    page.click("#analyze")
    page.wait_for_function("t => Explore.text === t && document.querySelector('.inside-panel')", arg=text)
    return errors


def _expected_probs(ex, text, T, k=0, p=1.0):
    ids = ex.codec.encode(text)
    with torch.no_grad():
        logits = ex.model(torch.tensor([ids])).logits[0, -1].double()
    return filter_logits(logits[None] / T, k, p).softmax(-1)[0], ids


def _bars(page):
    bars = page.query_selector_all(".bar")
    return {int(b.get_attribute("data-id")): float(b.get_attribute("data-prob")) for b in bars}


def test_temperature_slider_and_top_k_rescale_the_bars(browser, served):
    url, ex = served
    page = browser.new_page()
    assert _run(page, url, PROMPT) == []
    for T, k in ((1.0, 0), (0.3, 0), (1.7, 5)):
        page.eval_on_selector("#temperature", f"(e) => {{ e.value = '{T}'; e.dispatchEvent(new Event('input')); }}")
        page.fill("#top-k", str(k))
        page.dispatch_event("#top-k", "input")
        probs, _ = _expected_probs(ex, PROMPT, T, k)
        bars = _bars(page)
        top = torch.topk(probs, min(20, k or 20)).indices.tolist()
        assert sorted(bars) == sorted(top)
        for i, p in bars.items():
            assert p == pytest.approx(float(probs[i]), rel=1e-4)
    page.close()


def test_hover_highlights_the_models_attention_weights(browser, served):
    url, ex = served
    page = browser.new_page()
    _run(page, url, PROMPT)
    page.hover('.tokens .tok[data-index="7"]')
    page.wait_for_selector('.row-readout[data-query="7"]')
    shown = [float(e.get_attribute("data-weight")) for e in page.query_selector_all(".row-readout .tok.weight")]
    ids = ex.codec.encode(PROMPT)
    with capture_attention(ex.model) as caps, torch.no_grad():
        ex.model(torch.tensor([ids]))
    probs = caps["blocks.0.attn"].records[0].probs[0, 0, 7]  # layer 0, head 0, query 7
    assert shown == pytest.approx(probs.tolist(), abs=1e-6)
    assert sum(shown[8:]) == 0  # the causal mask: no weight on later keys
    page.close()


def test_moe_view_shows_the_routers_experts(browser, served):
    url, ex = served
    page = browser.new_page()
    _run(page, url, PROMPT)
    page.select_option(".moe-layer", "1")
    page.wait_for_selector(".moe-panel h2:has-text('block 1')")
    ids = ex.codec.encode(PROMPT)
    with capture_routing(ex.model) as caps, torch.no_grad():
        ex.model(torch.tensor([ids]))
    r = caps["blocks.1.ffn.router"][0]
    for n, row in enumerate(page.query_selector_all(".moe-panel tr.route")):
        chips = row.query_selector_all(".expert")
        shown = {int(c.get_attribute("data-expert")): float(c.get_attribute("data-weight")) for c in chips}
        expected = dict(zip(r.experts_NK[n].tolist(), r.weights_NK[n].tolist()))
        assert shown.keys() == expected.keys()
        assert list(shown.values()) == pytest.approx([expected[e] for e in shown], abs=1e-6)
    page.close()


def test_bad_input_shows_one_line_in_the_page(browser, served):
    url, ex = served
    page = browser.new_page()
    _run(page, url, PROMPT)
    page.fill("#prompt", "x" * (ex.max_len + 5))
    page.click("#analyze")
    page.wait_for_selector(".run-error")
    msg = page.inner_text(".run-error")
    assert "shorten it" in msg and "Traceback" not in page.content()
    page.close()


def test_exported_page_renders_offline(browser, tmp_path):
    from tools.explore import cli

    out = tmp_path / "page.html"
    assert cli.main(["recipes/bert/tiny.yaml", "model.n_layers=2", "--export", str(out), "--prompt",
                     "the cat [MASK] here"]) == 0
    ctx = browser.new_context(offline=True)
    page = ctx.new_page()
    requests = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(out.as_uri())
    page.wait_for_selector(".bar")
    page.wait_for_selector(".inside-panel")
    assert f"Masked prediction at position {len(b'the cat ')}" in page.inner_text(".next h2")  # byte ids
    assert all(u.startswith("file:") or u.startswith("data:") for u in requests), requests
    assert page.is_disabled("#sample")
    ctx.close()


@pytest.mark.parametrize("present, uid, apt_get, action", [
    (True, 1000, False, "ready"),
    (False, 0, True, "install"),
    (False, 1000, True, "fail"),
    (False, 0, False, "fail"),
])
def test_a_missing_chromium_is_installed_as_root_and_named_otherwise(present, uid, apt_get, action):
    got, text = chromium_action(present, uid, apt_get)
    assert got == action
    if (present, uid) == (False, 1000):
        assert text == f"{CHROMIUM} is missing; run as root: apt-get update && apt-get install -y chromium"
    if action == "install":
        assert text == "apt-get update && apt-get install -y chromium"


def test_bars_are_on_an_absolute_scale(browser, served):
    url, ex = served
    page = browser.new_page()
    _run(page, url, PROMPT)
    for T in (0.05, 2.0):
        page.eval_on_selector("#temperature", f"(e) => {{ e.value = '{T}'; e.dispatchEvent(new Event('input')); }}")
        probs, _ = _expected_probs(ex, PROMPT, T)
        for bar in page.query_selector_all(".bar"):
            p = float(probs[int(bar.get_attribute("data-id"))])
            fill, track = bar.query_selector(".bar-fill"), bar.query_selector(".bar-track")
            assert float(fill.evaluate("e => e.style.width").rstrip("%")) == pytest.approx(100 * p, abs=0.051)
            ratio = fill.bounding_box()["width"] / track.bounding_box()["width"]
            assert ratio == pytest.approx(p, abs=0.01)  # the full track is 100%, not the top bar
        assert float(page.get_attribute(".bar", "data-prob")) < 0.9
    page.close()


def test_heatmaps_carry_token_labels_and_their_value_scale(browser, served):
    url, ex = served
    page = browser.new_page()
    _run(page, url, PROMPT)
    ids = ex.codec.encode(PROMPT)
    labels = [ex.codec.decode([i]).replace(" ", "·") for i in ids]
    with capture_attention(ex.model) as caps, torch.no_grad():
        ex.model(torch.tensor([ids]))
    q = caps["blocks.0.attn"].records[0].q[0, 0]  # layer 0, head 0, after RoPE
    figs = page.query_selector_all(".inside-panel figure.map")
    titles = [f.query_selector("figcaption").inner_text() for f in figs]
    assert titles[0].startswith("Q after RoPE") and titles[1].startswith("K after RoPE")
    for fig in figs:
        ticks = fig.query_selector_all(".tick-y")
        assert ticks, fig.inner_text()
        assert all(tk.inner_text() == labels[int(tk.get_attribute("data-index"))] for tk in ticks)
    softmax = figs[titles.index("softmax (attention weights)")]
    xt = softmax.query_selector_all(".tick-x")
    assert xt and all(tk.inner_text() == labels[int(tk.get_attribute("data-index"))] for tk in xt)
    assert float(softmax.query_selector(".colorbar").get_attribute("data-max")) == 1.0
    qbar = figs[0].query_selector(".colorbar")
    assert float(qbar.get_attribute("data-max")) == pytest.approx(float(q.abs().max()), rel=1e-5)
    assert float(qbar.get_attribute("data-min")) == pytest.approx(-float(q.abs().max()), rel=1e-5)
    page.close()


def test_the_language_switch_translates_every_view(browser, served):
    url, ex = served
    page = browser.new_page()
    _run(page, url, PROMPT)
    assert page.evaluate("Object.keys(STRINGS.en).filter(k => !(k in STRINGS.zh))") == []
    assert page.evaluate("Object.keys(STRINGS.zh).filter(k => !(k in STRINGS.en))") == []
    english = page.inner_text("#columns")
    page.select_option("#lang", "zh")
    page.wait_for_selector(".inside-panel")
    chinese = page.inner_text("#columns")
    for zh in ("词元", "词嵌入 + 位置", "残差流", "前馈网络", "注意力图", "Logit 透镜", "KV 缓存", "MoE 路由"):
        assert zh in chinese, zh
    assert "Next token" in english and "Next token" not in chinese
    assert page.inner_text("#analyze") == "运行模型" and page.get_attribute("html", "lang") == "zh-CN"
    explains = page.query_selector_all(".explain")
    assert len(explains) >= 8 and all(any("\u4e00" <= ch <= "\u9fff" for ch in e.inner_text()) for e in explains)
    page.select_option("#lang", "en")
    assert "Next token" in page.inner_text("#columns")
    page.close()


def test_logit_lens_reads_each_block_through_the_final_norm_and_head(browser, served):
    url, ex = served
    page = browser.new_page()
    _run(page, url, PROMPT)
    ids = ex.codec.encode(PROMPT)
    outs = []
    hooks = [b.register_forward_hook(lambda m, a, o: outs.append(o[0])) for b in ex.model.blocks]
    with torch.no_grad():
        final = ex.model(torch.tensor([ids])).logits[0, -1].softmax(-1)
        for h in hooks:
            h.remove()
        lens = [ex.model.head_logits(ex.model.final_norm(x))[0, -1].softmax(-1) for x in outs]
    rows = page.query_selector_all(".lens-panel tr.lens-row")
    assert len(rows) == len(ex.model.blocks)
    for row, p in zip(rows, lens):
        cells = row.query_selector_all(".lens-tok")
        top = p.topk(len(cells))
        assert [int(c.get_attribute("data-id")) for c in cells] == top.indices.tolist()
        assert [float(c.get_attribute("data-prob")) for c in cells] == pytest.approx(top.values.tolist(), abs=1e-6)
    last = [float(c.get_attribute("data-prob")) for c in rows[-1].query_selector_all(".lens-tok")]
    assert last == pytest.approx(final.topk(len(last)).values.tolist(), abs=1e-6)  # the last block = the output
    page.select_option(".lens-pos", "3")  # another position: asked of the server
    page.wait_for_selector('.lens-table[data-pos="3"]')
    for row, x in zip(page.query_selector_all(".lens-panel tr.lens-row"), outs):
        with torch.no_grad():
            p = ex.model.head_logits(ex.model.final_norm(x))[0, 3].softmax(-1)
        cells = row.query_selector_all(".lens-tok")
        assert [int(c.get_attribute("data-id")) for c in cells] == p.topk(len(cells)).indices.tolist()
    page.close()


def test_ffn_kv_cache_and_moe_text_views_read_the_models(browser, pair):
    url, (llama, mixtral) = pair
    page = browser.new_page()
    _run(page, url, PROMPT)
    ids = torch.tensor([llama.codec.encode(PROMPT)])
    ffn_in = []
    hook = llama.model.blocks[0].ffn.register_forward_hook(lambda m, a, o: ffn_in.append(a[0]))
    with torch.no_grad():
        llama.model(ids)
        hook.remove()
        act = llama.model.blocks[0].ffn.activate(llama.model.blocks[0].ffn.up_proj(ffn_in[0]))[0]
    col0 = page.query_selector('.column[data-col="0"]')
    col0.wait_for_selector(".ffn-step .mag-bar")
    mag = [float(b.get_attribute("data-value")) for b in col0.query_selector_all(".ffn-step .mag-bar")]
    assert mag == pytest.approx(act.abs().mean(0).tolist(), abs=1e-6)
    cache = llama.model.new_kv_cache()
    with torch.no_grad():
        llama.model(ids, kv_cache=cache)
    shown = [float(r.get_attribute("data-prefill")) for r in col0.query_selector_all("tr.kv-layer")]
    assert shown == [lc.k.nbytes + lc.v.nbytes for lc in cache.layers]
    assert "GQA (this model)" in col0.inner_text()
    from archlab.nn.moe.capture import capture_routing as routing
    with routing(mixtral.model) as caps, torch.no_grad():
        mixtral.model(ids)
    col1 = page.query_selector('.column[data-col="1"]')
    for layer in range(2):
        r = caps[f"blocks.{layer}.ffn.router"][0]
        cells = col1.query_selector_all(f'.moe-all tr.moe-all-row[data-layer="{layer}"] td.moe-cell')
        assert len(cells) == ids.shape[1]
        for n, cell in enumerate(cells):
            order = r.weights_NK[n].argsort(descending=True)
            assert cell.get_attribute("data-experts") == ",".join(str(int(r.experts_NK[n, k])) for k in order)
    page.close()


def test_side_by_side_mirrors_clicks_and_hovers_and_labels_generation(browser, pair):
    url, (llama, mixtral) = pair
    page = browser.new_page()
    _run(page, url, PROMPT)
    page.click('.column[data-col="0"] .flow-block[data-layer="1"]')
    for c in (0, 1):
        page.wait_for_selector(f'.column[data-col="{c}"] .maps-panel h2:has-text("block 1")')
        assert page.get_attribute(f'.column[data-col="{c}"] .flow-block[data-layer="1"]', "class").endswith("selected")
    flow = page.query_selector('.column[data-col="1"] svg.flow').bounding_box()
    column = page.query_selector('.column[data-col="1"]').bounding_box()
    assert flow["width"] <= column["width"]  # every block visible at half width (drawn top to bottom)
    page.hover('.column[data-col="0"] .tokens .tok[data-index="7"]')
    page.wait_for_selector('.column[data-col="1"] .row-readout[data-query="7"]')
    requests = []
    page.on("request", lambda r: requests.append(r.post_data_json) if r.url.endswith("api/generate") else None)
    assert page.inner_text("#gen-target-label").startswith("with")
    page.select_option("#gen-target", "1")
    page.click("#sample")
    page.wait_for_selector("#generated .gen-row")
    assert [r["run"] for r in requests] == [1] and mixtral.label in page.inner_text("#generated")
    page.wait_for_function("t => Explore.text !== t", arg=PROMPT)
    requests.clear()
    text = page.evaluate("Explore.text")
    page.select_option("#gen-target", "both")
    page.fill("#gen-n", "2")
    page.click("#generate")
    page.wait_for_function("() => document.querySelectorAll('#generated .gen-row').length === 2")
    assert sorted(r["run"] for r in requests) == [0, 1]
    rows = page.query_selector_all("#generated .gen-row")
    assert llama.label in rows[0].inner_text() and mixtral.label in rows[1].inner_text()
    assert page.evaluate("Explore.text") == text  # both: shown side by side, the prompt kept
    page.close()


def test_bert_predicts_at_the_new_texts_mask(browser, bert_pair):
    url, (bert, _) = bert_pair
    page = browser.new_page()
    _run(page, url, "x [MASK] y")
    head = '.column[data-col="0"] .next h2'
    assert "position 2" in page.inner_text(head)
    page.fill("#prompt", "[MASK] x y z")  # a new text in the same page: position 2 is still in range
    page.click("#analyze")
    page.wait_for_function("t => Explore.text === t", arg="[MASK] x y z")
    assert "position 0" in page.inner_text(head)
    ids = [tok["id"] for tok in page.evaluate("Explore.runs[0].tokens")]
    with torch.no_grad():
        p = bert.model(torch.tensor([ids])).logits[0, 0].softmax(-1)
    bars = _bars(page.query_selector('.column[data-col="0"]'))
    assert max(bars, key=bars.get) == int(p.argmax())
    page.close()
