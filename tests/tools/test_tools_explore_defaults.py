"""The explorer's default prompt (read from the run's own validation split) and its refusal of text
that is not valid Unicode, on every endpoint that takes text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from archlab.data.tokenizer import build_tokenizer
from tools.explore.load import load

LONE_SURROGATE = "abc \ud800 def"  # what JSON's "abc \\ud800 def" decodes to: no UTF-8 encoding exists


@pytest.fixture(scope="module")
def bpe_file(tmp_path_factory) -> Path:
    """A tiny trained BPE tokenizer.json (HF tokenizers), whose encode raises TypeError on a lone surrogate."""
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    build_tokenizer("bpe", ["def f(x):\n    return x + 1\n" * 20, "the cat sat on the mat\n" * 20], 280).save(path)
    return path


@pytest.mark.parametrize("tokenizer", ["bpe", "byte"])
def test_a_lone_surrogate_is_a_400_on_every_text_endpoint(tokenizer, bpe_file):
    from starlette.testclient import TestClient

    from tools.explore.server import Explorer, app

    tok = bpe_file if tokenizer == "bpe" else None
    ex = load(Path("recipes/llama/tiny.yaml"), ["model.n_layers=1"], tok)
    c = TestClient(app(Explorer([ex]), ["testserver"]), raise_server_exceptions=False)
    bodies = {"/api/analyze": {"text": LONE_SURROGATE},
              "/api/detail": {"text": LONE_SURROGATE, "stack": "self", "layer": 0, "head": 0},
              "/api/generate": {"text": LONE_SURROGATE, "n": 1, "temperature": 1.0, "top_k": 0, "top_p": 1.0}}
    bodies["/api/detail (stack)"] = {"text": "abc", "stack": "s\udc80", "layer": 0, "head": 0}
    for route, body in bodies.items():
        r = c.post(route.split()[0], content=json.dumps(body))  # ASCII JSON: the surrogate as \ud800
        error = r.json()["error"]
        assert r.status_code == 400, (route, error)
        assert "surrogate" in error and "\n" not in error, (route, error)


def test_a_lone_surrogate_in_the_export_prompt_is_one_line(tmp_path, capsys):
    from tools.explore import cli

    page = tmp_path / "p.html"  # "\udcff": how Python hands over a byte of the command line that is not UTF-8
    assert cli.main(["recipes/llama/tiny.yaml", "model.n_layers=1", "--export", str(page), "--prompt", "a \udcff"]) == 2
    err = capsys.readouterr().err
    assert "--prompt: character 2 is a lone surrogate" in err and err.count("\n") == 1 and not page.exists()
