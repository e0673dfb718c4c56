"""A corpus as a list of documents, and its deterministic train/validation split by document.

A source (see ``archlab.data.sources``) lists documents without reading them; this module reads
them, splits them by document name (never by filesystem order) and applies ``data.max_bytes``.

Split rule, the same for every source:

1. Each document gets a rank ``sha256(f"{seed}:{name}")``: a pseudo-random order that depends only
   on the names and the seed, so every machine splits the same files the same way.
2. The first ``max(1, round(n * val_fraction))`` documents in rank order are validation, the rest
   training. With a single document, that document is cut at a line boundary instead: the first
   ``1 - val_fraction`` of its bytes train, the rest validate.
3. ``max_bytes`` caps the bytes read: validation gets ``val_fraction * max_bytes``, training the rest;
   each split takes whole documents in rank order and cuts the last one at a line boundary. Rank
   order (not alphabetical order) makes a capped corpus a spread sample of the whole one, rather than
   every module whose name starts with "a".
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from archlab.errors import RecipeError


class DataError(RecipeError):
    """The data of a recipe cannot be used (missing path, empty corpus, not text, too small...).

    A :class:`RecipeError` (hence a ``ValueError``): command lines print it as one line and exit 2.
    """


@dataclass(frozen=True)
class Document:
    """One document of a corpus: a file, or a row of a dataset.

    ``name`` keys the split (a path relative to the corpus root, or a row id); ``size`` is its
    UTF-8 size in bytes; ``read()`` returns its text or raises :class:`DataError` naming it.
    """

    name: str
    size: int
    read: Callable[[], str] = field(repr=False, compare=False)


@dataclass
class Corpus:
    """What a source found: documents, plus what identifies their content for the cache key."""

    family: str  # stdlib | text | hf: the prefix of the cache folder
    description: str  # one line for logs and meta.json
    documents: list[Document]
    fingerprint: Any  # JSON-serialisable; changes whenever a document's content may have changed


@dataclass
class Split:
    """The texts of the two splits, in rank order, and how many documents / bytes each holds."""

    train: list[str]
    val: list[str]
    n_docs: dict[str, int]
    n_bytes: dict[str, int]


def read_text_file(path: Path) -> str:
    """Read a file as strict UTF-8 text; raise :class:`DataError` naming it if it is not text."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise DataError(f"cannot read {path}: {e.strerror or e}") from None
    if b"\x00" in raw:
        raise DataError(f"{path} is not a text file (it contains NUL bytes): "
                        "remove it from data.paths or narrow the glob (e.g. 'folder/**/*.txt')")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path} is not UTF-8 text (invalid byte at offset {e.start}): "
                        "convert it to UTF-8 or remove it from data.paths") from None


def document_rank(name: str, seed: int) -> bytes:
    """Sort key of a document in the split: a hash of (seed, name), independent of the filesystem."""
    return hashlib.sha256(f"{seed}:{name}".encode("utf-8")).digest()


def _boundary(raw: bytes, limit: int) -> int:
    """A cut position <= ``limit`` in UTF-8 ``raw``: after the last newline, else a char boundary."""
    if limit >= len(raw):
        return len(raw)
    newline = raw.rfind(b"\n", 0, limit)
    if newline >= 0:
        return newline + 1
    while limit > 0 and (raw[limit] & 0xC0) == 0x80:  # never cut inside a multi-byte character
        limit -= 1
    return limit


def _take(docs: Sequence[Document], budget: Optional[int]) -> tuple[list[str], int]:
    """Read ``docs`` in order until ``budget`` bytes (None = all); cut the last one at a line."""
    texts: list[str] = []
    used = 0
    for doc in docs:
        if budget is not None and used >= budget:
            break
        text = doc.read()
        raw = text.encode("utf-8")
        cut = budget is not None and used + len(raw) > budget
        if cut:
            raw = raw[:_boundary(raw, budget - used)]
            text = raw.decode("utf-8")
        if raw:
            texts.append(text)
            used += len(raw)
        if cut and texts:
            break
    return texts, used


def _split_one(doc: Document, val_fraction: float, max_bytes: Optional[int]) -> Split:
    """A single document: cut it into a train head and a validation tail at a line boundary."""
    raw = doc.read().encode("utf-8")
    if max_bytes is not None:
        raw = raw[:_boundary(raw, max_bytes)]
    cut = _boundary(raw, int(len(raw) * (1.0 - val_fraction)))
    head, tail = raw[:cut], raw[cut:]
    if not head or not tail:
        raise DataError(f"the corpus is a single document ({doc.name}, {len(raw)} bytes) too short to "
                        f"split into train and validation: add data")
    return Split([head.decode("utf-8")], [tail.decode("utf-8")],
                 {"train": 1, "val": 1}, {"train": len(head), "val": len(tail)})


def split_corpus(corpus: Corpus, val_fraction: float, seed: int, max_bytes: Optional[int] = None) -> Split:
    """Split ``corpus`` into train and validation texts by document (rule in the module docstring).

    Raises :class:`DataError` when the corpus is empty or a split would hold no text.
    """
    docs = [d for d in corpus.documents if d.size > 0]
    if not docs:
        raise DataError(f"empty corpus: {corpus.description} holds no text; point data.paths at text files")
    if len(docs) == 1:
        return _split_one(docs[0], val_fraction, max_bytes)
    ranked = sorted(docs, key=lambda d: document_rank(d.name, seed))
    n_val = max(1, round(len(ranked) * val_fraction))
    val_budget = train_budget = None
    if max_bytes is not None:
        val_budget = max(1, int(max_bytes * val_fraction))
        train_budget = max(1, max_bytes - val_budget)
    val, val_bytes = _take(ranked[:n_val], val_budget)
    train, train_bytes = _take(ranked[n_val:], train_budget)
    for name, texts in (("train", train), ("validation", val)):
        if not texts:
            raise DataError(f"the {name} split of {corpus.description} holds no text: add data "
                            "(or raise data.max_bytes)")
    return Split(train, val, {"train": len(train), "val": len(val)},
                 {"train": train_bytes, "val": val_bytes})
