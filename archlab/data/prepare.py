"""``prepare_data(cfg)``: corpus -> split -> tokenizer -> token-id arrays, cached on disk.

Cache folder ``<data.cache_dir>/<source>-<key[:16]>/`` holds ``tokenizer.json``, ``train.bin`` and
``val.bin`` (raw little-endian token ids, read back as memory maps) and ``meta.json``. The key is a
sha256 over everything the result depends on: the corpus fingerprint (file names, sizes, mtimes and
content hashes; or the dataset and its fingerprint), ``max_bytes``, ``val_fraction``, ``seed``, the
tokenizer kind and vocabulary size (for a tokenizer file: the sha256 of its content and its
end-of-text id, not its path), the ``tokenizers`` version and :data:`DATA_FORMAT_VERSION`.
A change to any of them gives a new key, so a stale cache is never reused.

``data.source: tokens`` (pre-tokenised shards) has no corpus and no cache of its own: it is read
where it lies by ``archlab.data.tokens``.

A folder is built under a temporary name and renamed into place when complete, ``meta.json`` is
written last, and a folder whose ``meta.json`` is missing or does not match its files is rebuilt:
a crash never leaves a cache that a later run would trust. Processes that need the same missing folder
at once (a sweep's parallel runs) take turns on an advisory lock file beside it: one builds, the others
then load what it published.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

import numpy as np
import tokenizers

from archlab.data.batches import check_length
from archlab.data.corpus import Corpus, DataError, split_corpus
from archlab.data.prepared import DATA_FORMAT_VERSION, PreparedData
from archlab.data.sources import build_corpus
from archlab.data.tokenizer import (
    BYTE_VOCAB_SIZE,
    Tokenizer,
    build_tokenizer,
    check_model_vocab,
    is_tokenizer_file,
    load_tokenizer_file,
)
from archlab.data.tokens import prepare_tokens
from archlab.io import write_json_atomic

Progress = Optional[Callable[[str], None]]  # gets one line per stage of a cache build

ENCODE_CHUNK_CHARS = 4 * 2**20  # characters handed to encode_batch at once (bounds memory)
SPLITS = ("train", "val")




def token_dtype(vocab_size: int) -> np.dtype:
    """Little-endian uint16 while every id fits in 16 bits, else uint32."""
    return np.dtype("<u2") if vocab_size <= 2**16 else np.dtype("<u4")


def _tokenizer_vocab(data_cfg, model_vocab_size: int) -> int:
    """The tokenizer's vocabulary size: the model's for BPE (less the ids the objective reserves), always
    257 for bytes."""
    return BYTE_VOCAB_SIZE if data_cfg.tokenizer == "byte" else model_vocab_size


def check_reserved_ids(cfg, tokenizer: Tokenizer, reserved: int) -> None:
    """The tokenizer's ids stay below the ``reserved`` ids the objective keeps at the top of the vocabulary."""
    free = int(cfg.model.vocab_size) - reserved
    if reserved and tokenizer.vocab_size > free:
        raise DataError(f"model.vocab_size={int(cfg.model.vocab_size)}: "
                        f"train.objective={cfg.train.objective.type} uses the last {reserved} id(s) of the "
                        f"vocabulary itself, and the tokenizer has {tokenizer.vocab_size} ids; set model.vocab_size >= "
                        f"{tokenizer.vocab_size + reserved}")


def cache_key(corpus: Corpus, data_cfg, vocab_size: int, tokenizer: Optional[Tokenizer] = None) -> str:
    """sha256 (hex) over everything the cached arrays depend on. ``tokenizer``: the tokenizer file's
    tokenizer when ``data.tokenizer`` names one (keyed by its content and end-of-text id)."""
    parts = {
        "format": DATA_FORMAT_VERSION,
        "tokenizers": tokenizers.__version__,
        "source": data_cfg.source,
        "corpus": corpus.fingerprint,
        "max_bytes": data_cfg.max_bytes,
        "val_fraction": float(data_cfg.val_fraction),
        "seed": int(data_cfg.seed),
        "tokenizer": data_cfg.tokenizer,
        "vocab_size": vocab_size,
    }
    if tokenizer is not None and tokenizer.source_json is not None:  # a tokenizer file: its content, not its path
        parts["tokenizer"] = "file"
        parts["tokenizer_sha256"] = hashlib.sha256(tokenizer.source_json).hexdigest()
        parts["eot_id"] = tokenizer.eos_id
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode("utf-8")).hexdigest()


def _chunks(texts: Sequence[str], chunk_chars: int) -> Iterator[Sequence[str]]:
    """Consecutive runs of ``texts`` of about ``chunk_chars`` characters (at least one text each)."""
    start = 0
    while start < len(texts):
        end, size = start + 1, len(texts[start])
        while end < len(texts) and size < chunk_chars:
            size += len(texts[end])
            end += 1
        yield texts[start:end]
        start = end


def _write_ids(tokenizer: Tokenizer, texts: Sequence[str], path: Path, dtype: np.dtype) -> int:
    """Encode ``texts`` (EOS after each document) into the raw id file ``path``; return N."""
    n_tokens = 0
    with open(path, "wb") as f:
        for chunk in _chunks(texts, ENCODE_CHUNK_CHARS):
            for ids in tokenizer.encode_batch(chunk):
                ids_N = np.asarray(ids + [tokenizer.eos_id], dtype=dtype)
                f.write(ids_N.tobytes())
                n_tokens += len(ids_N)
    return n_tokens


def _load(folder: Path, key: str) -> Optional[PreparedData]:
    """The cached data in ``folder`` if it is complete and built for ``key``; else None."""
    try:
        meta = json.loads((folder / "meta.json").read_text())
        if meta.get("key") != key or meta.get("format") != DATA_FORMAT_VERSION:
            return None
        dtype = np.dtype(meta["dtype"])
        arrays = {}
        for split in SPLITS:
            path = folder / f"{split}.bin"
            n = int(meta["tokens"][split])
            if n <= 0 or path.stat().st_size != n * dtype.itemsize:
                return None
            arrays[split] = np.memmap(path, dtype=dtype, mode="r", shape=(n,))
        if is_tokenizer_file(meta["tokenizer"]["kind"]):  # kept byte for byte, with its end-of-text id
            tokenizer = load_tokenizer_file(folder / "tokenizer.json", int(meta["tokenizer"]["eos_id"]))
        else:
            tokenizer = Tokenizer.load(folder / "tokenizer.json")
    except (OSError, ValueError, KeyError, TypeError, DataError):
        return None
    return PreparedData(tokenizer, arrays["train"], arrays["val"], folder, meta)


def _build(folder: Path, corpus: Corpus, data_cfg, vocab_size: int, key: str,
           file_tokenizer: Optional[Tokenizer] = None, progress: Progress = None) -> Path:
    """Build the cache in a temporary folder next to ``folder`` and return it.

    On any failure the temporary folder is removed: no partial cache is left behind.
    """
    tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    tmp.mkdir(parents=True)
    try:
        _build_into(tmp, corpus, data_cfg, vocab_size, key, file_tokenizer, progress or (lambda msg: None))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp


def _build_into(tmp: Path, corpus: Corpus, data_cfg, vocab_size: int, key: str,
                file_tokenizer: Optional[Tokenizer], progress: Callable[[str], None]) -> None:
    """Split, train the tokenizer (or take the tokenizer file's), encode both splits, then write
    ``meta.json`` last. ``progress`` gets a line before each stage."""
    t0 = time.perf_counter()
    progress(f"data: building the token cache for {corpus.description} (first use of this corpus, split and "
             "tokenizer; reused afterwards)")
    split = split_corpus(corpus, data_cfg.val_fraction, data_cfg.seed, data_cfg.max_bytes)
    mb = {s: split.n_bytes[s] / 1e6 for s in SPLITS}
    if file_tokenizer is None:
        progress(f"data: training the {data_cfg.tokenizer} tokenizer ({vocab_size:,} ids) on the training split "
                 f"({split.n_docs['train']:,} files, {mb['train']:.1f} MB)")
    tokenizer = file_tokenizer or build_tokenizer(data_cfg.tokenizer, split.train, vocab_size)
    dtype = token_dtype(tokenizer.vocab_size)
    tokenizer.save(tmp / "tokenizer.json")
    progress(f"data: encoding the training and validation splits ({mb['train']:.1f} MB + {mb['val']:.1f} MB)")
    n_tokens = {s: _write_ids(tokenizer, getattr(split, s), tmp / f"{s}.bin", dtype) for s in SPLITS}
    progress(f"data: built in {time.perf_counter() - t0:.1f} s")
    meta = {
        "format": DATA_FORMAT_VERSION,
        "key": key,
        "corpus": corpus.description,
        "source": data_cfg.source,
        "n_files": split.n_docs,
        "bytes": split.n_bytes,
        "tokens": n_tokens,
        "dtype": dtype.str,  # "<u2" or "<u4"
        "tokenizer": {"kind": data_cfg.tokenizer, "vocab_size": tokenizer.vocab_size, "eos_id": tokenizer.eos_id},
        "settings": {"max_bytes": data_cfg.max_bytes, "val_fraction": float(data_cfg.val_fraction),
                     "seed": int(data_cfg.seed)},
        "build_seconds": round(time.perf_counter() - t0, 3),
    }
    for name in ("tokenizer.json", "train.bin", "val.bin"):
        _fsync(tmp / name)  # on disk before meta.json says they are complete
    write_json_atomic(tmp / "meta.json", meta)  # last: its presence marks a complete build
    _fsync(tmp / "meta.json")


def _fsync(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _publish(tmp: Path, folder: Path, key: str) -> PreparedData:
    """Rename the finished ``tmp`` into ``folder``, replacing an invalid folder of that name."""
    data = _load(folder, key)
    if data is not None:  # another process published the same key meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
        return data
    if folder.exists():
        trash = folder.with_name(f".{folder.name}.stale-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        os.replace(folder, trash)
        shutil.rmtree(trash, ignore_errors=True)
    try:
        os.replace(tmp, folder)
    except OSError:  # another process published the same key meanwhile: use theirs if valid
        shutil.rmtree(tmp, ignore_errors=True)
    data = _load(folder, key)
    if data is None:
        raise DataError(f"data cache {folder} is not valid right after building it; remove the folder and retry")
    return data


def _file_tokenizer(data_cfg, model_vocab_size: int) -> Optional[Tokenizer]:
    """The tokenizer of ``data.tokenizer`` when it names a tokenizer file (checked against the model's
    vocabulary: as large or larger), else None."""
    if not is_tokenizer_file(data_cfg.tokenizer):
        return None
    tokenizer = load_tokenizer_file(data_cfg.tokenizer, getattr(data_cfg, "eot_id", None))
    check_model_vocab(model_vocab_size, tokenizer, str(data_cfg.tokenizer))
    return tokenizer


def _prepare_text(cfg, progress: Progress, reserved: int) -> PreparedData:
    """A text source: its cache folder for this recipe's key, built when missing or incomplete."""
    data_cfg = cfg.data
    file_tokenizer = _file_tokenizer(data_cfg, int(cfg.model.vocab_size))
    if file_tokenizer is not None:
        vocab_size = file_tokenizer.vocab_size
    else:  # a tokenizer trained here leaves the ids the objective reserves free (causal LM: none)
        vocab_size = _tokenizer_vocab(data_cfg, int(cfg.model.vocab_size) - reserved)
    corpus = build_corpus(data_cfg)
    key = cache_key(corpus, data_cfg, vocab_size, file_tokenizer)
    folder = Path(os.path.expanduser(str(data_cfg.cache_dir))) / f"{corpus.family}-{key[:16]}"
    data = _load(folder, key)
    if data is not None:
        return data
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.with_name(f".{folder.name}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also when the process dies
        data = _load(folder, key)  # built by the process that held the lock before us
        if data is None:
            tmp = _build(folder, corpus, data_cfg, vocab_size, key, file_tokenizer, progress)
            data = _publish(tmp, folder, key)
    return data


def prepare_data(cfg, progress: Progress = None, reserved: int = 0) -> PreparedData:
    """Tokenized train/validation data for a recipe (``cfg.data``, ``cfg.model.vocab_size``).

    A text source: reuses the cache folder for this recipe's key when it is complete; otherwise
    builds it. ``data.source: tokens``: memory maps of the shards (``archlab.data.tokens``).
    Raises :class:`DataError` (a ``RecipeError``) with a clear message on bad data. ``progress``
    (e.g. ``print``) gets one line per stage of a build (the corpus, the tokenizer, the encoding).
    ``reserved``: ids at the top of the vocabulary the training objective uses itself (masked LM: its mask
    id), which the tokenizer leaves free (``Objective.reserved_ids``; ``archlab.objectives.token_data`` passes
    the recipe's objective's).
    """
    if cfg.data.source == "tokens":
        data = prepare_tokens(cfg)
    else:
        data = _prepare_text(cfg, progress, reserved)
    check_reserved_ids(cfg, data.tokenizer, reserved)
    train_cfg = cfg.get("train") if hasattr(cfg, "get") else None
    if train_cfg is not None:
        check_length(data.train, int(train_cfg.seq_len), "training split")
        check_length(data.val, int(train_cfg.seq_len), "validation split")
    return data

