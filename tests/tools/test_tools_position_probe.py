"""``tools.position_probe``: the instrumented step is the trainer's step (same init, data order,
AdamW groups, schedule, clipping and validation loss), so its table statistics describe the runs
``python -m archlab.train`` makes; the nanoGPT peer starts from the same weights."""

import json

import pytest

import archlab
from archlab.train import Trainer
from tools import position_probe

TINY = ["model.vocab_size=384", "model.d_model=32", "model.n_layers=2", "model.n_heads=2",
        "model.max_seq_len=64", "train.seq_len=32", "train.micro_batch_size=4", "train.max_steps=6",
        "train.warmup_steps=2", "train.log_every=1", "train.eval_every=100", "train.eval_batches=2",
        "train.ckpt_every=100", "train.eval_context_multipliers=[1]", "data.max_bytes=120000"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("archlab-cache")


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_probe_repeats_the_trainer_step_for_step(tmp_path, cache, root):
    overrides = [*TINY, "model.position.type=learned", f"data.cache_dir={cache}"]
    recipe = root / "recipes/llama/tiny.yaml"
    trainer = Trainer(archlab.load_recipe(recipe, [*overrides, f"train.out_dir={tmp_path}", "train.run_name=r"]))
    trainer.run()
    trainer.close()
    metrics = _rows(tmp_path / "r" / "metrics.jsonl")
    train = [r["loss"] for r in metrics if r["kind"] == "train"]
    val = [r["loss"] for r in metrics if r["kind"] == "val"][-1]

    out = tmp_path / "probe.jsonl"
    position_probe.main([str(recipe), *overrides, "--out", str(out)])
    rows = _rows(out)
    assert rows[0]["kind"] == "init" and rows[0]["table_init_cos"] == pytest.approx(1.0)
    steps = [r for r in rows if "step" in r]
    assert [r["loss"] for r in steps] == pytest.approx(train, rel=1e-5)
    assert rows[-1]["kind"] == "val" and rows[-1]["loss"] == pytest.approx(val, rel=1e-5)
    assert all(r["table_update_ratio"] > 0 and r["table_grad_norm"] > 0 for r in steps)


def test_frozen_zero_table_stays_zero_and_nanogpt_peer_starts_equal(tmp_path, cache, root):
    overrides = [*TINY, f"data.cache_dir={cache}", "train.max_steps=2"]
    out = tmp_path / "frozen.jsonl"
    position_probe.main([str(root / "recipes/llama/tiny.yaml"), *overrides, "model.position.type=learned",
                         "--table-init", "zero", "--table-lr-scale", "0", "--out", str(out)])
    assert all(r["table_row_norm"] == 0.0 for r in _rows(out) if "step" in r)

    dense = str(root / "recipes/dense/tiny.yaml")
    ours, peer = tmp_path / "ours.jsonl", tmp_path / "peer.jsonl"
    position_probe.main([dense, *overrides, "--out", str(ours), "--stop-at", "1"])
    position_probe.main([dense, *overrides, "--out", str(peer), "--stop-at", "1",
                         "--peer", "nanogpt", "--optim", "nanogpt"])
    first = [[r for r in _rows(p) if "step" in r][0] for p in (ours, peer)]
    assert first[0]["loss"] == pytest.approx(first[1]["loss"], rel=1e-5)
    assert first[0]["table_grad_norm"] == pytest.approx(first[1]["table_grad_norm"], rel=1e-4)
