"""``data.source: tokens``: pre-tokenised shards, read where they lie as memory maps (never copied).

Shard formats and which files: :mod:`archlab.data.shards`.

Vocabulary. The sizes known besides ``model.vocab_size``: the tokenizer's (``data.tokenizer``: a
tokenizer file; ``byte``; ``bpe``, the default, = the ``tokenizer.json`` beside the shards if there is
one, else no tokenizer: training needs none) and a sidecar's beside the first training shard
(``meta.json``: an archlab cache's, or ``{"vocab_size": V, "eot_id": E}``; nanoGPT's ``meta.pkl``,
read without running pickled code). ``model.vocab_size`` must be at least each of them (more rows
are padding, e.g. GPT-2's 50257 ids in 50304 rows) and every id of every shard below the smallest:
a shard with a larger id is refused, naming the file and the id. The end-of-text id is
``data.eot_id``, else the sidecar's, else the tokenizer's ``<|endoftext|>``, else none (training does
not need it: the shards already separate their documents).

Cost. The id check and the unigram entropy the trainer logs come from per-shard id counts: one
``np.bincount`` pass over each shard in chunks of :data:`COUNT_CHUNK` ids (~0.3-0.5 s per 100M ids on
one core, plus reading the file once), cached under ``<data.cache_dir>/token-counts/`` keyed by the
file's path, size and mtime. The first run over FineWeb-10B (103 shards of 100M ids, 20 GB) pays the
pass once; later runs read only the counts. The entropy is therefore exact, over every training id.
"""

from __future__ import annotations

import hashlib
import io
import json
import operator
import os
import pickle
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import numpy as np

from archlab.data.corpus import DataError
from archlab.data.prepared import PreparedData
from archlab.data.shards import (
    SHARD_FORMATS,
    SIDECAR_JSON,
    Shard,
    one_format,
    open_shard,
    read_json,
    shard_files,
)
from archlab.data.tokenizer import BYTE_VOCAB_SIZE, EOS, Tokenizer, byte_tokenizer, load_tokenizer_file

COUNT_CHUNK = 2**24  # ids per np.bincount call: bounds its int64 temporary to 128 MB
COUNTS_VERSION = 1  # bump when the cached counts change meaning
SIDECAR_PKL = "meta.pkl"
TOKENIZER_FILE = "tokenizer.json"


# ----------------------------------------------------------------------------- one array from many


class ShardedTokens:
    """Several 1-D id arrays (memory maps) presented as their concatenation, without copying.

    Supports what the batch sampler and the evaluation windows use: ``len``, an integer, a slice and
    an integer array of any shape (global positions -> ids, shape kept). ``unigram_counts`` (ids ->
    occurrences over every array) lets :func:`archlab.data.unigram_entropy` skip a pass over the data.
    ``np.asarray`` of it copies everything: meant for small test data only.
    """

    ndim = 1

    def __init__(self, arrays: Sequence[np.ndarray], paths: Optional[Sequence[Path]] = None,
                 unigram_counts: Optional[np.ndarray] = None):
        if not arrays:
            raise ValueError("ShardedTokens needs at least one array")
        self.arrays = list(arrays)
        self.paths = list(paths) if paths is not None else [None] * len(self.arrays)
        lengths = np.array([len(a) for a in self.arrays], dtype=np.int64)
        self.ends = np.cumsum(lengths)  # (n_arrays,) global end of each array
        self.starts = self.ends - lengths
        self.dtype = np.result_type(*[a.dtype for a in self.arrays])
        self.unigram_counts = unigram_counts

    def __len__(self) -> int:
        return int(self.ends[-1])

    @property
    def shape(self) -> tuple[int]:
        return (len(self),)

    def _array_of(self, positions: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.ends, positions, side="right")

    def __getitem__(self, index: Any):
        n = len(self)
        if isinstance(index, slice):
            start, stop, step = index.indices(n)
            if step != 1:
                return self[np.arange(start, stop, step, dtype=np.int64)]
            return self._range(start, stop)
        if isinstance(index, (int, np.integer)):
            i = operator.index(index)
            i = i + n if i < 0 else i
            if not 0 <= i < n:
                raise IndexError(f"index {index} is out of bounds for {n} tokens")
            a = int(self._array_of(np.int64(i)))
            return self.arrays[a][i - int(self.starts[a])]
        idx = np.asarray(index)
        if idx.dtype.kind not in "iu":
            raise TypeError(f"ShardedTokens takes integers, slices or integer arrays, not {idx.dtype} arrays")
        flat = idx.reshape(-1).astype(np.int64, copy=True)
        flat[flat < 0] += n
        if flat.size and (flat.min() < 0 or flat.max() >= n):
            raise IndexError(f"an index is out of bounds for {n} tokens")
        if len(self.arrays) == 1:
            return np.asarray(self.arrays[0][flat]).reshape(idx.shape)
        which = self._array_of(flat)
        out = np.empty(flat.shape, dtype=self.dtype)
        for a in np.unique(which):
            here = which == a
            out[here] = self.arrays[a][flat[here] - self.starts[a]]
        return out.reshape(idx.shape)

    def _range(self, start: int, stop: int) -> np.ndarray:
        """``[start, stop)``: a view when it lies in one array, else a concatenated copy."""
        if stop <= start:
            return np.empty(0, dtype=self.dtype)
        pieces = []
        for a in range(int(self._array_of(np.int64(start))), len(self.arrays)):
            lo, hi = max(start, int(self.starts[a])), min(stop, int(self.ends[a]))
            if lo >= hi:
                break
            pieces.append(self.arrays[a][lo - int(self.starts[a]):hi - int(self.starts[a])])
        if len(pieces) == 1:
            return pieces[0]
        return np.concatenate([np.asarray(p, dtype=self.dtype) for p in pieces])

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = self._range(0, len(self))
        return np.array(out, dtype=dtype or self.dtype, copy=True)

    def __repr__(self) -> str:
        return f"ShardedTokens({len(self.arrays)} arrays, {len(self):,} tokens, {self.dtype})"


# ----------------------------------------------------------------------------- id counts


def count_ids(ids: np.ndarray, chunk: int = COUNT_CHUNK) -> np.ndarray:
    """(max id + 1,) int64 occurrences of each id: ``np.bincount`` in chunks (bounded memory)."""
    counts = np.zeros(0, dtype=np.int64)
    for start in range(0, len(ids), chunk):
        c = np.bincount(np.asarray(ids[start:start + chunk]))
        if len(c) > len(counts):
            counts = np.pad(counts, (0, len(c) - len(counts)))
        counts[:len(c)] += c
    return counts


def _counts_key(shard: Shard) -> str:
    st = shard.path.stat()
    return json.dumps({"path": str(shard.path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                       "offset": shard.offset, "dtype": shard.dtype.str, "n_tokens": shard.n_tokens,
                       "version": COUNTS_VERSION}, sort_keys=True)


def shard_counts(shard: Shard, ids: np.ndarray, cache_dir: Optional[Path]) -> tuple[np.ndarray, bool]:
    """(id counts of ``shard``, whether they came from the cache). Cached in ``cache_dir`` keyed by the
    file's path, size and mtime (and how it is read); a cache that cannot be written is skipped."""
    key = _counts_key(shard)
    path = None
    if cache_dir is not None:
        path = cache_dir / f"{hashlib.sha256(str(shard.path.resolve()).encode()).hexdigest()[:24]}.npz"
        try:
            with np.load(path, allow_pickle=False) as z:
                if str(z["key"]) == key:
                    return z["counts"].astype(np.int64, copy=False), True
        except (OSError, ValueError, KeyError):
            pass
    counts = count_ids(ids)
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            buf = io.BytesIO()
            np.savez(buf, counts=counts, key=np.array(key))
            tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
            tmp.write_bytes(buf.getvalue())
            os.replace(tmp, path)
        except OSError:
            pass
    return counts, False


def _sum_counts(counts: Iterable[np.ndarray]) -> np.ndarray:
    total = np.zeros(0, dtype=np.int64)
    for c in counts:
        if len(c) > len(total):
            total = np.pad(total, (0, len(c) - len(total)))
        total[:len(c)] += c
    return total


# ----------------------------------------------------------------------------- vocabulary and tokenizer


class _PlainUnpickler(pickle.Unpickler):
    """Reads pickles of plain values (dict, list, str, int...) only: nothing is imported or called."""

    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: only plain values are read")


@dataclass
class Sidecar:
    """What a file beside the shards says about them."""

    path: Path
    vocab_size: Optional[int]
    eot_id: Optional[int]


def read_sidecar(folder: Path) -> Optional[Sidecar]:
    """``meta.json`` (an archlab cache's, or ``{"vocab_size": V, "eot_id": E}``), else nanoGPT's
    ``meta.pkl`` (its ``vocab_size``), beside the shards; None when neither says anything."""
    path = folder / SIDECAR_JSON
    if path.is_file():
        meta = read_json(path)
        if isinstance(meta, dict):
            tok = meta.get("tokenizer") if isinstance(meta.get("tokenizer"), dict) else {}
            vocab = meta.get("vocab_size", tok.get("vocab_size"))
            eot = meta.get("eot_id", tok.get("eos_id"))
            if vocab is not None or eot is not None:
                return Sidecar(path, _int_or_fail(vocab, path, "vocab_size"), _int_or_fail(eot, path, "eot_id"))
    path = folder / SIDECAR_PKL
    if path.is_file():
        try:
            with open(path, "rb") as f:
                meta = _PlainUnpickler(f).load()
        except Exception as e:  # any unpickling failure: not a plain meta.pkl
            raise DataError(f"{path}: not a plain nanoGPT meta.pkl ({e}); remove it or replace it with a "
                            "meta.json holding vocab_size") from None
        if isinstance(meta, dict) and meta.get("vocab_size") is not None:
            return Sidecar(path, _int_or_fail(meta["vocab_size"], path, "vocab_size"), None)
    return None


def _int_or_fail(value: Any, path: Path, what: str) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DataError(f"{path}: {what}={value!r} is not a non-negative integer")
    return value


class NoTokenizer:
    """A token-shard run without a tokenizer: the sizes, no text. :meth:`save` writes nothing, so the
    run folder has no ``tokenizer.json`` (``python -m tools.sample --tokenizer FILE`` supplies one)."""

    backend = None
    source_json = None

    def __init__(self, vocab_size: int, eos_id: Optional[int]):
        self.vocab_size = vocab_size
        self.eos_id = eos_id

    def _refuse(self, *_):
        raise DataError("no tokenizer: these token shards were read without one; set data.tokenizer to a "
                        "tokenizer.json (or put one beside the shards)")

    encode = encode_batch = decode = _refuse

    def save(self, path) -> None:
        pass

    def __repr__(self) -> str:
        return f"NoTokenizer(vocab_size={self.vocab_size}, eos_id={self.eos_id})"


def _tokenizer(data_cfg, folder: Path, eot_id: Optional[int]) -> tuple[Optional[Tokenizer], Optional[str]]:
    """(tokenizer, where it comes from) for ``data.tokenizer`` under ``data.source=tokens``."""
    kind = str(data_cfg.tokenizer)
    if kind == "byte":
        tok = byte_tokenizer([], BYTE_VOCAB_SIZE)
        return tok, "byte"
    if kind == "bpe":  # nothing to train: the tokenizer the shards were made with, when it lies beside them
        beside = folder / TOKENIZER_FILE
        if not beside.is_file():
            return None, None
        return load_tokenizer_file(beside, eot_id, require_eos=False, key="tokenizer beside the shards"), str(beside)
    return load_tokenizer_file(kind, eot_id, require_eos=False), kind


def _end_of_text(data_cfg, sidecar: Optional[Sidecar], tokenizer: Optional[Tokenizer]) -> tuple[Optional[int], str]:
    """(end-of-text id, where it comes from): data.eot_id, the sidecar's, the tokenizer's, else None."""
    given = getattr(data_cfg, "eot_id", None)
    if given is not None:
        return int(given), "data.eot_id"
    from_tok = None
    if tokenizer is not None:
        from_tok = 256 if str(data_cfg.tokenizer) == "byte" else tokenizer.backend.token_to_id(EOS)
    if sidecar is not None and sidecar.eot_id is not None:
        if from_tok is not None and from_tok != sidecar.eot_id:
            raise DataError(f"{sidecar.path} says eot_id={sidecar.eot_id} but the tokenizer's {EOS} is {from_tok}: "
                            "set data.eot_id to the right one")
        return sidecar.eot_id, str(sidecar.path)
    if from_tok is not None:
        return from_tok, f"the tokenizer's {EOS}"
    return None, "none"


# ----------------------------------------------------------------------------- prepare


def _validate_split(shards: Sequence[Shard], arrays: Sequence[np.ndarray], limit: int, limit_what: str,
                    cache_dir: Optional[Path]) -> tuple[np.ndarray, list[dict], int]:
    """(summed id counts, per-shard rows for meta.json, shards counted afresh); refuse an id >= limit."""
    rows, counts, fresh = [], [], 0
    for shard, ids in zip(shards, arrays):
        c, cached = shard_counts(shard, ids, cache_dir)
        fresh += not cached
        max_id = len(c) - 1
        if max_id >= limit:
            raise DataError(f"{shard.path}: token id {max_id} >= {limit} ({limit_what}): the shard was tokenised "
                            f"with a larger vocabulary; raise model.vocab_size to at least {max_id + 1} (and use "
                            "the tokenizer the shards were made with), or drop the shard")
        rows.append({"path": str(shard.path), "tokens": shard.n_tokens, "max_id": max_id})
        counts.append(c)
    return _sum_counts(counts), rows, fresh


def prepare_tokens(cfg):
    """:class:`archlab.data.PreparedData` over the token shards of ``cfg.data`` (module docstring).

    Raises :class:`DataError` naming the file and the problem for a shard that is not what it
    claims to be, an id outside the vocabulary, or a vocabulary smaller than the tokenizer's.
    """
    t0 = time.perf_counter()
    data_cfg = cfg.data
    model_vocab = int(cfg.model.vocab_size)
    shard_format = str(data_cfg.shard_format)
    if shard_format not in SHARD_FORMATS:
        raise DataError(f"data.shard_format={shard_format!r}: must be one of {', '.join(SHARD_FORMATS)}")
    train_files, val_files = shard_files(data_cfg)
    train = [open_shard(p, shard_format) for p in train_files]
    val = [open_shard(p, shard_format) for p in val_files]
    fmt = one_format(train + val)
    folder = train_files[0].parent

    sidecar = read_sidecar(folder)
    given_eot = getattr(data_cfg, "eot_id", None)
    eot_hint = given_eot if given_eot is not None else (sidecar.eot_id if sidecar is not None else None)
    tokenizer, tokenizer_from = _tokenizer(data_cfg, folder, eot_hint)
    eot, eot_from = _end_of_text(data_cfg, sidecar, tokenizer)

    known = []  # (vocabulary size, what says so)
    if tokenizer is not None:
        known.append((tokenizer.vocab_size, f"the tokenizer's vocabulary, {tokenizer_from}"))
    if sidecar is not None and sidecar.vocab_size is not None:
        known.append((sidecar.vocab_size, f"vocab_size in {sidecar.path}"))
    for size, what in known:
        if model_vocab < size:
            raise DataError(f"model.vocab_size={model_vocab} is smaller than {what} ({size}): set "
                            f"model.vocab_size >= {size} (a larger vocabulary is padding, e.g. GPT-2's 50257 ids "
                            "in 50304 rows)")
    limit, limit_what = min([*known, (model_vocab, f"model.vocab_size={model_vocab}")], key=lambda k: k[0])
    if eot is not None and not 0 <= eot < limit:
        raise DataError(f"end-of-text id {eot} (from {eot_from}) is outside the vocabulary ({limit}, {limit_what})")
    if tokenizer is not None and eot is not None:
        tokenizer.eos_id = eot

    cache_dir = Path(os.path.expanduser(str(data_cfg.cache_dir))) / "token-counts"
    arrays = {"train": [s.open() for s in train], "val": [s.open() for s in val]}
    train_counts, train_rows, fresh_t = _validate_split(train, arrays["train"], limit, limit_what, cache_dir)
    _, val_rows, fresh_v = _validate_split(val, arrays["val"], limit, limit_what, cache_dir)
    splits = {"train": ShardedTokens(arrays["train"], train_files, train_counts),
              "val": ShardedTokens(arrays["val"], val_files)}
    n_tokens = {s: len(splits[s]) for s in splits}
    meta = {
        "format": "tokens",
        "source": "tokens",
        "shard_format": fmt,
        "corpus": f"{len(train)} + {len(val)} {fmt} token shards ({n_tokens['train']:,} + {n_tokens['val']:,} ids) "
                  f"under {folder}",
        "n_files": {"train": len(train), "val": len(val)},
        "tokens": n_tokens,
        "dtype": {"train": splits["train"].dtype.str, "val": splits["val"].dtype.str},
        "shards": {"train": train_rows, "val": val_rows},
        "tokenizer": {"kind": str(data_cfg.tokenizer), "file": tokenizer_from if tokenizer is not None else None,
                      "vocab_size": tokenizer.vocab_size if tokenizer is not None else None,
                      "eos_id": eot, "eos_from": eot_from},
        "vocab_limit": {"size": limit, "from": limit_what},
        "sidecar": str(sidecar.path) if sidecar is not None else None,
        "id_counts": {"cache": str(cache_dir), "counted_now": fresh_t + fresh_v,
                      "cached": len(train) + len(val) - fresh_t - fresh_v},
        "unigram_entropy": "exact: from the id counts of every training shard",
        "build_seconds": round(time.perf_counter() - t0, 3),
    }
    if tokenizer is None:
        tokenizer = NoTokenizer(limit, eot)
    return PreparedData(tokenizer, splits["train"], splits["val"], folder, meta)
