"""Positive controls: a tiny model trained on a task from scratch beats the task's baseline on dev (a short loop
here; the whole trainer path, with its validation rows, marked slow)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

import archlab
from archlab.objectives import objective_for
from archlab.train import train
from archlab.train.run_folder import read_jsonl


def module(rng: random.Random) -> str:
    """Random identifiers in fixed shapes: a role shows in the context around a name, not in the name's letters."""
    def name():
        return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 6)))
    lines = []
    for _ in range(12):
        f, p, q, v, a, g = (name() for _ in range(6))
        lines.append(f"def {f}({p}, {q}):\n    {v} = {p}.{a}\n    return {g}({v}, {q})\n")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("modules")
    rng = random.Random(0)
    for i in range(30):
        (root / f"m{i:02d}.py").write_text(module(rng))
    return root


def recipe(corpus, tmp, *more):
    return archlab.load_recipe("recipes/finetune/bert-understand.yaml", [
        "model.d_model=32", "model.n_layers=1", "model.n_heads=2", "model.vocab_size=260", "data.source=text",
        f"data.paths=[{corpus}]", "data.tokenizer=byte", "data.val_fraction=0.2", f"data.cache_dir={tmp}/cache",
        f"train.out_dir={tmp}", "train.seq_len=32", "train.micro_batch_size=32", "train.tensorboard=false",
        "train.objective=tag", *more])


def test_a_short_loop_learns_the_roles_beyond_the_token_baseline(corpus, tmp_path):
    cfg = recipe(corpus, tmp_path)
    obj = objective_for(cfg)
    data = obj.prepare_data(cfg)
    torch.manual_seed(0)
    model = obj.build_model(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batches = obj.train_batches(data, 0, 1)
    for step in range(150):
        loss = obj.loss(model, batches.get(step)).total
        opt.zero_grad()
        loss.backward()
        opt.step()
    val = data.examples["val"]
    correct, counted = obj.item_scores(model, val)
    accuracy = correct.sum() / counted.sum()
    baseline = data.meta["baselines"]["val"]["baseline"]
    assert len(val) > 50 and baseline < 0.5  # the letters of a name do not tell its role
    assert accuracy > baseline + 0.3, (accuracy, baseline)  # 0.33 -> about 0.85


@pytest.mark.slow
def test_the_trainer_fine_tunes_tagging_and_writes_its_rows(corpus, tmp_path):
    cfg = recipe(corpus, tmp_path, "train.max_steps=150", "train.eval_every=50", "train.eval_batches=4",
                 "train.warmup_steps=10", "train.lr=1e-2", "train.run_name=tag")
    summary = train(cfg)
    rows = [r for r in read_jsonl(tmp_path / "tag" / "metrics.jsonl") if r.get("kind") == "val"]
    assert all(r["metric"] == "tag" and "tag_accuracy" in r for r in rows)
    meta = json.loads((tmp_path / "tag" / "env.json").read_text())["data_meta"]
    assert rows[-1]["tag_accuracy"] > meta["baselines"]["val"]["baseline"] + 0.3
    assert np.isfinite(summary["final_val_tag_loss"]["32"])
