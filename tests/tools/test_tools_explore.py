"""The explorer's compute layer, loader, server and CLI without a browser: the numbers each view gets
come from the model, and every bad input is one clear line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import archlab
from archlab.train import checkpoint
from tools.explore import cli, compute
from tools.explore.encode import decode
from tools.explore.load import ExploreError, load


def _ex(recipe, *over):
    return load(Path(recipe), ["model.n_layers=2", *over])


def test_decoder_page_data_equals_the_model():
    ex = _ex("recipes/llama/tiny.yaml")
    an = compute.analyse(ex, "hello")
    ids = [t["id"] for t in an.data["tokens"]]
    assert ids == list(b"hello") and [t["span"] for t in an.data["tokens"]] == [[i, i + 1] for i in range(5)]
    with torch.no_grad():
        logits = ex.model(torch.tensor([ids])).logits[0, -1]
    assert decode(an.data["next"]["logits"]) == pytest.approx(logits.numpy(), abs=1e-6)
    assert [t["id"] for t in an.data["next"]["top"]] == logits.topk(20).indices.tolist()
    att = an.data["attention"]["self"]
    assert len(att) == 2 and att[0]["kv_head"] == [0, 0, 1, 1]
    d = compute.detail(an, "self", 1, 3)
    assert d["kv_head"] == 1 and decode(d["probs"]).sum(-1) == pytest.approx([1.0] * 5, abs=1e-5)
    json.dumps(an.data)


def test_moe_bert_t5_views():
    moe = compute.analyse(_ex("recipes/deepseek/tiny.yaml"), "abc").data["moe"]
    assert [m["layer"] for m in moe] == [1] and moe[0]["shared"] == 2 and sum(moe[0]["load"]) == 3 * 6
    bert = compute.analyse(_ex("recipes/bert/tiny.yaml"), "ab [MASK]").data
    assert bert["tokens"][-1]["text"] == "[MASK]" and decode(bert["masked"]["logits"]).shape == (4, 1024)
    assert decode(bert["attention"]["self"][0]["allowed"]).all()  # bidirectional: nothing masked
    t5 = compute.analyse(_ex("recipes/t5/tiny.yaml"), "a <extra_id_0> b").data
    assert set(t5["attention"]) == {"encoder", "self", "cross"} and "filled" in t5
    assert t5["tokens"][2]["text"] == "<extra_id_0>" and t5["decoder_tokens"][0]["text"] == "<start>"


@pytest.mark.parametrize("text, message", [("", "the prompt is empty"), ("x" * 1100, "shorten it"),
                                           ("x" * 30_000, "at most 20000")])
def test_bad_prompts(text, message):
    with pytest.raises(ExploreError, match=message):
        compute.analyse(_ex("recipes/llama/tiny.yaml"), text)


def test_generate_appends_to_the_text():
    ex = _ex("recipes/llama/tiny.yaml")
    out = compute.generate_text(ex, "ab", 3, 0.0, 0, 1.0, 0)
    assert out.startswith("ab") and out != "ab"
    with pytest.raises(ExploreError, match="choose 1 to 64"):
        compute.generate_text(ex, "ab", 500, 1.0, 0, 1.0, 0)


def _run_folder(tmp_path, tokenizer: bool):
    cfg = archlab.load_recipe("recipes/llama/tiny.yaml", ["model.n_layers=1"])
    model = archlab.build_model(cfg)
    run = tmp_path / "run"
    run.mkdir(parents=True)
    (run / checkpoint.RUN_MARKER).write_text("{}")
    tmp = checkpoint.begin(run, 1)
    checkpoint.save_model_weights(model, tmp / checkpoint.WEIGHTS)
    checkpoint.save_recipe(cfg, tmp / checkpoint.RECIPE)
    checkpoint.finish(run, 1, keep_last=1)
    if tokenizer:
        from archlab.data.tokenizer import build_tokenizer
        build_tokenizer("byte", [], 257).save(run / "tokenizer.json")
    return run, model


def test_run_folder_loads_and_bad_folders_are_named(tmp_path, capsys):
    run, model = _run_folder(tmp_path, tokenizer=True)
    ex = load(run)
    assert ex.source == "run" and torch.equal(ex.model.embed.weight, model.embed.weight)
    no_tok, _ = _run_folder(tmp_path / "b", tokenizer=False)
    with pytest.raises(ExploreError, match="no tokenizer.json"):
        load(no_tok)
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text('{"model_type": "llama"}')
    for path, msg in ((tmp_path / "nope", "no such run folder"), (tmp_path / "hf", "python -m tools.import_hf"),
                      (tmp_path, "not an archlab run folder")):
        assert cli.main([str(path), "--export", str(tmp_path / "p.html"), "--prompt", "x"]) == 2
        err = capsys.readouterr().err
        assert msg in err and "Traceback" not in err and err.count("\n") == 1


def test_server_refuses_foreign_paths_big_bodies_and_foreign_hosts():
    from starlette.testclient import TestClient

    from tools.explore.server import MAX_BODY, Explorer, app

    c = TestClient(app(Explorer([_ex("recipes/llama/tiny.yaml")]), ["127.0.0.1", "testserver"]))
    assert c.get("/assets/core.js").status_code == 200
    assert c.get("/assets/..%2Fload.py").status_code == 404 and c.get("/tools/explore/load.py").status_code == 404
    r = c.post("/api/analyze", content=b"{" + b" " * MAX_BODY + b"}")
    assert r.status_code == 400 and "over" in r.json()["error"]
    assert c.post("/api/analyze", json={"text": "hi"}).json()["runs"][0]["tokens"][0]["id"] == ord("h")
    assert c.post("/api/detail", json={"text": "hi", "stack": "self", "layer": 0, "head": 9}).status_code == 400
    assert c.get("/", headers={"host": "evil.example"}).status_code == 400


def test_cli_serves_on_loopback_and_ctrl_c_stops_it_cleanly():
    import signal
    import subprocess
    import sys
    import urllib.request

    p = subprocess.Popen([sys.executable, "-m", "tools.explore", "recipes/llama/tiny.yaml", "model.n_layers=1",
                          "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    assert line.startswith("archlab explorer: http://127.0.0.1:"), line
    url = line.split()[2]
    with urllib.request.urlopen(url + "api/info", timeout=20) as r:
        assert json.loads(r.read())["runs"][0]["kind"] == "decoder"
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0 and "explorer stopped" in out and "Traceback" not in err


def test_two_tabs_at_once_get_their_own_prompts():
    from concurrent.futures import ThreadPoolExecutor

    from starlette.testclient import TestClient

    from tools.explore.server import Explorer, app

    c = TestClient(app(Explorer([_ex("recipes/llama/tiny.yaml")]), ["testserver"]))
    texts = [f"tab {i} text" for i in range(6)]
    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda t: c.post("/api/analyze", json={"text": t}).json(), texts))
    assert [a["text"] for a in answers] == texts
    assert all([t["id"] for t in a["runs"][0]["tokens"]] == list(t.encode()) for a, t in zip(answers, texts))


def test_a_missing_server_extra_is_named(monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "uvicorn", None)  # as if not installed
    assert cli.main(["recipes/llama/tiny.yaml", "model.n_layers=1", "--port", "0"]) == 2
    assert "pip install -e '.[explore]'" in capsys.readouterr().err
