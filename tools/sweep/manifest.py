"""The sweep folder's ``manifest.json`` (every point and what became of it), what a run folder says of a point,
and a point whose submission the launcher refused (:class:`RefusalRecorder`)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Optional

from archlab.io import write_json_atomic
from archlab.train.run_folder import SUMMARY
from tools import launch
from tools.sweep.point import Point

MANIFEST = "manifest.json"


def write_manifest(out_dir: Path, spec: dict, points: list[Point]) -> None:
    write_json_atomic(out_dir / MANIFEST, {"kind": "archlab-sweep", "version": 1, "spec": spec,
                                           "points": [asdict(p) for p in points]}, sort_keys=False)


def record_refusal(out_dir: Path, name: str, message: str) -> None:
    """Point ``name`` as the launcher left it when its submission was refused (sbatch: a partition or memory the
    cluster has not): ``status: refused`` and the refusal under ``refused``, not ``pending``. Running the same
    command again (the option fixed) submits it anew."""
    m = read_manifest(out_dir)
    if m is None:
        return
    for q in m.get("points", []):
        if q.get("name") == name:
            q["status"], q["refused"] = "refused", message
    write_json_atomic(Path(out_dir) / MANIFEST, m, sort_keys=False)


def read_manifest(out_dir: Path) -> Optional[dict]:
    path = Path(out_dir) / MANIFEST
    if not path.is_file():
        return None
    try:
        m = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e}); delete it to start the sweep afresh") from None
    if not isinstance(m, dict) or m.get("kind") != "archlab-sweep":
        raise ValueError(f"{path}: not an archlab sweep manifest")
    return m


def check_consistent(out_dir: Path, points: list[Point]) -> None:
    """A point already in the manifest must describe the same run, or resuming would mix runs."""
    old = read_manifest(out_dir)
    if old is None:
        return
    before = {q["name"]: q for q in old.get("points", [])}
    for p in points:
        q = before.get(p.name)
        if q and (q["recipe"] != p.recipe or q["overrides"] != p.overrides or q["max_steps"] != p.max_steps
                  or q.get("cooldown", {}) != p.cooldown):
            raise ValueError(f"sweep folder {out_dir} already holds point {p.name} with different settings "
                             f"(recipe/overrides/steps/cooldown); use a new --out folder or delete that point's run "
                             f"folder and its manifest entry")


def run_state(p: Point) -> str:
    """What the point's run folder says (:func:`run_dir_state`)."""
    return run_dir_state(p.run_dir)


def run_dir_state(run_dir) -> str:
    """What a run folder says: finished | diverged (stopped on non-finite numbers: rerunning the
    same deterministic run would diverge again) | started (resumable) | new."""
    path = Path(run_dir) / SUMMARY
    if path.is_file():
        try:
            status = json.loads(path.read_text()).get("status")
        except (ValueError, AttributeError):
            status = None
        if status == "completed":
            return "finished"
        if status == "nonfinite":
            return "diverged"
    return "started" if Path(run_dir).is_dir() else "new"


def is_done(p: Point) -> bool:
    return run_state(p) in ("finished", "diverged")


class RefusalRecorder:
    """A launcher (``tools.launch``) that remembers the point whose submission it refused (LaunchError: sbatch
    said no) and removes the submission script submitit left for it, so that the refusal is one line, the
    manifest records the point as refused (:func:`record_refusal`) and nothing of the submission stays."""

    def __init__(self, via):
        self.via = via
        self.refused = None  # the point whose start was refused

    def __getattr__(self, name):
        return getattr(self.via, name)

    def start(self, p, cmd: list[str], env: dict):
        folder = Path(p.run_dir).parent / "slurm"
        before = set(folder.iterdir()) if folder.is_dir() else set()
        try:
            return self.via.start(p, cmd, env)
        except launch.LaunchError:
            self.refused = p
            for left in set(folder.iterdir() if folder.is_dir() else ()) - before:
                if left.is_file() and left.name.startswith(".submission_file_"):  # submitit's sbatch script
                    left.unlink(missing_ok=True)
            if folder.is_dir() and not before and not any(folder.iterdir()):
                folder.rmdir()
            raise


def refusal_line(via, error: Exception) -> str:
    """The error's line; when ``via`` (a :class:`RefusalRecorder`) refused a point's submission, the point is
    recorded as refused in its sweep's manifest and the line says so."""
    refused = getattr(via, "refused", None)
    if refused is None:
        return str(error)
    record_refusal(Path(refused.run_dir).parent, refused.name, str(error))
    return f"{error}; manifest.json records {refused.name} as refused: run the same command again once fixed"
