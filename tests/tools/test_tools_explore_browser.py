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
