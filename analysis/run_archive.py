"""The slim run archive: a sweep's finished runs kept small enough to commit (``tools.sweep --archive``).

An archive folder holds the sweep's ``manifest.json`` and ``runs.tar.xz``: one tar (xz-compressed) of run folders
``<run>/<file>`` that keep what the analysis reads of a run and no more (:func:`slim_run`): ``run.json``,
``recipe.yaml``, ``summary.json`` and ``env.json`` whole; of ``metrics.jsonl`` the evaluation rows and the training
rows the run's health check reads (the first, the last with a token count, any non-finite); of ``routing.jsonl``
(MoE) the routing summary in force at each evaluation and the last. ``tar -xJf runs.tar.xz`` gives the run folders;
``analysis.runs`` reads the runs in place, ``tools.sweep --restore`` writes them back as run folders. An archive of
an earlier archlab (one plain folder per run) still reads and restores.
"""

from __future__ import annotations

import io
import json
import lzma
import math
import os
import tarfile
from functools import lru_cache
from pathlib import Path
from typing import Optional

from archlab.io import parse_jsonl
from archlab.train.run_folder import ENV, METRICS, RECIPE, ROUTING, RUN_MARKER, SUMMARY

ARCHIVE = "runs.tar.xz"
KEPT_FILES = (RUN_MARKER, RECIPE, SUMMARY, ENV, METRICS, ROUTING)  # a run's records; no checkpoints, no tokenizer


def _rows_with_lines(text: str) -> list[tuple[str, dict]]:
    out = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            out.append((line, row))
    return out


def _is_train(row: dict) -> bool:
    return row.get("kind", "train") == "train" and "loss" in row


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def slim_metrics(text: str) -> str:
    """The lines of ``metrics.jsonl`` the analysis reads, verbatim and in order: every evaluation row (kind val),
    and of the training rows the first (the health check's start loss), the last with a token count (the tokens
    seen without a summary) and each with a non-finite loss (a divergence and its step)."""
    rows = _rows_with_lines(text)
    train = [i for i, (_, r) in enumerate(rows) if _is_train(r)]
    keep = {i for i in train if not _finite(rows[i][1]["loss"])}
    keep |= set(train[:1]) | set([i for i in train if rows[i][1].get("tokens") is not None][-1:])
    return "".join(line + "\n" for i, (line, r) in enumerate(rows) if r.get("kind") == "val" or i in keep)


def slim_routing(text: str, eval_steps: list[int]) -> str:
    """The lines of ``routing.jsonl`` kept: the row in force at each evaluation step (the last at or before it)
    and the last row, verbatim and in order."""
    rows = _rows_with_lines(text)
    keep = set(range(len(rows))[-1:])
    for step in eval_steps:
        before = [i for i, (_, r) in enumerate(rows) if isinstance(r.get("step"), (int, float)) and r["step"] <= step]
        keep |= set(before[-1:])
    return "".join(rows[i][0] + "\n" for i in sorted(keep))


def slim_run(run_dir: Path) -> dict[str, str]:
    """A run folder's files as the archive keeps them (file name -> text; files the run lacks are absent)."""
    run_dir = Path(run_dir)
    files = {f: (run_dir / f).read_text() for f in KEPT_FILES if (run_dir / f).is_file()}
    if METRICS in files:
        files[METRICS] = slim_metrics(files[METRICS])
    if ROUTING in files:
        evals = [int(r["step"]) for r in parse_jsonl(files.get(METRICS, ""))
                 if r.get("kind") == "val" and isinstance(r.get("step"), (int, float))]
        files[ROUTING] = slim_routing(files[ROUTING], evals)
    return files


def is_archive(folder: Path) -> bool:
    return (Path(folder) / ARCHIVE).is_file()


def read_archive(folder: Path) -> dict[str, dict[str, str]]:
    """The runs in an archive folder: run name -> file name -> text ({} where there is no ``runs.tar.xz``)."""
    path = Path(folder).resolve() / ARCHIVE
    if not path.is_file():
        return {}
    st = path.stat()
    return _read_tar(str(path), st.st_ino, st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=16)
def _read_tar(path: str, *state: int) -> dict[str, dict[str, str]]:  # keyed by the file's state: a rewrite reads afresh
    runs: dict[str, dict[str, str]] = {}
    with tarfile.open(path, "r:xz") as tf:
        for member in tf.getmembers():
            parts = member.name.split("/")
            if member.isfile() and len(parts) == 2 and parts[1] in KEPT_FILES:
                runs.setdefault(parts[0], {})[parts[1]] = tf.extractfile(member).read().decode()
    return runs


def archived_run(path: Path) -> Optional[dict[str, str]]:
    """The files of the archived run that ``path`` names (``<archive folder>/<run>``), None if it names none."""
    path = Path(path)
    return read_archive(path.parent).get(path.name) if is_archive(path.parent) else None


def write_archive(folder: Path, runs: dict[str, dict[str, str]]) -> Path:
    """Write ``runs`` (run name -> file name -> text) as ``folder/runs.tar.xz``, atomically. The bytes depend only on
    the runs (sorted, no times or owners), so an unchanged archive commits as no change."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name in sorted(runs):
            for f in KEPT_FILES:
                if f not in runs[name]:
                    continue
                data = runs[name][f].encode()
                info = tarfile.TarInfo(f"{name}/{f}")
                info.size, info.mode, info.mtime = len(data), 0o644, 0
                tf.addfile(info, io.BytesIO(data))
    path = Path(folder) / ARCHIVE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(lzma.compress(buf.getvalue(), preset=9 | lzma.PRESET_EXTREME))
    os.replace(tmp, path)
    return path


def write_run(files: dict[str, str], run_dir: Path) -> None:
    """An archived run written back as a run folder."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    for f, text in files.items():
        (run_dir / f).write_text(text)
