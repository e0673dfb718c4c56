"""archlab.data.tasks: BPE alignment of identifiers, deterministic splits by document, the task registry."""

from __future__ import annotations

import numpy as np
import pytest

from archlab.data.corpus import Corpus, Document
from archlab.data.splice import SPLITS, read_split_documents
from archlab.data.tasks import TASKS, task_data
from archlab.data.tasks.documents import parse_documents, window_starts
from archlab.data.tasks.roles import ROLES, identifiers
from archlab.data.tokenizer import build_tokenizer


def module_text(k: int) -> str:
    """A small module of its own: names carry k, so that no two documents share a line."""
    return (f"import os as os{k}\n\n"
            f"def helper_{k}(value_{k}, scale=2):\n"
            f"    total_{k} = value_{k} * scale\n"
            f"    return os{k}.path.join(str(total_{k}), '_{k}')\n\n"
            f"class Thing{k}:\n"
            f"    def run(self, n):\n"
            f"        out = [helper_{k}(i) for i in range(n)]\n"
            f"        self.last_{k} = out\n"
            f"        return len(out) + unknown_{k}\n")


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    docs = [Document(f"m{k:02d}.py", len(module_text(k)), lambda k=k: module_text(k)) for k in range(40)]
    return Corpus("text", "40 small modules", docs, [])


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer("bpe", [module_text(k) for k in range(40)], 340)


def test_identifiers_sit_on_the_bpe_tokens_that_hold_them(tokenizer):
    text = module_text(3)
    (doc,), skipped = parse_documents([text], tokenizer)
    enc = tokenizer.backend.encode(text, add_special_tokens=False)
    idents = identifiers(text)
    assert skipped == 0 and len(doc.first) == len(idents) and (doc.ids == enc.ids).all()
    for i, first, last, role in zip(idents, doc.first, doc.last, doc.role):
        (s0, e0), (s1, e1) = enc.offsets[first], enc.offsets[last]
        assert s0 <= i.start < e0 and s1 < i.end <= e1  # first and last characters inside those tokens
        assert tokenizer.decode(doc.ids[first:last + 1]).strip(" (._").endswith(i.name.lstrip("_"))
        assert ROLES[role] == i.role


def test_a_file_that_is_not_python_is_skipped(tokenizer):
    docs, skipped = parse_documents(["def ok(): pass\n", "def (:\n"], tokenizer)
    assert len(docs) == 1 and skipped == 1


def test_windows_overlap_by_the_stride():
    assert window_starts(10, 4).tolist() == [0, 1, 2, 3, 4, 5, 6]
    assert window_starts(20, 8).tolist() == [0, 2, 4, 6, 8, 10, 12]
    assert window_starts(3, 8).tolist() == []


@pytest.mark.parametrize("name", ["tag", "span_qa", "bound"])
def test_splits_are_deterministic_and_disjoint_by_document(corpus, tokenizer, name):
    texts = read_split_documents(corpus, 0, 0.2, None)
    names = {s: {t.split("\n")[0] for t in texts[s]} for s in SPLITS}  # each module's first line is its own
    assert not (names["train"] & names["val"]) and not (names["train"] & names["test"]) \
        and not (names["val"] & names["test"])
    a = task_data(TASKS.get(name), texts, tokenizer, 32, 0)
    b = task_data(TASKS.get(name), read_split_documents(corpus, 0, 0.2, None), tokenizer, 32, 0)
    for s in SPLITS:
        assert len(a.examples[s]) > 0
        assert (a.examples[s].x == b.examples[s].x).all() and (a.examples[s].y == b.examples[s].y).all()
    train_rows = {r.tobytes() for r in a.examples["train"].x}
    assert not any(r.tobytes() in train_rows for r in a.examples["test"].x)
    other = task_data(TASKS.get(name), read_split_documents(corpus, 1, 0.2, None), tokenizer, 32, 1)
    assert other.meta["examples"] != a.meta["examples"] or \
        not np.array_equal(other.examples["test"].x, a.examples["test"].x)


def test_the_registry_names_its_tasks_and_refuses_others():
    assert TASKS.names() == ["bound", "span_qa", "tag"]
    with pytest.raises(KeyError, match="valid: bound, span_qa, tag"):
        TASKS.get("ner")


@pytest.mark.parametrize("name", ["tag", "span_qa", "bound"])
def test_cached_items_equal_freshly_made_ones(corpus, tokenizer, name, tmp_path, monkeypatch):
    """The second call reads the cache (the parser is not called) and returns the same items and meta; another
    seed is another entry."""
    from archlab.data import tasks as tasks_mod

    texts = read_split_documents(corpus, 0, 0.2, None)
    fresh = task_data(TASKS.get(name), texts, tokenizer, 32, 0, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("*.npz"))) == 1

    def no_parse(*a, **k):
        raise AssertionError("parsed again: the cache was not read")

    monkeypatch.setattr(tasks_mod, "parse_documents", no_parse)
    cached = task_data(TASKS.get(name), texts, tokenizer, 32, 0, cache_dir=tmp_path)
    for s in SPLITS:
        for f in ("x", "y", "doc", "chance", "guess"):
            a, b = getattr(fresh.examples[s], f), getattr(cached.examples[s], f)
            assert (a is None and b is None) or (np.array_equal(a, b) and a.dtype == b.dtype)
    assert np.array_equal(fresh.train, cached.train) and fresh.meta == cached.meta
    with pytest.raises(AssertionError, match="parsed again"):
        task_data(TASKS.get(name), texts, tokenizer, 32, 1, cache_dir=tmp_path)
