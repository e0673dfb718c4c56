"""A task's items cached on disk: parsing a corpus with ``ast`` and ``tokenize`` takes about 20 s, longer than a
fine-tuning run's training, and every run of an experiment asks for the same items.

The key hashes everything the items depend on (the task's name, the window length, the seed, the tokenizer's
serialisation, every split's texts and the code version :data:`VERSION`); a file is written to a temporary name
and renamed, so a killed run leaves no partial entry.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Optional

import numpy as np

from archlab.data.tasks.items import Items

VERSION = 1  # raise when the items a task makes from the same inputs change
FIELDS = ("x", "y", "doc", "chance", "guess")


def task_key(task: str, texts: dict[str, list[str]], tokenizer, seq_len: int, seed: int) -> str:
    """The sha256 of what ``task``'s items depend on."""
    h = hashlib.sha256(json.dumps([VERSION, task, int(seq_len), int(seed)]).encode())
    h.update(tokenizer.backend.to_str().encode())
    for split in sorted(texts):
        h.update(f"\0{split}\0{len(texts[split])}".encode())
        for text in texts[split]:
            h.update(hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest())
    return h.hexdigest()


def load(folder: Path, key: str) -> Optional[tuple[dict[str, Items], np.ndarray, dict]]:
    """(items per split, the training ids, meta) of ``key``, or None when not cached (or unreadable)."""
    path = folder / f"{key[:24]}.npz"
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            items = {s: Items(*(z[f"{s}.{f}"] if f"{s}.{f}" in z else None for f in FIELDS))
                     for s in meta["splits"]}
            return items, z["train_ids"], meta["meta"]
    except (OSError, KeyError, ValueError):
        return None


def store(folder: Path, key: str, items: dict[str, Items], train_ids: np.ndarray, meta: dict) -> None:
    """Write ``key``'s entry atomically."""
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {f"{s}.{f}": getattr(it, f) for s, it in items.items() for f in FIELDS if getattr(it, f) is not None}
    arrays["train_ids"] = train_ids
    arrays["meta"] = np.array(json.dumps({"splits": list(items), "meta": meta}))
    tmp = folder / f".{key[:24]}.tmp-{os.getpid()}.npz"
    np.savez(tmp, **arrays)
    os.replace(tmp, folder / f"{key[:24]}.npz")
