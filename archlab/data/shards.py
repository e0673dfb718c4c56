"""Token shard files (``data.source: tokens``): their formats, read and checked, and which files a recipe names.

Shard formats, by ``data.shard_format``:

- ``llmc``: llm.c's and modded-nanogpt's ``.bin`` shards (e.g. ``fineweb_train_000001.bin``): a
  header of 256 little-endian int32 (``[0]`` magic, ``[1]`` version, ``[2]`` token count), then the
  ids. Magic 20240520 with version 1: uint16 ids (GPT-2 tokens; what modded-nanogpt reads). llm.c
  also writes magic 20240801 with version 7: uint32 ids (its LLaMA-3 shards); both are read. The
  magic, the version and the token count against the file size are checked.
- ``nanogpt``: raw uint16 ids without a header (nanoGPT's ``prepare.py``: ``train.bin``, ``val.bin``).
- ``archlab``: an archlab data cache folder (``archlab.data.prepare``): ``train.bin`` and ``val.bin``
  (raw ids, dtype and counts in ``meta.json``, both checked) beside ``tokenizer.json``.
- ``auto`` (the default), per file: ``train.bin`` / ``val.bin`` beside an archlab ``meta.json`` ->
  archlab; an llm.c magic in the first 4 bytes -> llmc; else nanogpt. Every shard must come out the
  same. A raw file cannot start with the magic when its ids are GPT-2's (20240520 as two uint16 is
  [54248, 308], above 50256), but a damaged llm.c header cannot be told from raw ids: name the
  format to have the header checked.

Which files: ``data.train_shards`` and ``data.val_shards`` are each a glob (matches sorted by name),
a file, or a folder standing for its ``train.bin`` / ``val.bin``; ``val_shards`` null takes the
``val.bin`` of the ``train_shards`` folder. A file in both splits is refused. The shards of a split
concatenate logically (:class:`ShardedTokens`): a training window may span two shards, as it spans
two documents of one file.
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from archlab.data.corpus import DataError
from archlab.data.prepared import DATA_FORMAT_VERSION

SHARD_FORMATS = ("auto", "llmc", "nanogpt", "archlab")
LLMC_HEADER_INTS = 256
LLMC_HEADER_BYTES = LLMC_HEADER_INTS * 4
# magic -> (version, dtype of the ids, what writes it): llm.c's dev/data/data_common.py HEADERS_INFO
LLMC_FORMATS = {
    20240520: (1, np.dtype("<u2"), "llm.c / modded-nanogpt GPT-2 shards"),
    20240801: (7, np.dtype("<u4"), "llm.c LLaMA-3 shards"),
}
NANOGPT_DTYPE = np.dtype("<u2")
SIDECAR_JSON = "meta.json"


@dataclass(frozen=True)
class Shard:
    """One validated shard file: its ids are ``n_tokens`` values of ``dtype`` from byte ``offset``."""

    path: Path
    format: str  # llmc | nanogpt | archlab
    dtype: np.dtype
    offset: int
    n_tokens: int

    def open(self) -> np.memmap:
        return np.memmap(self.path, dtype=self.dtype, mode="r", offset=self.offset, shape=(self.n_tokens,))


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: not readable JSON ({e}); fix or remove it") from None


def archlab_meta(folder: Path) -> Optional[dict]:
    """The ``meta.json`` of an archlab data cache folder, or None when ``folder`` is not one."""
    path = folder / SIDECAR_JSON
    if not path.is_file():
        return None
    meta = read_json(path)
    if isinstance(meta, dict) and {"format", "dtype", "tokens", "tokenizer"} <= meta.keys():
        return meta
    return None


def detect_format(path: Path) -> str:
    """The format of one shard under ``data.shard_format=auto`` (rule in the module docstring)."""
    if path.name in ("train.bin", "val.bin") and archlab_meta(path.parent) is not None:
        return "archlab"
    with open(path, "rb") as f:
        head = f.read(4)
    if len(head) == 4 and int.from_bytes(head, "little", signed=True) in LLMC_FORMATS:
        return "llmc"
    return "nanogpt"


def _llmc_shard(path: Path, size: int) -> Shard:
    if size < LLMC_HEADER_BYTES:
        raise DataError(f"{path}: {size} bytes, shorter than the {LLMC_HEADER_BYTES}-byte llm.c header: a truncated "
                        "shard (download or regenerate it), or raw ids without a header (data.shard_format=nanogpt)")
    header = np.fromfile(path, dtype="<i4", count=LLMC_HEADER_INTS)
    magic, version, n = (int(v) for v in header[:3])
    if magic not in LLMC_FORMATS:
        known = ", ".join(f"{m} ({what})" for m, (_, _, what) in LLMC_FORMATS.items())
        raise DataError(f"{path}: bad magic {magic} in the llm.c header (expected {known}): not an llm.c shard; "
                        "for raw uint16 ids without a header (nanoGPT's train.bin) set data.shard_format=nanogpt")
    want, dtype, what = LLMC_FORMATS[magic]
    if version != want:
        raise DataError(f"{path}: unsupported llm.c header version {version}: magic {magic} ({what}) is read "
                        f"as version {want} ({dtype.name} ids); regenerate the shard with llm.c's dev/data scripts "
                        "(or modded-nanogpt's data/cached_fineweb10B.py)")
    expected = LLMC_HEADER_BYTES + n * dtype.itemsize
    if n <= 0 or size != expected:
        raise DataError(f"{path}: the header says {n} tokens ({expected} bytes with the header) but the file holds "
                        f"{size} bytes: a truncated or damaged shard (an interrupted download?); "
                        "download or regenerate it")
    return Shard(path, "llmc", dtype, LLMC_HEADER_BYTES, n)


def _nanogpt_shard(path: Path, size: int) -> Shard:
    if size % NANOGPT_DTYPE.itemsize:
        raise DataError(f"{path}: {size} bytes, an odd number: not raw uint16 ids (nanoGPT's train.bin/val.bin); "
                        "an llm.c shard with a damaged header? data.shard_format=llmc checks its header")
    return Shard(path, "nanogpt", NANOGPT_DTYPE, 0, size // NANOGPT_DTYPE.itemsize)


def _archlab_shard(path: Path, size: int) -> Shard:
    meta = archlab_meta(path.parent)
    if meta is None:
        raise DataError(f"{path}: not in an archlab data cache folder ({path.parent / SIDECAR_JSON} is missing or "
                        "lacks format/dtype/tokens/tokenizer); data.shard_format=archlab reads the folders "
                        "python -m archlab.data builds")
    if meta["format"] != DATA_FORMAT_VERSION:
        raise DataError(f"{path}: the archlab cache {path.parent} has format {meta['format']}, this archlab reads "
                        f"format {DATA_FORMAT_VERSION}: rebuild it (python -m archlab.data RECIPE)")
    split = path.stem
    if path.suffix != ".bin" or split not in meta["tokens"]:
        raise DataError(f"{path}: an archlab cache folder holds train.bin and val.bin; point at one of them "
                        "(or at the folder)")
    dtype = np.dtype(meta["dtype"])
    n = int(meta["tokens"][split])
    if n <= 0 or size != n * dtype.itemsize:
        raise DataError(f"{path}: {path.parent / SIDECAR_JSON} says {n} tokens ({n * dtype.itemsize} bytes) but the "
                        f"file holds {size} bytes: an incomplete cache; delete {path.parent} and rebuild it "
                        "(python -m archlab.data RECIPE)")
    return Shard(path, "archlab", dtype, 0, n)


_READERS = {"llmc": _llmc_shard, "nanogpt": _nanogpt_shard, "archlab": _archlab_shard}


def open_shard(path: Path, shard_format: str = "auto") -> Shard:
    """Validate one shard file of ``shard_format`` (``auto``: :func:`detect_format`)."""
    try:
        size = path.stat().st_size
        fmt = detect_format(path) if shard_format == "auto" else shard_format
    except OSError as e:
        raise DataError(f"cannot read {path}: {e.strerror or e}") from None
    if fmt not in _READERS:
        raise DataError(f"data.shard_format={shard_format!r}: must be one of {', '.join(SHARD_FORMATS)}")
    if size == 0:
        raise DataError(f"{path}: an empty file holds no tokens; remove it from the shards")
    return _READERS[fmt](path, size)


def _expand(spec: str, key: str, folder_file: str) -> list[Path]:
    """The files of one ``data.train_shards`` / ``data.val_shards`` value (glob, file or folder)."""
    expanded = os.path.expanduser(spec)
    if glob.has_magic(spec):
        files = sorted(Path(p) for p in glob.glob(expanded, recursive=True) if os.path.isfile(p))
        if not files:
            raise DataError(f"{key}={spec!r}: the glob matches no file")
        return files
    path = Path(expanded)
    if path.is_dir():
        if not (path / folder_file).is_file():
            raise DataError(f"{key}={spec!r}: the folder holds no {folder_file}; give a glob of its shards "
                            f"(e.g. '{spec.rstrip('/')}/*_train_*.bin')")
        return [path / folder_file]
    if path.is_file():
        return [path]
    raise DataError(f"{key}={spec!r}: no such file, folder or glob match")


def shard_files(data_cfg) -> tuple[list[Path], list[Path]]:
    """(training files, validation files) named by ``data.train_shards`` and ``data.val_shards``."""
    train_spec = data_cfg.train_shards
    if not train_spec:
        raise DataError("data.train_shards is empty: data.source=tokens needs a glob of token shards "
                        "(or a folder holding train.bin and val.bin)")
    train = _expand(str(train_spec), "data.train_shards", "train.bin")
    val_spec = data_cfg.val_shards
    if val_spec:
        val = _expand(str(val_spec), "data.val_shards", "val.bin")
    elif Path(os.path.expanduser(str(train_spec))).is_dir():
        val = _expand(str(train_spec), "data.train_shards (for validation: data.val_shards is null)", "val.bin")
    else:
        raise DataError(f"data.val_shards is null and data.train_shards={train_spec!r} is not a folder: give a glob "
                        "of validation shards (e.g. data.val_shards='data/fineweb10B/fineweb_val_*.bin')")
    both = sorted({p.resolve() for p in train} & {p.resolve() for p in val})
    if both:
        raise DataError(f"{both[0]} is both a training and a validation shard: data.train_shards and "
                        "data.val_shards must not overlap (validation on training data measures nothing)")
    return train, val


def one_format(shards: Sequence[Shard]) -> str:
    formats = {s.format: s.path for s in shards}
    if len(formats) > 1:
        found = "; ".join(f"{path} is {fmt}" for fmt, path in formats.items())
        raise DataError(f"the shards are of different formats ({found}): set data.shard_format to the one they "
                        "should all be, so that the others are refused with the reason")
    return shards[0].format
