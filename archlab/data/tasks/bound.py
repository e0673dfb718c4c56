"""Sequence classification that needs the whole window: is every name the window reads bound within it?

A read is a load or call of a name (not of an attribute, not a builtin such as ``len``); a binding is a
``def``/``class`` name, a parameter or an assignment/import target (``roles.BINDINGS``), anywhere in the window
(before or after the read). Label 1 when every read name is bound in the window, 0 when one is not (a global, an
import or a name from outside the window). Windows (every S // 16 tokens) with no read are not items. Each split
is balanced by dropping items of the larger class at random: chance and the majority baseline are 1/2.
"""

from __future__ import annotations

import builtins

import numpy as np

from archlab.data.tasks.documents import Document, balance, in_window, window_starts
from archlab.data.tasks.items import Items, stack
from archlab.data.tasks.roles import BINDINGS, READS, ROLES

N_CLASSES = 2
LABELS = ("unbound name", "all bound")
BUILTINS = frozenset(dir(builtins))
STRIDE_DIVISOR = 16  # a window every S // 16 tokens: the rarer label needs many windows
_BINDING = np.array([r in BINDINGS for r in ROLES])
_READ = np.array([r in READS for r in ROLES])


def window_label(doc: Document, w: int, seq_len: int):
    """1 if every read name of the window is bound in it, 0 if not, None when it reads no name."""
    idx = in_window(doc, w, seq_len)
    reads = {doc.name[i] for i in idx if _READ[doc.role[i]] and not doc.attr[i]} - BUILTINS
    if not reads:
        return None
    return int(reads <= {doc.name[i] for i in idx if _BINDING[doc.role[i]]})


def make_items(docs: list[Document], seq_len: int, tokenizer, rng: np.random.Generator) -> Items:
    xs, ys, ds = [], [], []
    for k, doc in enumerate(docs):
        for w in window_starts(len(doc.ids), seq_len, STRIDE_DIVISOR):
            label = window_label(doc, int(w), seq_len)
            if label is not None:
                xs.append(doc.ids[w:w + seq_len])
                ys.append(label)
                ds.append(k)
    items = stack(xs, ys, ds, [1.0 / N_CLASSES] * len(xs), seq_len, 1)
    if len(items) == 0:
        return items
    keep = balance(items.y[:, 0], rng)
    return Items(items.x[keep], items.y[keep], items.doc[keep], items.chance[keep])


def baseline(train: Items, items: Items, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(correct (N,), counted (N,)) of always answering the training items' most frequent label."""
    majority = int(np.bincount(train.y[:, 0], minlength=N_CLASSES).argmax())
    return (items.y[:, 0] == majority).astype(np.int64), np.ones(len(items), dtype=np.int64)
