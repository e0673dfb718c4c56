"""A split's Python documents as BPE token ids with their identifiers aligned to the tokens, and the windows the
tasks are made from.

Shape legend: T a document's tokens, S window length (``train.seq_len``), N windows.

An identifier belongs to the token holding its first character (``first``) and spans the tokens up to the one
holding its last (``last``): a byte-level BPE token may carry a leading space or punctuation (`` foo``, ``(_``).
Windows are S consecutive tokens of one document, every ``S // STRIDE_DIVISOR`` tokens (a task may ask for
more; overlapping, so a short split still yields many), the tail shorter than S dropped; an identifier is in a
window when its first and last tokens are.
"""

from __future__ import annotations

import tokenize
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from archlab.data.tasks.roles import ROLE_ID, identifiers

STRIDE_DIVISOR = 4  # windows start every S // 4 tokens


@dataclass
class Document:
    """One parsed document: ``ids`` (T,), and per identifier (in source order) its ``first`` and ``last`` token,
    ``role`` (index into ``ROLES``), ``name`` and ``attr``."""

    ids: np.ndarray
    first: np.ndarray
    last: np.ndarray
    role: np.ndarray
    name: list[str]
    attr: np.ndarray


def parse_documents(texts: Sequence[str], tokenizer) -> tuple[list[Document], int]:
    """The documents of ``texts`` that parse as Python, tokenised by ``tokenizer`` (an ``archlab`` Tokenizer),
    and how many did not parse (skipped)."""
    parsed, skipped = [], 0
    found = []
    for text in texts:
        try:
            found.append((text, identifiers(text)))
        except (SyntaxError, ValueError, tokenize.TokenError):
            skipped += 1
    encodings = tokenizer.backend.encode_batch([t for t, _ in found], add_special_tokens=False)
    for (text, idents), enc in zip(found, encodings):
        starts = np.array([s for s, _ in enc.offsets], dtype=np.int64)
        if len(starts) == 0:
            continue
        first = np.searchsorted(starts, [i.start for i in idents], side="right") - 1
        last = np.searchsorted(starts, [i.end - 1 for i in idents], side="right") - 1
        parsed.append(Document(np.asarray(enc.ids, dtype=np.int64), first.astype(np.int64), last.astype(np.int64),
                               np.array([ROLE_ID[i.role] for i in idents], dtype=np.int64),
                               [i.name for i in idents], np.array([i.attr for i in idents], dtype=bool)))
    return parsed, skipped


def window_starts(n_tokens: int, seq_len: int, divisor: int = STRIDE_DIVISOR) -> np.ndarray:
    """First token of each window of ``seq_len`` tokens in a document of ``n_tokens``, every seq_len // divisor."""
    return np.arange(0, n_tokens - seq_len + 1, max(1, seq_len // divisor), dtype=np.int64)


def in_window(doc: Document, start: int, length: int) -> np.ndarray:
    """Indices of the identifiers of ``doc`` whose tokens all lie in [start, start + length)."""
    return np.flatnonzero((doc.first >= start) & (doc.last < start + length))


def balance(y_N: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Sorted indices of an equal number of items of each label (the rest of the larger classes dropped)."""
    labels = np.unique(y_N)
    k = min(int((y_N == c).sum()) for c in labels)
    keep = np.concatenate([rng.choice(np.flatnonzero(y_N == c), size=k, replace=False) for c in labels])
    return np.sort(keep)
