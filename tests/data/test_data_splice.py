"""The splice task: splits by document, labels, baselines, and neither side alone carrying the label."""

from __future__ import annotations

import numpy as np
import pytest

from archlab.data.corpus import Corpus, DataError, Document
from archlab.data.splice import baselines, document_splits, make_examples, splice_task
from archlab.data.tokenizer import build_tokenizer

S, P = 7, 3  # window, splice position


def hub_documents(k: int) -> list[np.ndarray]:
    """Document d: three ids of its own, the shared id 0, three more of its own: the only centre is the 0."""
    return [np.array([10 * d + 1, 10 * d + 2, 10 * d + 3, 0, 10 * d + 4, 10 * d + 5, 10 * d + 6])
            for d in range(1, k + 1)]


def test_labels_on_constructed_documents():
    e = make_examples(hub_documents(4), S, 400, [0, 0])
    left_doc, right_doc = e.x[:, 0] // 10, e.x[:, -1] // 10
    assert (e.x[:, P] == 0).all()
    assert ((left_doc == right_doc) == (e.y == 0)).all()  # intact <=> one document on both sides
    assert e.y.sum() == 200 and e.centres == 4 and e.same_as_intact == 0
    assert (e.x[e.y == 0] == np.stack(hub_documents(4))[left_doc[e.y == 0] - 1]).all()


def test_neither_side_alone_tells_the_label():
    """Left part (columns 0..p) and right part (p..S-1) are each distributed alike under both labels: per
    document, each label's share of each side is 1/4 within sampling error, while the pair decides it."""
    k, n = 4, 20000
    e = make_examples(hub_documents(k), S, n, [1, 0])
    for side in (e.x[:, 0] // 10, e.x[:, -1] // 10):
        for label in (0, 1):
            share = np.bincount(side[e.y == label], minlength=k + 1)[1:] / (n / 2)
            assert np.abs(share - 1 / k).max() < 4 * np.sqrt(0.25 * 0.75 / (n / 2))


def test_the_same_seed_gives_the_same_task():
    docs = [np.random.default_rng(i).integers(0, 5, size=50) for i in range(6)]
    a, b, c = (make_examples(docs, 9, 64, s) for s in ([3, 1], [3, 1], [4, 1]))
    assert np.array_equal(a.x, b.x) and np.array_equal(a.y, b.y)
    assert not np.array_equal(a.x, c.x)


def test_document_splits_are_disjoint_and_cover_the_corpus():
    names = [f"pkg/mod{i}.py" for i in range(100)]
    splits = document_splits(names, 0, 0.1)
    sets = [set(v) for v in splits.values()]
    assert sum(map(len, sets)) == 100 and set.union(*sets) == set(range(100))
    assert len(splits["val"]) == len(splits["test"]) == 10
    assert document_splits(names, 0, 0.1) == splits and document_splits(names, 1, 0.1) != splits
    with pytest.raises(DataError, match="train, val and test"):
        document_splits(["a", "b"], 0, 0.4)


def test_no_document_in_two_splits_of_the_task():
    """Each document's text is one letter: every window of a split (both sides, the splice source too) holds
    only the letters of that split's documents."""
    letters = "abcdefghijklmnopqrst"
    texts = {c: (c + " ") * 40 for c in letters}
    docs = [Document(c, len(t), lambda t=t: t) for c, t in texts.items()]
    corpus = Corpus("test", "letters", docs, None)
    tok = build_tokenizer("byte", list(texts.values()), 260)
    task = splice_task(corpus, tok, 12, 200, 100, 0, 0.15, None)
    index = document_splits(letters, 0, 0.15)
    seen = {}
    for split, e in task.examples.items():
        seen[split] = {chr(i) for i in np.unique(e.x)} - {" "}
        assert seen[split] <= {letters[k] for k in index[split]}
    assert not (seen["train"] & seen["val"]) and not (seen["train"] & seen["test"]) and not (seen["val"] & seen["test"])
    assert task.meta["documents"] == {s: len(index[s]) for s in index}
    assert task.meta["baselines"]["val"] == {"chance": 0.5, "majority": 0.5, "majority_label": 0}


def test_baselines():
    b = baselines(np.array([1, 1, 1, 0]), np.array([0, 1, 1, 1, 1]))
    assert b == {"chance": 0.5, "majority": 0.8, "majority_label": 1}
    assert baselines(np.array([0, 0, 1]), np.array([1, 1]))["majority"] == 0.0
