"""The vendored front end (``static/``: plain JavaScript, SVG and canvas, no CDN) and the offline
export: one HTML file with the styles, scripts and the page data inlined."""

from __future__ import annotations

import json
from importlib import resources
from typing import Optional

SCRIPTS = ["i18n.js", "core.js", "maps.js", "views.js", "steps.js"]
ASSETS = {"style.css": "text/css", **{s: "text/javascript" for s in SCRIPTS}}


def asset(name: str) -> bytes:
    return resources.files("tools.explore").joinpath("static", name).read_bytes()


def _inline_json(obj) -> str:
    """JSON safe inside a <script> element (no "</script>", no HTML comment openers)."""
    return json.dumps(obj, separators=(",", ":")).replace("<", "\\u003c").replace(">", "\\u003e")


def render(data: Optional[dict]) -> str:
    """The page: served (assets by URL, data by the API) or, with ``data``, self-contained."""
    html = asset("index.html").decode()
    if data is None:
        style = '<link rel="stylesheet" href="assets/style.css">'
        scripts = "".join(f'<script src="assets/{s}"></script>' for s in SCRIPTS)
        inline = ""
    else:
        style = f"<style>{asset('style.css').decode()}</style>"
        scripts = "".join(f"<script>{asset(s).decode()}</script>" for s in SCRIPTS)
        inline = f"<script>window.EXPLORE_DATA = {_inline_json(data)};</script>"
    return html.replace("<!--STYLE-->", style).replace("<!--DATA-->", inline).replace("<!--SCRIPTS-->", scripts)
