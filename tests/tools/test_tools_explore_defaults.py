"""The explorer's default prompt (read from the run's own validation split) and its refusal of text
that is not valid Unicode, on every endpoint that takes text."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

import archlab
from archlab.data import build_corpus, split_corpus
from archlab.data.tokenizer import build_tokenizer
from archlab.train import checkpoint
from tools.explore import compute
from tools.explore.load import load
from tools.explore.prompt import NEUTRAL

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


def _validation_text(cfg) -> str:
    """The first validation document as training splits it (the run's own settings, read in full)."""
    d = cfg.data
    return split_corpus(build_corpus(d), d.val_fraction, d.seed, d.get("max_bytes")).val[0]


@pytest.mark.parametrize("recipe, gap", [("recipes/llama/tiny.yaml", None), ("recipes/bert/tiny.yaml", "[MASK]"),
                                         ("recipes/t5/tiny.yaml", "<extra_id_0>")])
def test_the_default_prompt_is_the_start_of_the_validation_split(recipe, gap):
    ex = load(Path(recipe), ["model.n_layers=1"])
    p, val = ex.prompt, _validation_text(ex.cfg)
    assert "validation split" in p.note and "Python" in p.note
    head, tail = p.text.split(gap) if gap else (p.text, "")
    assert val.startswith(head) and len(ex.codec.encode(head + tail)) <= 48
    end = len(head)
    if gap:  # one word of the text replaced: what follows it is the text's own continuation
        assert p.text.count(gap) == 1 and tail
        word, end = re.match(r"\w+", val[len(head):]), val.find(tail, len(head)) + len(tail)
        assert word and val[len(head) + word.end():].startswith(tail)
    assert len(head + tail) >= 16 and val[end] in "\n "  # cut at a line (or word) boundary
    data = compute.analyse(ex, p.text).data
    assert gap is None or gap in [t["text"] for t in data["tokens"]]


def _text_run(tmp_path: Path, corpus: Path, env: bool) -> Path:
    """A run folder (random weights) trained, as its recipe says, on the text files under ``corpus``."""
    cfg = archlab.load_recipe("recipes/llama/tiny.yaml", ["model.n_layers=1", "data.source=text",
                                                          f"data.paths=[{corpus}]", "data.val_fraction=0.4"])
    run = tmp_path / "run"
    run.mkdir()
    (run / checkpoint.RUN_MARKER).write_text("{}")
    build_tokenizer("byte", [], 257).save(run / "tokenizer.json")
    if env:
        (run / "env.json").write_text(json.dumps({"data_meta": {"source": "text"}}))
    tmp = checkpoint.begin(run, 1)
    checkpoint.save_model_weights(archlab.build_model(cfg), tmp / checkpoint.WEIGHTS)
    checkpoint.save_recipe(cfg, tmp / checkpoint.RECIPE)
    checkpoint.finish(run, 1, keep_last=1)
    return run


def test_a_run_opens_on_its_own_corpus_and_without_one_on_a_neutral_sentence(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(4):
        (corpus / f"doc{i}.txt").write_text(f"document {i} line one\nsecond line of {i}\n" * 20)
    ex = load(_text_run(tmp_path, corpus, env=True))
    val = _validation_text(ex.cfg)
    assert val.startswith(ex.prompt.text) and ex.prompt.text.startswith("document ")
    assert str(corpus) in ex.prompt.note
    shutil.rmtree(corpus)  # the corpus is not on this machine: the neutral sentence, and why
    gone = load(tmp_path / "run")
    assert gone.prompt.text == NEUTRAL["decoder"] and "a neutral sentence" in gone.prompt.note
    assert str(corpus) in gone.prompt.note and "\n" not in gone.prompt.note


def test_a_run_folder_without_env_json_is_not_guessed_at(tmp_path):
    """An imported model's folder records no training data: its recipe's data keys are defaults, not its corpus."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("alpha beta\n" * 50)
    run = _text_run(tmp_path, corpus, env=False)
    assert load(run).prompt.text == NEUTRAL["decoder"] and "env.json" in load(run).prompt.note
    (run / checkpoint.RUN_MARKER).write_text(json.dumps({"imported_from": {"hf_folder": "/models/gpt2"}}))
    assert "was imported from /models/gpt2" in load(run).prompt.note


def test_export_without_prompt_uses_the_default_and_the_server_offers_it(tmp_path, capsys):
    from starlette.testclient import TestClient

    from tools.explore import cli
    from tools.explore.server import Explorer, app

    page = tmp_path / "p.html"
    assert cli.main(["recipes/llama/tiny.yaml", "model.n_layers=1", "--export", str(page)]) == 0
    out, err = capsys.readouterr()
    ex = load(Path("recipes/llama/tiny.yaml"), ["model.n_layers=1"])
    assert f"wrote {page}" in out and ex.prompt.note in err
    assert json.dumps(ex.prompt.text).replace("<", "\\u003c").replace(">", "\\u003e") in page.read_text()
    info = TestClient(app(Explorer([ex]), ["testserver"])).get("/api/info").json()
    assert info["prompt"] == ex.prompt.text
