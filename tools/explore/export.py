"""``--export page.html``: the page of one prompt with every run's data and every head's detail
inlined, written atomically; it opens offline (no server, no network)."""

from __future__ import annotations

from pathlib import Path

from archlab.io import write_text_atomic
from tools.explore import compute
from tools.explore.load import Explorable, ExploreError
from tools.explore.page import render


def page_data(runs: list[Explorable], text: str) -> dict:
    """What the served page gets from /api/analyze, plus each head's /api/detail."""
    out = []
    for ex in runs:
        try:
            an = compute.analyse(ex, text)
        except ExploreError as e:
            out.append({"label": ex.label, "error": str(e)})
            continue
        details: dict = {}  # stack -> block number -> heads (a Gated DeltaNet block: its one detail)
        for (stack, layer), rec in an.records.items():
            details.setdefault(stack, {})[layer] = [compute.detail(an, stack, layer, h)
                                                    for h in range(rec.q.shape[1])]
        for stack, layer in an.stateful:
            details.setdefault(stack, {})[layer] = [compute.detail(an, stack, layer, 0)]
        data = dict(an.data)
        data["details"] = details
        out.append(data)
    return {"text": text, "runs": out}


def export(runs: list[Explorable], text: str, path: Path) -> None:
    if path.suffix not in (".html", ".htm"):
        raise ExploreError(f"--export {path}: name an .html file")
    if not path.parent.exists():
        raise ExploreError(f"--export {path}: folder {path.parent} does not exist")
    data = page_data(runs, text)
    if all("error" in r for r in data["runs"]):
        raise ExploreError(data["runs"][0]["error"])
    write_text_atomic(path, render(data))
