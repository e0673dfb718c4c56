"""Fixtures for the data tests: small real-text corpora and recipes with a private cache."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from archlab.config import load_recipe
from archlab.data.sources import stdlib_root

# a dozen standard-library modules: ~200 kB of real text, enough for a BPE of a few hundred ids
CORPUS_MODULES = ["abc.py", "bisect.py", "colorsys.py", "copy.py", "fnmatch.py", "heapq.py", "keyword.py",
                  "numbers.py", "queue.py", "shlex.py", "string.py", "textwrap.py", "json/decoder.py",
                  "json/encoder.py", "email/quoprimime.py", "sched.py"]


@pytest.fixture(scope="session")
def text_corpus_dir(tmp_path_factory) -> Path:
    """A folder of .txt files (copies of stdlib modules), one nested level, never modified."""
    root = tmp_path_factory.mktemp("corpus")
    for name in CORPUS_MODULES:
        dst = root / name.replace(".py", ".txt")
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(stdlib_root() / name, dst)
    return root


@pytest.fixture
def text_recipe(tmp_path, text_corpus_dir):
    """Make a recipe over a copy of the text corpus with a private cache: ``text_recipe(**overrides)``."""
    corpus = tmp_path / "corpus"
    shutil.copytree(text_corpus_dir, corpus)

    def make(*overrides: str):
        return load_recipe(None, [
            "data.source=text", f"data.paths=[{corpus}]", f"data.cache_dir={tmp_path / 'cache'}",
            "model.vocab_size=320", "train.seq_len=32", *overrides,
        ])

    make.corpus = corpus
    make.cache = tmp_path / "cache"
    return make
