"""The explorer's screenshots in docs/explorer/, every view in English and in Chinese, remade in
Chromium from the recipes at random init (or from the run folders given):

    python -m tools.explore.screenshots --out docs/explorer
    python -m tools.explore.screenshots --decoder runs/<llama-tiny run> --layers 4
    python -m tools.explore.screenshots --only hybrid   # the Gated DeltaNet / attention hybrid's flow alone

Each view is written as ``<view>.png`` (English) and ``<view>.zh.png`` (Chinese).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import Optional, Sequence

from tools.explore.load import load
from tools.explore.server import Explorer, bind, make_server

ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--no-first-run"]
PROMPT = "The cat sat on the mat because it was tired."
# (file name, CSS selector of the element to capture) per page
DECODER_VIEWS = [("tokens", '.column[data-col="0"] .tokens'), ("embedding", '.column[data-col="0"] .embed-panel'),
                 ("data_flow", '.column[data-col="0"] .flow-panel'),
                 ("residual_stream", '.column[data-col="0"] .resid-panel'),
                 ("inside_block", '.column[data-col="0"] .inside-panel'),
                 ("norm", '.column[data-col="0"] .norm-step'),
                 ("output_projection", '.column[data-col="0"] .proj-step'),
                 ("feed_forward", '.column[data-col="0"] .ffn-step'),
                 ("attention_maps", '.column[data-col="0"] .maps-panel'),
                 ("next_token", '.column[data-col="0"] .next'), ("logit_lens", '.column[data-col="0"] .lens-panel'),
                 ("kv_cache", '.column[data-col="0"] .kv-panel'), ("controls", "#controls")]
MOE_VIEWS = [("moe_routing", '.column[data-col="0"] .moe-panel'),
             ("moe_whole_text", '.column[data-col="0"] .moe-all-panel')]
# the flow panel down to the Gated DeltaNet block's explanation (page coordinates)
HYBRID_CLIP = """(() => {
  const a = document.querySelector('.column[data-col="0"] .flow-panel').getBoundingClientRect();
  const b = document.querySelector('.column[data-col="0"] .gdn-explain').getBoundingClientRect();
  return {x: a.left + scrollX, y: a.top + scrollY, width: a.width, height: b.bottom - a.top + 8};
})()"""
BERT_VIEWS = [("bert_masked", '.column[data-col="0"] .next')]
T5_VIEWS = [("t5_span_filling", '.column[data-col="0"] .span'),
            ("t5_cross_attention", '.column[data-col="0"] .maps-panel')]


def _serve(runs):
    sock = bind("127.0.0.1", 0)
    server = make_server(Explorer(runs), "127.0.0.1")
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return server, f"http://127.0.0.1:{sock.getsockname()[1]}/"


def _shoot(browser, runs, prompt: str, views, out: Path, setup: Optional[str] = None, width: int = 1500,
           full: Optional[str] = None, clip: Optional[str] = None) -> list[Path]:
    """Serve ``runs``, analyse ``prompt``, run ``setup`` (JavaScript) and capture each view in both languages."""
    server, url = _serve(runs)
    page = browser.new_page(viewport={"width": width, "height": 1000})
    page.goto(url)
    page.wait_for_selector(".bar")
    page.evaluate("t => analyze(t)", prompt)
    page.wait_for_function("t => Explore.text === t && document.querySelector('.inside-panel')", arg=prompt)
    if setup:
        page.evaluate(setup)
        page.wait_for_timeout(300)
    written = []
    for lang, suffix in (("en", ""), ("zh", ".zh")):
        page.select_option("#lang", lang)
        page.wait_for_selector(".inside-panel")
        page.wait_for_timeout(200)
        for name, sel in views:
            path = out / f"{name}{suffix}.png"
            page.locator(sel).first.screenshot(path=str(path))
            written.append(path)
        if full:
            path = out / f"{full}{suffix}.png"
            box = page.evaluate(clip) if clip else {"x": 0, "y": 0, "width": width, "height": 1500}
            page.screenshot(path=str(path), clip=box, full_page=bool(clip))
            written.append(path)
    page.close()
    server.should_exit = True
    return written


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.explore.screenshots", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("docs/explorer"))
    p.add_argument("--decoder", type=Path, default=Path("recipes/llama/tiny.yaml"))
    p.add_argument("--moe", type=Path, default=Path("recipes/mixtral/tiny.yaml"))
    p.add_argument("--bert", type=Path, default=Path("recipes/bert/tiny.yaml"))
    p.add_argument("--t5", type=Path, default=Path("recipes/t5/tiny.yaml"))
    p.add_argument("--sliding", type=Path, default=Path("recipes/mistral/tiny.yaml"))
    p.add_argument("--deepseek", type=Path, default=Path("recipes/deepseek/tiny.yaml"))
    p.add_argument("--hybrid", type=Path, default=Path("recipes/hybrid/tiny.yaml"))
    p.add_argument("--layers", type=int, default=2, help="model.n_layers of the recipes at random init")
    p.add_argument("--only", choices=["hybrid"], help="remake only these screenshots")
    args = p.parse_args(argv)
    from playwright.sync_api import sync_playwright

    args.out.mkdir(parents=True, exist_ok=True)
    written = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=ARGS)
        # its whole layer pattern (3 Gated DeltaNet : 1 attention), block 1 (Gated DeltaNet) open
        written += _shoot(browser, [load(args.hybrid)], PROMPT, [], args.out, "pickBlock(0, 'self', 1)",
                          full="hybrid_flow", clip=HYBRID_CLIP)
        browser.close()
    if args.only == "hybrid":
        print("\n".join(map(str, written)))
        return 0
    over = lambda path: [f"model.n_layers={args.layers}"] if path.suffix == ".yaml" else []  # noqa: E731
    dec, moe = load(args.decoder, over(args.decoder)), load(args.moe, over(args.moe))
    bert, t5 = load(args.bert, over(args.bert)), load(args.t5, over(args.t5))
    sliding, deepseek = load(args.sliding, over(args.sliding)), load(args.deepseek, over(args.deepseek))
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=ARGS)
        hover = "setHover(0, 5)"
        written += _shoot(browser, [dec], PROMPT, DECODER_VIEWS, args.out, hover)
        written += _shoot(browser, [moe], PROMPT, MOE_VIEWS, args.out)
        written += _shoot(browser, [bert], "The cat sat on the [MASK].", BERT_VIEWS, args.out)
        written += _shoot(browser, [t5], "The cat <extra_id_0> on the mat.", T5_VIEWS, args.out,
                          "Explore.cols[0].stack = 'cross'; renderAll()")
        long = " ".join([PROMPT] * 2)  # past the sliding window of 48
        written += _shoot(browser, [sliding], long, [("attention_sliding_window", '.column[data-col="0"] .maps-panel'),
                                                     ("kv_cache_sliding_window", '.column[data-col="0"] .kv-panel')],
                          args.out)
        written += _shoot(browser, [deepseek], PROMPT, [("moe_deepseek", '.column[data-col="0"] .moe-all-panel')],
                          args.out)
        written += _shoot(browser, [dec, moe], PROMPT, [], args.out, "pickBlock(0, 'self', 1); setHover(0, 5)",
                          width=1500, full="side_by_side")
        browser.close()
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
