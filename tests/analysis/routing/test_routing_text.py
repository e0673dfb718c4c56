"""``python -m analysis.routing RUN --text ...``: routing statistics of a run's checkpoint over a text the user
gives (a file or the text itself), also for a run folder with no training records (imported weights)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from analysis.routing.capture import capture_topk, read_texts, to_windows
from analysis.routing.cli import main
from analysis.runs import RunError
from archlab.config import load_recipe
from archlab.data import Tokenizer
from archlab.train import train
from archlab.train.checkpoint import load_model

TINY = ["model.vocab_size=384", "model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.n_kv_heads=1",
        "model.moe.num_experts=4", "model.moe.expert_hidden=32", "train.seq_len=32", "train.micro_batch_size=4",
        "train.max_steps=4", "train.warmup_steps=1", "train.eval_every=4", "train.eval_batches=1",
        "train.ckpt_every=4", "train.tensorboard=false", "train.eval_context_multipliers=[1]",
        "data.max_bytes=100000"]
ROOT = Path(__file__).resolve().parents[3]
TEXT = "def add(a, b):\n    return a + b\n\nclass Point:\n    x: int = 0\n"


@pytest.fixture(scope="module")
def imported_run(tmp_path_factory):
    """A tiny Mixtral run folder stripped of its training records (as imported weights would be)."""
    base = tmp_path_factory.mktemp("routing-text")
    train(load_recipe(ROOT / "recipes/mixtral/tiny.yaml", [*TINY, f"data.cache_dir={base / 'cache'}",
                                                            f"train.out_dir={base}", "train.run_name=trained"]))
    run = base / "imported"
    shutil.copytree(base / "trained", run)
    for name in ("metrics.jsonl", "routing.jsonl", "summary.json"):
        (run / name).unlink(missing_ok=True)
    return run


def test_routing_over_a_given_text_counts_every_expert_slot(imported_run, tmp_path):
    out = tmp_path / "out"
    assert main([str(imported_run), "--out", str(out), "--text", TEXT]) == 0
    s = json.loads((out / "summary.json").read_text())
    ck = s["checkpoint"]
    assert ck["source"] == "1 --text string(s)" and "routed_load.png" in s["files"]
    assert (out / "routed_load.png").stat().st_size > 5000
    # the same counts from the routers' own choices over the same tokens
    ids = np.asarray(Tokenizer.load(imported_run / "tokenizer.json").encode(TEXT), dtype=np.int64)
    model, _ = load_model(imported_run)
    assert len(ids) > 32  # one window of seq_len and a tail: both routed
    topk = capture_topk(model, to_windows(ids, 32))
    tail = capture_topk(model, torch.from_numpy(ids[32:]).view(1, -1))
    topk = {layer: np.concatenate([e_NK, tail[layer]]) for layer, e_NK in topk.items()}
    for layer, e_NK in topk.items():
        load = ck["load"][layer]
        assert load["slots_per_expert"] == np.bincount(e_NK.reshape(-1), minlength=4).tolist()
        assert sum(load["slots_per_expert"]) == 2 * len(ids) == 2 * ck["tokens"]  # top-2, every token
        assert load["dead"] == [e for e in range(4) if load["slots_per_expert"][e] == 0]
    assert "| layer | slots per expert (min / mean / max) | dead experts |" in (out / "summary.md").read_text()


def test_text_arguments_are_files_globs_or_the_text_itself(tmp_path):
    (tmp_path / "a.txt").write_text("alpha")
    texts, source = read_texts([str(tmp_path / "*.txt"), "two words"])
    assert texts == ["alpha", "two words"] and source == "1 --text file(s) and 1 --text string(s)"
    with pytest.raises(RunError, match="--text nofile.txt: no such file"):
        read_texts(["nofile.txt"])
