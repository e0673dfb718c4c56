"""Interaction latency of the explorer in Chromium (a benchmark, not a test): a new prompt of 128
tokens (request, model forward, page render), a temperature-slider move and a token hover.

    python -m tools.bench_explore --recipe recipes/llama/tiny.yaml --repeats 10

Each figure is the median (and max) over ``--repeats`` of the time from the action to the page
having drawn its result, measured in the page with performance.now().
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Optional, Sequence

import torch

from tools.explore.load import load
from tools.explore.server import Explorer, bind, make_server

ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--no-first-run"]

ANALYZE = """async (text) => { const t0 = performance.now(); await analyze(text);
  await new Promise(r => requestAnimationFrame(() => r())); return performance.now() - t0; }"""
SLIDER = """(T) => { const t0 = performance.now(); const e = document.getElementById('temperature');
  e.value = String(T); e.dispatchEvent(new Event('input')); return performance.now() - t0; }"""
HOVER = """(i) => { const t0 = performance.now(); setHover(0, i); return performance.now() - t0; }"""


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.bench_explore", description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", type=Path, default=Path("recipes/llama/tiny.yaml"))
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=10)
    args = p.parse_args(argv)
    from playwright.sync_api import sync_playwright

    torch.set_num_threads(1)
    ex = load(args.recipe)
    sock = bind("127.0.0.1", 0)
    server = make_server(Explorer([ex]), "127.0.0.1")
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    times: dict[str, list[float]] = {"new 128-token prompt": [], "temperature slider": [], "hover a token": []}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=ARGS)
        page = browser.new_page()
        page.goto(f"http://127.0.0.1:{sock.getsockname()[1]}/")
        page.wait_for_selector(".bar")
        for r in range(args.repeats):
            text = "".join(chr(97 + (r * 7 + i * 3) % 26) for i in range(args.tokens))  # byte codec: 1 char = 1 token
            times["new 128-token prompt"].append(page.evaluate(ANALYZE, text))
            times["temperature slider"].append(page.evaluate(SLIDER, 0.5 + 0.1 * r))
            times["hover a token"].append(page.evaluate(HOVER, (r * 13) % args.tokens))
        browser.close()
    server.should_exit = True
    print(f"{ex.label}, {args.tokens} tokens, {args.repeats} repeats, torch threads 1")
    for name, ts in times.items():
        print(f"  {name:22s} median {statistics.median(ts):7.1f} ms   max {max(ts):7.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
