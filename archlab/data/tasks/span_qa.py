"""Extractive question answering (SQuAD's form): where is NAME defined? The answer is the span (first and last
token) of NAME's one binding (``def``/``class`` name, parameter, or assignment target: ``roles.BINDINGS``) in
the window.

Input, S ids: the question (NAME's own ids, then the end-of-text id as the separator, BERT's [SEP]) and the
next S - q tokens of one window of a document. An item is a name that the content reads (a load or call of the
name itself, not of an attribute) and binds exactly once; at most ``PER_WINDOW`` names per window, drawn at
random. Labels: (start, end) positions in the input, so a model scores every position. Accuracy: exact match
of both. Baseline: the span of the name's first occurrence in the content (any role); chance: one identifier
of the content picked uniformly.
"""

from __future__ import annotations

import numpy as np

from archlab.data.tasks.documents import Document, in_window, window_starts
from archlab.data.tasks.items import Items, stack
from archlab.data.tasks.roles import BINDINGS, READS, ROLES

PER_WINDOW = 2
MAX_QUESTION = 8  # question ids, the separator included: longer names are not asked
_BINDING = np.array([r in BINDINGS for r in ROLES])
_READ = np.array([r in READS for r in ROLES])


def _questions(doc: Document, w: int, seq_len: int, ask) -> list[tuple[int, int, int, int]]:
    """(q, binding identifier, first-occurrence identifier, identifiers in content) for each name askable in the
    window starting at token ``w``; ``ask(name)`` gives the question's ids."""
    out = []
    idx = in_window(doc, w, seq_len - 2)
    by_name: dict[str, list[int]] = {}
    for i in idx:
        by_name.setdefault(doc.name[i], []).append(int(i))
    for name, members in by_name.items():
        q = len(ask(name))
        if q > MAX_QUESTION:
            continue
        inside = [i for i in members if doc.last[i] < w + seq_len - q]
        binds = [i for i in inside if _BINDING[doc.role[i]]]
        reads = [i for i in inside if _READ[doc.role[i]] and not doc.attr[i]]
        if len(binds) == 1 and reads:
            n_content = int(((doc.first >= w) & (doc.last < w + seq_len - q)).sum())
            out.append((q, binds[0], inside[0], n_content))
    return out


def make_items(docs: list[Document], seq_len: int, tokenizer, rng: np.random.Generator) -> Items:
    cache: dict[str, list[int]] = {}

    def ask(name: str) -> list[int]:
        if name not in cache:
            cache[name] = tokenizer.encode(name) + [tokenizer.eos_id]
        return cache[name]

    xs, ys, ds, chance, first = [], [], [], [], []
    for k, doc in enumerate(docs):
        for w in window_starts(len(doc.ids), seq_len):
            qs = _questions(doc, int(w), seq_len, ask)
            for j in sorted(rng.permutation(len(qs))[:PER_WINDOW]):
                q, b, f, n = qs[j]
                name = doc.name[b]
                xs.append(np.concatenate([ask(name), doc.ids[w:w + seq_len - q]]))
                ys.append([q + doc.first[b] - w, q + doc.last[b] - w])
                first.append([q + doc.first[f] - w, q + doc.last[f] - w])
                ds.append(k)
                chance.append(1.0 / n)
    items = stack(xs, ys, ds, chance, seq_len, 2)
    items.guess = np.array(first, dtype=np.int64).reshape(-1, 2)
    return items


def baseline(train: Items, items: Items, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(correct (N,), counted (N,)): the span of the name's first occurrence in the content."""
    return (items.guess == items.y).all(1).astype(np.int64), np.ones(len(items), dtype=np.int64)

