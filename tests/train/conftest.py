"""Fixtures for trainer tests: a tiny recipe and a tokenizer cache shared by the whole session."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import archlab

TINY = [
    "model.vocab_size=384", "model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.max_seq_len=128",
    "train.seq_len=32", "train.micro_batch_size=4", "train.max_steps=8", "train.warmup_steps=2",
    "train.log_every=1", "train.eval_every=4", "train.eval_batches=2", "train.ckpt_every=4", "train.keep_last=2",
    "train.eval_context_multipliers=[1,2]", "data.max_bytes=120000",
]


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("archlab-cache")


@pytest.fixture
def tiny_cfg(tmp_path, data_cache, root):
    """make(recipe="llama/tiny", *overrides) -> a tiny recipe writing under tmp_path/runs."""

    def make(*overrides: str, recipe: str = "llama/tiny"):
        return archlab.load_recipe(root / "recipes" / f"{recipe}.yaml", [
            *TINY, f"data.cache_dir={data_cache}", f"train.out_dir={tmp_path / 'runs'}", "train.run_name=run",
            *overrides])

    return make


def read_rows(run_dir: Path, kind: str = "train") -> list[dict]:
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("kind") == kind]


@pytest.fixture(scope="session")
def tiny_overrides() -> list[str]:
    return list(TINY)


@pytest.fixture
def rows():
    """rows(run_dir, kind="train") -> the metrics.jsonl rows of that kind."""
    return read_rows
