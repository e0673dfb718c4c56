"""Reading run folders for the analysis programs (``analysis.scaling``, ``analysis.routing``).

A run folder is what ``python -m archlab.train`` leaves behind (see ``archlab/train/run_folder.py``):
``run.json`` (marks it as a run), ``recipe.yaml``, ``metrics.jsonl`` (rows with ``"kind"``:
train | val), ``routing.jsonl`` (MoE), ``checkpoints/``, ``tokenizer.json`` and, once the run
has ended, ``summary.json``. A sweep folder (``python -m tools.sweep``) holds ``manifest.json``
and one run folder per point; its archive (``--archive``) holds the manifest and ``runs.tar.xz``, whose runs
read here like run folders at ``<archive>/<run>`` (``analysis.run_archive``).

Every problem with an input (missing folder, not a run, incomplete run, wrong kind of run) is a
:class:`RunError` whose message names the path and says what to do; the programs print it and
exit 2.
"""

from __future__ import annotations

import fnmatch
import glob
import io
import json
import math
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Iterable, Optional

from omegaconf import DictConfig, OmegaConf

from analysis.plotting import pyplot, save_figure  # noqa: F401  (re-exported for scaling, routing)
from analysis.plotting import style_axes as _style_axes
from analysis.run_archive import archived_run, is_archive, read_archive
from archlab.config import model_config
from archlab.costs import param_counts, training_flops_per_token
from archlab.io import (
    parse_jsonl,
    write_text_atomic,  # noqa: F401  (re-exported for scaling, routing)
)
from archlab.io import read_jsonl as _read_jsonl
from archlab.io import write_json_atomic as _write_json_atomic
from archlab.objectives import objective_class, objective_name
from archlab.train.run_folder import METRICS, RECIPE, ROUTING, RUN_MARKER, SUMMARY  # noqa: F401  (the run's files)

SWEEP_MANIFEST = "manifest.json"
# nats: a final validation loss above (unigram entropy of the training split - this) learned no more than token
# frequencies; experiments mark such a run "did not learn", scaling studies leave it out with a status
LEARN_MARGIN = 0.1


class RunError(ValueError):
    """An input folder is missing, incomplete or of the wrong kind. The message says which and why."""


def read_jsonl(path: Path) -> list[dict]:
    """Rows of a JSON-lines file (torn lines skipped); a null loss reads as NaN (a diverged step)."""
    return _null_loss_as_nan(_read_jsonl(path))


def _null_loss_as_nan(rows: list[dict]) -> list[dict]:
    return [{k: (math.nan if v is None and k == "loss" else v) for k, v in row.items()} for row in rows]


def is_run_dir(path: Path) -> bool:
    return (path / RUN_MARKER).is_file()


def _present(path: Path) -> bool:
    """A run folder or an archived run is there."""
    return path.exists() or archived_run(path) is not None


def _archived_matches(pattern: str) -> list[str]:
    """The archived runs a glob names: ``<archive folder>/<pattern of run names>``."""
    folder, name = os.path.split(pattern)
    if glob.has_magic(folder) or not is_archive(Path(folder or ".")):
        return []
    return [os.path.join(folder, run) for run in read_archive(Path(folder or ".")) if fnmatch.fnmatch(run, name)]


@dataclass
class Run:
    """One run folder, read lazily. ``status`` is finished | incomplete | diverged."""

    path: Path
    recipe: DictConfig
    summary: Optional[dict]
    _status: Optional[tuple[str, str]] = field(default=None, repr=False)
    archived: Optional[dict] = field(default=None, repr=False)  # an archived run's files (file name -> text)

    # ---- identity
    @property
    def name(self) -> str:
        return self.path.name

    @property
    def family(self) -> str:
        return str(self.recipe.get("family") or "custom")

    @property
    def is_moe(self) -> bool:
        return self.recipe.model.get("moe") is not None

    # ---- rows
    def _rows(self, name: str) -> list[dict]:
        if self.archived is None:
            return read_jsonl(self.path / name)
        return _null_loss_as_nan(parse_jsonl(self.archived.get(name, "")))

    @cached_property
    def metrics(self) -> list[dict]:
        return self._rows(METRICS)

    @property
    def train_rows(self) -> list[dict]:
        return [r for r in self.metrics if r.get("kind", "train") == "train" and "loss" in r]

    @cached_property
    def loss_key(self) -> str:
        """The validation rows' loss of this run's objective (causal LM and MTP: ``loss``; masked LM:
        ``mlm_loss``; span corruption: ``span_loss``): losses under different keys are never compared."""
        return objective_class(objective_name(self.recipe)).eval_loss_key

    @property
    def val_rows(self) -> list[dict]:
        """Validation rows at the training context length, in step order (rows holding the objective's loss)."""
        rows = [r for r in self.metrics if r.get("kind") == "val" and r.get("context_multiplier", 1) == 1
                and self.loss_key in r]
        return sorted(rows, key=lambda r: r.get("step", 0))

    @cached_property
    def routing_rows(self) -> list[dict]:
        return self._rows(ROUTING)

    # ---- numbers
    @cached_property
    def seq_len(self) -> int:
        return int(self.recipe.train.seq_len)

    @cached_property
    def flops_per_token(self) -> float:
        """Training FLOPs per token from the run's recipe (archlab's cost model)."""
        return float(training_flops_per_token(model_config(self.recipe), self.seq_len))

    @cached_property
    def params(self) -> dict:
        """Parameter counts from the recipe (archlab's cost model): total, embedding,
        non_embedding, active (per token: MoE counts only the K routed experts), ..."""
        return param_counts(self.recipe).as_dict()

    @property
    def tokens_seen(self) -> Optional[float]:
        for src in (self.summary or {}, *(reversed(self.train_rows))):
            if src.get("tokens") is not None:
                return float(src["tokens"])
        return None

    @property
    def final_val_loss(self) -> Optional[float]:
        """The last validation loss of the run's objective (:attr:`loss_key`) at the training context (summary
        first, else the last row)."""
        key = self.loss_key
        final = (self.summary or {}).get("final_val_loss" if key == "loss" else f"final_val_{key}")  # {context: loss}
        if isinstance(final, dict) and isinstance(final.get(str(self.seq_len)), (int, float)):
            return float(final[str(self.seq_len)])
        rows = self.val_rows
        return float(rows[-1][key]) if rows else None

    def training_flops(self, tokens: Optional[float] = None) -> Optional[float]:
        t = self.tokens_seen if tokens is None else tokens
        return None if t is None else t * self.flops_per_token

    # ---- health
    @property
    def status(self) -> str:
        return self._check()[0]

    @property
    def reason(self) -> str:
        return self._check()[1]

    def _check(self) -> tuple[str, str]:
        if self._status is None:
            self._status = _diagnose(self)
        return self._status


def _diagnose(run: Run) -> tuple[str, str]:
    if run.summary is None:
        return "incomplete", f"no {SUMMARY}: the run has not ended (still running, crashed or killed)"
    s = run.summary
    stop = str(s.get("status") or "")  # completed | interrupted | nonfinite
    if stop == "nonfinite":
        return "diverged", f"stopped on a non-finite loss: {s.get('message', '')}".strip()
    losses = [r["loss"] for r in run.train_rows]
    if any(not _finite(v) for v in losses):
        first_bad = next(r.get("step") for r in run.train_rows if not _finite(r["loss"]))
        return "diverged", f"non-finite training loss at step {first_bad}"
    final = run.final_val_loss
    if final is None:
        return "incomplete", "no validation loss recorded (train.eval_every larger than the run?)"
    if not _finite(final):
        return "diverged", f"final validation loss is {final}"
    if losses and final > losses[0] + 1e-6:
        return "diverged", f"final validation loss {final:.3f} is above the first training loss {losses[0]:.3f}"
    if stop != "completed":
        return "incomplete", (f"ended with status {stop!r} ({s.get('message') or 'no message'}); "
                              "resume it with train.resume=auto")
    return "finished", ""


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def open_run(path: os.PathLike | str) -> Run:
    """Read a run folder's (or an archived run's) recipe and summary; raise :class:`RunError` if it is not a run."""
    path = Path(path)
    if not path.exists():
        files = archived_run(path)
        if files is None:
            raise RunError(f"{path}: no such folder")
        return _open_archived(path, files)
    if not path.is_dir():
        raise RunError(f"{path}: not a folder (expected an archlab run folder)")
    if not is_run_dir(path):
        if (path / SWEEP_MANIFEST).is_file():
            raise RunError(f"{path}: a sweep folder, not a run folder; pass one of its run folders")
        raise RunError(f"{path}: not an archlab run folder ({RUN_MARKER} missing); "
                       "pass a folder written by python -m archlab.train")
    if not (path / RECIPE).is_file():
        raise RunError(f"{path}: incomplete run folder ({RECIPE} missing)")
    try:
        recipe = OmegaConf.load(path / RECIPE)
    except Exception as e:
        raise RunError(f"{path / RECIPE}: unreadable ({e})") from None
    summary = None
    if (path / SUMMARY).is_file():
        try:
            summary = json.loads((path / SUMMARY).read_text())
        except ValueError as e:
            raise RunError(f"{path / SUMMARY}: unreadable ({e})") from None
    return Run(path=path, recipe=recipe, summary=summary)


def _open_archived(path: Path, files: dict[str, str]) -> Run:
    """An archived run read like its run folder (the same parsers over the same texts)."""
    if RECIPE not in files:
        raise RunError(f"{path}: incomplete archived run ({RECIPE} missing)")
    try:
        recipe = OmegaConf.load(io.StringIO(files[RECIPE]))
    except Exception as e:
        raise RunError(f"{path / RECIPE}: unreadable ({e})") from None
    summary = None
    if SUMMARY in files:
        try:
            summary = json.loads(files[SUMMARY])
        except ValueError as e:
            raise RunError(f"{path / SUMMARY}: unreadable ({e})") from None
    return Run(path=path, recipe=recipe, summary=summary, archived=files)


def _sweep_run_dirs(folder: Path) -> list[Path]:
    try:
        manifest = json.loads((folder / SWEEP_MANIFEST).read_text())
        points = manifest["points"]
    except (ValueError, KeyError, TypeError) as e:
        raise RunError(f"{folder / SWEEP_MANIFEST}: not a readable sweep manifest ({e})") from None
    return [Path(p["run_dir"]) if Path(p["run_dir"]).is_absolute() else folder / Path(p["run_dir"]).name
            for p in points]


def expand_inputs(inputs: Iterable[str]) -> tuple[list[Run], list[tuple[str, str]]]:
    """Run folders named by paths, globs, sweep folders (their manifest's points) or folders of runs; in an archive
    folder its archived runs stand for the run folders.

    Returns (runs, problems): a folder in a glob that is not a run becomes a (path, reason) problem
    instead of an error, so that the rest can still be analysed; so do a sweep's points that have
    no run folder yet (one problem per sweep folder, naming how many). A path the user names directly
    that is not a run (and holds no runs) is an error.
    """
    runs: list[Run] = []
    problems: list[tuple[str, str]] = []
    seen: set[Path] = set()

    def add(p: Path, strict: bool) -> None:
        p = p.resolve()
        if p in seen:
            return
        seen.add(p)
        try:
            runs.append(open_run(p))
        except RunError as e:
            if strict:
                raise
            problems.append((str(p), str(e)))

    for item in inputs:
        matches = sorted(set(glob.glob(item)) | set(_archived_matches(item))) if glob.has_magic(item) else [item]
        if not matches:
            raise RunError(f"{item}: the pattern matches nothing")
        for m in matches:
            p = Path(m)
            if not _present(p):
                raise RunError(f"{p}: no such folder")
            if p.is_dir() and (p / SWEEP_MANIFEST).is_file() and not is_run_dir(p):
                planned = _sweep_run_dirs(p)
                absent = [d for d in planned if not _present(d)]
                for d in planned:
                    if _present(d):
                        add(d, strict=False)
                if absent:  # one line for the sweep's points still to train, not one per point
                    problems.append((str(p.resolve()), f"{len(absent)} of the sweep's {len(planned)} planned points "
                                     f"have no run folder (not trained, or not archived): "
                                     f"{', '.join(d.name for d in absent[:3])}{', ...' if len(absent) > 3 else ''}"))
            elif p.is_dir() and not is_run_dir(p) and any(is_run_dir(c) for c in p.iterdir() if c.is_dir()):
                for c in sorted(c for c in p.iterdir() if c.is_dir() and is_run_dir(c)):
                    add(c, strict=False)
            elif p.is_dir() and is_archive(p):
                for name in sorted(read_archive(p)):
                    add(p / name, strict=False)
            else:
                add(p, strict=not glob.has_magic(item))
    if not runs:
        raise RunError("no run folders found in: " + ", ".join(inputs))
    return runs, problems


# --------------------------------------------------------------------------------------------
# plot style (titles, labelled axes with units, legends) and atomic file output
# --------------------------------------------------------------------------------------------


def style_axes(ax, title: str, xlabel: str, ylabel: str, legend: bool = True,
               legend_title: Optional[str] = None, legend_below: int = 0) -> None:
    """The shared style of ``analysis.plotting`` with a grid on both axes (curves, log axes)."""
    _style_axes(ax, title, xlabel, ylabel, legend=legend, legend_title=legend_title, grid="both",
                legend_below=legend_below)


def write_json_atomic(path: Path, obj) -> Path:
    return _write_json_atomic(path, obj, sort_keys=False, default=_json_default)


def _json_default(o):
    try:
        import numpy as np

        if isinstance(o, np.generic):
            return o.item()
        if isinstance(o, np.ndarray):
            return o.tolist()
    except ImportError:
        pass
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
