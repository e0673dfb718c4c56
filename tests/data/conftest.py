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


def write_tokenizer_json(path: Path, vocab_size: int = 300, eos: str = "<|endoftext|>") -> Path:
    """A GPT-2-like tokenizer file made with the ``tokenizers`` library (no download): byte-level BPE
    trained on a few stdlib modules to ``vocab_size - 1`` entries, then ``eos`` added as the last id
    (GPT-2's <|endoftext|> is its last id, 50256)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    texts = [(stdlib_root() / name).read_text() for name in ("textwrap.py", "string.py", "shlex.py")]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - 1, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    tok.add_special_tokens([eos])
    assert tok.get_vocab_size() == vocab_size and tok.token_to_id(eos) == vocab_size - 1
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


@pytest.fixture(scope="session")
def tokenizer_json(tmp_path_factory) -> Path:
    """A 300-id GPT-2-like tokenizer.json (<|endoftext|> = 299), never modified."""
    return write_tokenizer_json(tmp_path_factory.mktemp("tokenizer") / "tokenizer.json")
