"""Fine-tuning (train.objective=classify): a pre-trained checkpoint's weights loaded by name, a mismatch refused
naming the tensor, the accuracy rising above chance on an easy task, poolings refused by name."""

from __future__ import annotations

import random

import pytest
import torch
from safetensors.torch import load_file

import archlab
from archlab.config.validate import RecipeError
from archlab.objectives import objective_for
from archlab.train import train
from archlab.train.checkpoint import WEIGHTS, resolve_checkpoint
from archlab.train.run_folder import read_jsonl

TINY = ["model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.vocab_size=260", "data.source=text",
        "data.tokenizer=byte", "data.val_fraction=0.15", "train.seq_len=16", "train.micro_batch_size=32",
        "train.eval_batches=16", "train.tensorboard=false", "train.eval_context_multipliers=[1]",
        "train.warmup_steps=5"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """24 documents, each spaces and one letter ('a' in half of them, 'b' in the others): a window spliced at
    a space from a document of the other letter holds both letters, an easy tell."""
    root = tmp_path_factory.mktemp("letters")
    rng = random.Random(0)
    for i in range(24):
        (root / f"doc{i:02d}.txt").write_text("".join("ab"[i % 2] if rng.random() < 0.3 else " " for _ in range(600)))
    return root


def recipe(corpus, tmp, *more):
    return archlab.load_recipe("recipes/dense/tiny.yaml",
                               [*TINY, f"data.paths=[{corpus}]", f"data.cache_dir={tmp}/cache", f"train.out_dir={tmp}",
                                *more])


@pytest.fixture(scope="module")
def pretrained(corpus, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("runs")
    train(recipe(corpus, tmp, "train.max_steps=20", "train.run_name=pre"))
    return tmp, tmp / "pre"


def classify(corpus, tmp, run, *more):
    return recipe(corpus, tmp, "train.objective=classify", f"train.init_from={run if run is not None else 'null'}",
                  "train.objective.pooling=last",
                  "train.objective.train_examples=2048", "train.objective.eval_examples=512", *more)


def test_the_trunk_loads_the_checkpoint_by_name(corpus, pretrained):
    tmp, run = pretrained
    cfg = classify(corpus, tmp, run)
    torch.manual_seed(123)
    model = objective_for(cfg).build_model(cfg)
    saved = load_file(str(resolve_checkpoint(run) / WEIGHTS))
    own = dict(model.trunk.named_parameters())
    assert set(saved) <= set(model.trunk.state_dict()) and "embed.weight" in saved
    for name, t in saved.items():
        assert torch.equal(model.trunk.state_dict()[name], t), name
    assert own["blocks.0.attn.wqkv.weight"].requires_grad
    fresh = objective_for(classify(corpus, tmp, None)).build_model(classify(corpus, tmp, None))
    assert not torch.equal(fresh.trunk.embed.weight, model.trunk.embed.weight)  # null: a fresh init


def test_a_checkpoint_of_another_model_is_refused_naming_the_tensor(corpus, pretrained):
    tmp, run = pretrained
    cfg = classify(corpus, tmp, run, "model.d_model=48")
    with pytest.raises(RecipeError, match=r"train.init_from=.*shapes differ: embed.weight \(260, 32\) in the "
                                          r"checkpoint, \(260, 48\) here"):
        objective_for(cfg).build_model(cfg)
    cfg = classify(corpus, tmp, run, "model.n_layers=3")
    with pytest.raises(RecipeError, match=r"missing from the checkpoint: blocks.2.attn.wo.bias, .*\(\+6 more\)"):
        objective_for(cfg).build_model(cfg)
    with pytest.raises(RecipeError, match="train.init_from=.*not a pre-trained run or checkpoint"):
        cfg = classify(corpus, tmp, tmp / "nowhere")
        objective_for(cfg).prepare_data(cfg)


def test_fine_tuning_rises_above_chance(corpus, pretrained):
    tmp, run = pretrained
    cfg = classify(corpus, tmp, run, "train.max_steps=200", "train.eval_every=100", "train.run_name=ft")
    summary = train(cfg)
    rows = [r for r in read_jsonl(tmp / "ft" / "metrics.jsonl") if r.get("kind") == "val"]
    assert all(r["metric"] == "classify" and "loss" not in r for r in rows)
    final = rows[-1]
    assert final["final"] and final["eval_examples"] == 512
    assert final["classify_accuracy"] > 0.56  # chance and majority 0.5; 0.56 is 2.7 standard errors above
    assert final["classify_loss"] < 0.69
    assert summary["final_val_classify_loss"]["16"] == final["classify_loss"]
    import json

    meta = json.loads((tmp / "ft" / "env.json").read_text())["data_meta"]
    assert meta["baselines"]["val"]["majority"] == 0.5 and meta["init_from"].startswith(str(run))


@pytest.mark.parametrize("recipe_path,pooling,rule", [
    ("recipes/dense/tiny.yaml", "first", "model.type=decoder pools last or mean: position 0 of a causal decoder"),
    ("recipes/bert/tiny.yaml", "cls", "must be one of: first, last, mean"),
])
def test_a_pooling_without_sense_is_refused_by_name(recipe_path, pooling, rule):
    with pytest.raises(RecipeError, match=f"train.objective.pooling='{pooling}': {rule}"):
        archlab.load_recipe(recipe_path, ["train.objective=classify", f"train.objective.pooling={pooling}"])


def test_each_model_type_pools_its_convention():
    conventions = (("gpt", "decoder", "last"), ("bert", "encoder", "first"), ("t5", "encoder_decoder", "mean"))
    for name, kind, pooling in conventions:
        cfg = archlab.load_recipe(f"recipes/finetune/{name}-tiny.yaml", ["model.n_layers=1"])
        model = objective_for(cfg).build_model(cfg)
        assert cfg.model.type == kind and model.head.pooling == pooling
        x = torch.randint(0, 200, (2, cfg.train.seq_len))
        assert model(x).logits.shape == (2, 2)


def test_init_from_is_refused_by_an_objective_that_does_not_read_it():
    with pytest.raises(RecipeError, match="train.init_from=.*only used by train.objective .*classify.*is mlm"):
        archlab.load_recipe("recipes/bert/tiny.yaml", ["train.init_from=runs/x"])
