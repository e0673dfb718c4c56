"""A labelled task made from a corpus, for fine-tuning: was this window spliced right after its middle id?

Shape legend: S window length (``train.seq_len``), p = S // 2 the splice position, N examples.

Each example is a window of S token ids from one split's documents and a label:

- 0 (intact): the S ids of one document from position t - p on (x_t at column p);
- 1 (spliced): the same p + 1 ids up to and including x_t, then the S - p - 1 ids that follow another
  occurrence u != t of the same id (x_u = x_t) anywhere in the same split.

t is uniform over the split's *centres*: positions with p ids before them and S - p - 1 after them in their
document, whose id occurs at least twice among the centres; u is uniform over the other centres holding x_t,
so u is itself a uniform centre. Hence the left part (columns 0..p) and the right part (columns p..S-1) are
each distributed alike under both labels: neither side alone says anything; only whether the two sides
belong together does (next-sentence prediction's question, BERT sec. 3.1, asked at one position). A causal
model's states up to column p cannot see the evidence; a bidirectional model's state at p can.

Splits are by document: each document ranked by sha256 of (seed, name) (``archlab.data.corpus``); the first
``val_fraction`` of them validate, the next ``val_fraction`` test, the rest train, so no document (and no
splice source) is in two splits. Labels are balanced exactly (N // 2 spliced, shuffled): chance is 1/2, and
the majority baseline (always answer the training split's most frequent label) is computed per split.
Everything is drawn from ``numpy.random.default_rng([seed, split])``: the same seed gives the same task.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from archlab.data.corpus import Corpus, DataError, document_rank

SPLITS = ("train", "val", "test")
N_CLASSES = 2  # intact, spliced
LABELS = ("intact", "spliced")


def splice_position(seq_len: int) -> int:
    """p: the last column of the left part."""
    return seq_len // 2


def document_splits(names: Sequence[str], seed: int, val_fraction: float) -> dict[str, list[int]]:
    """Indices of ``names`` per split: ranked by (seed, name); val first, then test, each
    ``max(1, round(n * val_fraction))`` documents, the rest train. Raises DataError when a split is empty."""
    ranked = sorted(range(len(names)), key=lambda i: document_rank(names[i], seed))
    k = max(1, round(len(names) * val_fraction))
    out = {"val": ranked[:k], "test": ranked[k:2 * k], "train": ranked[2 * k:]}
    if not out["train"] or len(ranked) < 3:
        raise DataError(f"the labelled task needs documents in train, val and test: the corpus has {len(names)}, "
                        f"{k} each for val and test (data.val_fraction={val_fraction}); add documents")
    return out


@dataclass
class Examples:
    """One split's examples: ``x`` (N, S) int64 ids, ``y`` (N,) int64 labels, and what the draw found."""

    x: np.ndarray
    y: np.ndarray
    centres: int  # positions eligible as t
    same_as_intact: int  # spliced examples whose right part equals the intact continuation (label noise)


def make_examples(docs: Sequence[np.ndarray], seq_len: int, n: int, seed: Sequence[int]) -> Examples:
    """``n`` examples (module docstring) from the documents' id arrays ``docs`` of one split, drawn from
    ``default_rng(seed)``."""
    S, p = seq_len, splice_position(seq_len)
    docs = [np.asarray(d, dtype=np.int64) for d in docs]
    flat = np.concatenate(docs) if docs else np.zeros(0, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs])])
    cs = np.concatenate([off + np.arange(p, len(d) - S + p + 1) for off, d in zip(offsets, docs) if len(d) >= S]
                        or [np.zeros(0, dtype=np.int64)])
    tok = flat[cs]
    order = np.argsort(tok, kind="stable")  # centres grouped by their id
    _, start, count = np.unique(tok[order], return_index=True, return_counts=True)
    group = np.empty(len(cs), dtype=np.int64)
    group[order] = np.repeat(np.arange(len(start)), count)  # each centre's group
    rank = np.empty(len(cs), dtype=np.int64)
    rank[order] = np.arange(len(cs)) - np.repeat(start, count)  # its place within the group
    eligible = np.flatnonzero(count[group] >= 2)
    if len(eligible) == 0:
        raise DataError(f"no window of train.seq_len={S} ids with a repeated middle id in this split: the documents "
                        "are too short or too few; lower train.seq_len or add data")
    rng = np.random.default_rng(seed)
    y = rng.permutation(np.repeat(np.arange(N_CLASSES), [n - n // 2, n // 2]))
    i = eligible[rng.integers(0, len(eligible), size=n)]  # t: centres, uniform among the eligible
    r = rng.integers(0, count[group[i]] - 1)  # another member of t's group: skip t's own place
    r = r + (r >= rank[i])
    j = np.where(y == 1, order[start[group[i]] + r], i)  # u (= t when intact)
    t, u = cs[i], cs[j]
    col = np.arange(S)
    x = flat[np.where(col <= p, t[:, None], u[:, None]) + col - p]  # (N, S)
    intact_right = flat[t[:, None] + col[p + 1:] - p]
    same = int(((y == 1) & (x[:, p + 1:] == intact_right).all(axis=1)).sum())
    return Examples(x, y.astype(np.int64), int(len(cs)), same)


def baselines(train_y: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """Chance (1 / classes) and the majority baseline: the accuracy on ``y`` of always answering the most
    frequent label of ``train_y``."""
    majority = int(np.bincount(train_y, minlength=N_CLASSES).argmax())
    return {"chance": 1.0 / N_CLASSES, "majority": float((y == majority).mean()), "majority_label": majority}


@dataclass
class TaskData:
    """The labelled task, in the place of the trainer's token data (``archlab.data.PreparedData``)."""

    tokenizer: Any
    train: np.ndarray  # the training documents' ids, concatenated (the run's unigram entropy)
    examples: dict[str, Examples]
    cache_path: Optional[Path]  # the tokenizer's file, when it is a pre-trained run's
    meta: dict[str, Any]


def read_split_documents(corpus: Corpus, seed: int, val_fraction: float,
                         max_bytes: Optional[int]) -> dict[str, list[str]]:
    """Each split's texts, whole documents in rank order; ``max_bytes`` caps the bytes read, val and test
    ``val_fraction`` of it each."""
    docs = [d for d in corpus.documents if d.size > 0]
    index = document_splits([d.name for d in docs], seed, val_fraction)
    budgets = {s: None for s in SPLITS}
    if max_bytes is not None:
        budgets = {"val": max(1, int(max_bytes * val_fraction)), "test": max(1, int(max_bytes * val_fraction))}
        budgets["train"] = max(1, max_bytes - 2 * budgets["val"])
    out: dict[str, list[str]] = {}
    for split in SPLITS:
        texts, used = [], 0
        for k in index[split]:
            if budgets[split] is not None and used >= budgets[split]:
                break
            texts.append(docs[k].read())
            used += docs[k].size
        out[split] = texts
    return out


def splice_task(corpus: Corpus, tokenizer, seq_len: int, n_train: int, n_eval: int, seed: int,
                val_fraction: float, max_bytes: Optional[int], texts: Optional[dict[str, list[str]]] = None,
                tokenizer_path: Optional[Path] = None) -> TaskData:
    """The splice task of ``corpus`` tokenised by ``tokenizer``: ``n_train`` training examples, ``n_eval``
    each for val and test. ``texts``: the splits' texts when already read."""
    texts = texts or read_split_documents(corpus, seed, val_fraction, max_bytes)
    ids = {s: [np.asarray(d, dtype=np.int64) for d in tokenizer.encode_batch(texts[s])] for s in SPLITS}
    sizes = {"train": n_train, "val": n_eval, "test": n_eval}
    examples = {s: make_examples(ids[s], seq_len, sizes[s], [seed, k]) for k, s in enumerate(SPLITS)}
    train_y = examples["train"].y
    meta = {
        "task": "splice: is the window's right part (after column p) the continuation of its left part?",
        "corpus": corpus.description, "seq_len": seq_len, "splice_position": splice_position(seq_len),
        "labels": list(LABELS), "seed": seed,
        "documents": {s: len(texts[s]) for s in SPLITS},
        "tokens": {s: int(sum(len(d) for d in ids[s])) for s in SPLITS},
        "examples": {s: len(e.y) for s, e in examples.items()},
        "centres": {s: e.centres for s, e in examples.items()},
        "spliced_equal_to_intact": {s: e.same_as_intact for s, e in examples.items()},
        "baselines": {s: baselines(train_y, e.y) for s, e in examples.items()},
        "tokenizer_sha256": hashlib.sha256(Path(tokenizer_path).read_bytes()).hexdigest() if tokenizer_path else None,
    }
    train_ids = np.concatenate(ids["train"]) if ids["train"] else np.zeros(0, dtype=np.int64)
    return TaskData(tokenizer, train_ids, examples, tokenizer_path, meta)
