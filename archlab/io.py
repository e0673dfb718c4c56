"""Small file helpers shared by the library and its programs: atomic writes, JSON lines.

A file that matters (checkpoint metadata, caches, manifests, reports) is written to a temporary
file in the same folder, flushed to disk, then renamed over the target with ``os.replace``, so a
crash leaves either the old file or the new one, never half of one.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Optional


def write_text_atomic(path: Path, text: str) -> Path:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def publish_folder(tmp: Path, out: Path) -> Path:
    """Move the finished folder ``tmp`` (from ``tempfile.mkdtemp`` beside ``out``) into place as ``out``, replacing
    an older ``out``, with the usual umask modes (mkdtemp makes it private, 0700): a crash never leaves half a folder
    under that name."""
    umask = os.umask(0)
    os.umask(umask)
    for root, _, files in os.walk(tmp):
        os.chmod(root, 0o777 & ~umask)
        for f in files:
            os.chmod(Path(root) / f, 0o666 & ~umask)
    if out.exists():
        old = out.with_name(f".{out.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(out, old)
        shutil.rmtree(old)
    os.replace(tmp, out)
    return out


def plain_scalar(obj: Any) -> Any:
    """A numpy scalar (``np.bool_``, ``np.float64``, ...) as the Python value JSON can write; anything else refused as
    ``json.dumps`` would refuse it."""
    if hasattr(obj, "item") and getattr(obj, "shape", None) == ():
        return obj.item()
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


def write_json_atomic(path: Path, obj: Any, sort_keys: bool = True,
                      default: Optional[Callable[[Any], Any]] = None) -> Path:
    """``obj`` as indented JSON at ``path``, atomically; numpy scalars written as Python values unless ``default``
    says otherwise."""
    return write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=sort_keys, default=default or plain_scalar)
                             + "\n")


def parse_jsonl(text: str) -> list[dict]:
    """Rows of JSON-lines text; a torn line (a process killed mid-write) is skipped."""
    rows = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def read_jsonl(path: Path) -> list[dict]:
    """Rows of a JSON-lines file (:func:`parse_jsonl`); none when the file is missing."""
    path = Path(path)
    return parse_jsonl(path.read_text()) if path.is_file() else []
