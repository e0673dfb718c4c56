"""Token tagging (the named-entity analogue): each identifier's role (``archlab.data.tasks.roles.ROLES``) on the
first BPE token of the identifier; every other position is ignored (-100).

An item is a window of S tokens (``archlab.data.tasks.documents``) with at least one labelled token. Accuracy is
over labelled tokens. Baseline: the role each token id has most often in the training items (the most frequent
role overall for an id never labelled there); chance: 1 / 6 roles.
"""

from __future__ import annotations

import numpy as np

from archlab.data.tasks.documents import Document, window_starts
from archlab.data.tasks.items import IGNORE, Items, stack
from archlab.data.tasks.roles import ROLES

N_CLASSES = len(ROLES)


def token_labels(doc: Document) -> np.ndarray:
    """(T,) each token's role id where an identifier starts, else -100 (the earlier identifier wins a token)."""
    lab_T = np.full(len(doc.ids), IGNORE, dtype=np.int64)
    lab_T[doc.first[::-1]] = doc.role[::-1]
    return lab_T


def make_items(docs: list[Document], seq_len: int, tokenizer, rng: np.random.Generator) -> Items:
    xs, ys, ds = [], [], []
    for k, doc in enumerate(docs):
        lab_T = token_labels(doc)
        for w in window_starts(len(doc.ids), seq_len):
            y = lab_T[w:w + seq_len]
            if (y != IGNORE).any():
                xs.append(doc.ids[w:w + seq_len])
                ys.append(y)
                ds.append(k)
    return stack(xs, ys, ds, [1.0 / N_CLASSES] * len(xs), seq_len, seq_len)


def baseline(train: Items, items: Items, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(correct (N,), counted (N,)) per item of answering each token id's most frequent training role."""
    labelled = train.y != IGNORE
    counts_VC = np.zeros((vocab_size, N_CLASSES), dtype=np.int64)
    np.add.at(counts_VC, (train.x[labelled], train.y[labelled]), 1)
    guess_V = np.where(counts_VC.sum(1) > 0, counts_VC.argmax(1), counts_VC.sum(0).argmax())
    mask = items.y != IGNORE
    return ((guess_V[items.x] == items.y) & mask).sum(1), mask.sum(1)
