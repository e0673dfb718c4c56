"""The explorer's ASGI app (Starlette) and its server (uvicorn).

Routes: ``/`` the page, ``/assets/<name>`` its vendored files (a fixed list: nothing else on disk is
reachable), ``/api/info``, ``/api/analyze``, ``/api/detail``, ``/api/generate``, ``/api/lens`` (JSON bodies of at
most ``MAX_BODY`` bytes). A user mistake answers 400 with ``{"error": one line}``; anything else
500 with a one-line message, its traceback printed in the terminal only. The models run one
request at a time (a lock), so two tabs at once queue rather than interleave.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import traceback
from collections import OrderedDict
from typing import Callable

from tools.explore import compute
from tools.explore.load import Explorable, ExploreError
from tools.explore.page import ASSETS, asset, render

MAX_BODY = 256 * 1024  # bytes of one request body
CACHED = 8  # analyses kept for the detail view (per run and text)
LOOPBACK = {"127.0.0.1", "localhost", "::1"}


class Explorer:
    """The loaded runs and the recent analyses of each."""

    def __init__(self, runs: list[Explorable]):
        self.runs = runs
        self.lock = threading.Lock()
        self.cache: OrderedDict[tuple[int, str], compute.Analysis] = OrderedDict()

    def analysis(self, run: int, text: str) -> compute.Analysis:
        key = (run, text)
        if key not in self.cache:
            self.cache[key] = compute.analyse(self.runs[run], text)
            while len(self.cache) > CACHED:
                self.cache.popitem(last=False)
        self.cache.move_to_end(key)
        return self.cache[key]

    def run_index(self, body: dict) -> int:
        run = body.get("run", 0)
        if not isinstance(run, int) or not 0 <= run < len(self.runs):
            raise ExploreError(f"run {run!r}: this explorer has runs 0 to {len(self.runs) - 1}")
        return run

    def analyze(self, body: dict) -> dict:
        text = _field(body, "text", str)
        runs = []
        for i in range(len(self.runs)):
            try:
                runs.append(self.analysis(i, text).data)
            except ExploreError as e:  # one run may refuse what the other takes (context, vocabulary)
                runs.append({"label": self.runs[i].label, "error": str(e)})
        return {"text": text, "runs": runs}

    def detail(self, body: dict) -> dict:
        run = self.run_index(body)
        an = self.analysis(run, _field(body, "text", str))
        return compute.detail(an, _field(body, "stack", str), _field(body, "layer", int), _field(body, "head", int))

    def lens(self, body: dict) -> dict:
        run = self.run_index(body)
        an = self.analysis(run, _field(body, "text", str))
        return compute.lens(an, self.runs[run], _field(body, "pos", int))

    def generate(self, body: dict) -> dict:
        run = self.run_index(body)
        text = compute.generate_text(self.runs[run], _field(body, "text", str), _field(body, "n", int),
                                     float(_field(body, "temperature", (int, float))), _field(body, "top_k", int),
                                     float(_field(body, "top_p", (int, float))), int(body.get("seed", 0)))
        return {"text": text}

    def info(self) -> dict:
        return {"runs": [{"label": r.label, "kind": r.kind, "max_len": r.max_len} for r in self.runs],
                "prompt": self.runs[0].prompt.text}  # the first run's default prompt


def _web():
    """starlette and uvicorn, the optional extra ``explore`` (imported here, not at module level)."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise ExploreError(f"the explorer's server needs starlette and uvicorn ({e.name} is missing): "
                           "pip install -e '.[explore]'") from None


def _field(body: dict, name: str, kind):
    v = body.get(name)
    if not isinstance(v, kind) or isinstance(v, bool):
        raise ExploreError(f"request field {name!r}: missing or of the wrong type")
    return unicode_text(v, f"request field {name!r}") if isinstance(v, str) else v


def unicode_text(text: str, what: str) -> str:
    """``text`` if it is valid Unicode; a lone surrogate (JSON's ``"\\ud800"``, or an undecodable byte of a
    command line) has no UTF-8 form, so no tokenizer can read it and the reply could not echo it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ExploreError(f"{what}: character {e.start} is a lone surrogate ({text[e.start]!r}), not a "
                           "character: send valid Unicode text") from None
    return text


async def _body(request) -> dict:
    size = request.headers.get("content-length")
    if size is not None and (not size.isdigit() or int(size) > MAX_BODY):
        raise ExploreError(f"request body over {MAX_BODY} bytes")
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY:
            raise ExploreError(f"request body over {MAX_BODY} bytes")
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        raise ExploreError("request body is not JSON") from None
    if not isinstance(body, dict):
        raise ExploreError("request body must be a JSON object")
    return body


def app(explorer: Explorer, allowed_hosts: list[str]):
    """The Starlette app: the page, its assets and the JSON routes."""
    _web()
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.middleware import Middleware
    from starlette.middleware.trustedhost import TrustedHostMiddleware
    from starlette.responses import HTMLResponse, JSONResponse, Response
    from starlette.routing import Route

    def endpoint(job: Callable[[dict], dict]):
        async def handle(request):
            try:
                body = await _body(request)

                def locked() -> dict:
                    with explorer.lock:
                        return job(body)

                return JSONResponse(await run_in_threadpool(locked))
            except ExploreError as e:
                return JSONResponse({"error": str(e)}, status_code=400)
            except Exception as e:  # noqa: BLE001  (the page gets one line; the terminal the traceback)
                traceback.print_exc()
                return JSONResponse({"error": f"internal error ({type(e).__name__}: {e}); see the terminal"},
                                    status_code=500)
        return handle

    async def index(_request):
        return HTMLResponse(render(None))

    async def assets(request):
        name = request.path_params["name"]
        if name not in ASSETS:
            return JSONResponse({"error": f"no asset {name!r}"}, status_code=404)
        return Response(asset(name), media_type=ASSETS[name])

    async def info(_request):
        return JSONResponse(explorer.info())

    routes = [Route("/", index), Route("/assets/{name}", assets), Route("/api/info", info),
              Route("/api/analyze", endpoint(explorer.analyze), methods=["POST"]),
              Route("/api/detail", endpoint(explorer.detail), methods=["POST"]),
              Route("/api/generate", endpoint(explorer.generate), methods=["POST"]),
              Route("/api/lens", endpoint(explorer.lens), methods=["POST"])]
    return Starlette(routes=routes, middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts)])


def bind(host: str, port: int) -> socket.socket:
    """A listening socket, or a one-line error (port in use, address not on this machine)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ExploreError(f"cannot listen on {host}:{port} ({e.strerror}): pass another --port") from None
    sock.listen(64)
    return sock


def make_server(explorer: Explorer, host: str):
    """A uvicorn server of :func:`app`; ``run(sockets=[bind(...)])`` serves until Ctrl-C."""
    _web()
    import uvicorn

    hosts = ["127.0.0.1", "localhost", "[::1]"] if host in LOOPBACK else ["*"]
    config = uvicorn.Config(app(explorer, hosts), log_level="warning", lifespan="off")
    return uvicorn.Server(config)


def serve(explorer: Explorer, host: str, port: int) -> None:
    """Serve until Ctrl-C."""
    if host not in LOOPBACK:
        print(f"warning: listening on {host}: anyone who can reach this machine can use the explorer",
              file=sys.stderr)
    sock = bind(host, port)
    shown = f"[{host}]" if ":" in host else host
    print(f"archlab explorer: http://{shown}:{sock.getsockname()[1]}/  (Ctrl-C stops it)", flush=True)
    make_server(explorer, host).run(sockets=[sock])
    print("explorer stopped")
