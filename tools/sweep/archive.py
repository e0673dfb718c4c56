"""``--archive`` / ``--restore``: a sweep's finished runs kept slim (``analysis.run_archive``) in a folder to commit,
and written back into a sweep folder."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

from analysis.run_archive import read_archive, slim_run, write_archive, write_run
from archlab.io import write_json_atomic
from archlab.train.run_folder import RUN_MARKER, SUMMARY
from tools.sweep.manifest import MANIFEST, check_consistent, read_manifest, run_state, write_manifest
from tools.sweep.plan import build_points, plan_point


def archivable(points: list[dict], done: set) -> list[str]:
    """The points worth keeping: every finished (or diverged) run, but a stable trunk only once all its branches
    are done too; without its checkpoints a restored trunk could not start the branches still to train."""
    children: dict[str, list[str]] = {}
    for q in points:
        if q.get("parent"):
            children.setdefault(q["parent"], []).append(q["name"])
    return [q["name"] for q in points if q["name"] in done
            and all(c in done for c in children.get(q["name"], []))]


def _legacy_runs(folder: Path) -> dict[str, Path]:
    """The run folders of an archive written by an earlier archlab (one plain folder per run)."""
    return {d.name: d for d in sorted(Path(folder).iterdir()) if (d / RUN_MARKER).is_file()} \
        if Path(folder).is_dir() else {}


def archived_state(files: dict[str, str]) -> str:
    """finished | diverged | not archived, from an archived run's summary (as :func:`run_dir_state` reads it)."""
    try:
        status = json.loads(files.get(SUMMARY, "")).get("status")
    except (ValueError, AttributeError):
        status = None
    return {"completed": "finished", "nonfinite": "diverged"}.get(status, "not archived")


def archive_sweep(spec: dict, dest: Path) -> tuple[int, int]:
    """Add the sweep's finished runs, slimmed (:func:`analysis.run_archive.slim_run`), to ``dest/runs.tar.xz``, an
    archive that ``analysis.scaling`` reads like the sweep folder and ``--restore`` brings back. Runs already in
    ``dest`` stay (those of an earlier archlab's plain run folders are packed and their folders removed); the
    manifest records every point the spec plans, its ``run_dir`` relative, with status ``finished``/``diverged``
    for the archived ones and ``not archived`` for the rest, and the wall times the sweep folder's manifest (or an
    earlier archive's) recorded. Returns (runs archived now, runs in the archive)."""
    out_dir = Path(spec.get("out") or "runs/sweep").resolve()
    if not out_dir.is_dir():
        raise ValueError(f"--archive: the sweep folder {out_dir} does not exist; run the sweep first")
    points = [plan_point(p, out_dir, 1, 8) for p in build_points(spec)]
    dest = Path(dest)
    recorded = {q["name"]: q for m in (read_manifest(dest), read_manifest(out_dir))  # the sweep folder's win
                for q in (m or {}).get("points", [])}
    done = {p.name for p in points if run_state(p) in ("finished", "diverged")}
    legacy = _legacy_runs(dest)
    runs = {**read_archive(dest), **{name: slim_run(d) for name, d in legacy.items()}}
    new = archivable([asdict(p) for p in points], done)
    runs.update({name: slim_run(out_dir / name) for name in new})
    write_archive(dest, runs)
    for d in legacy.values():  # now in the archive
        shutil.rmtree(d)
    kept = []
    for p in points:
        q = {**asdict(p), **{k: recorded[p.name].get(k) for k in ("returncode", "elapsed_s", "peak_rss_bytes")
                             if p.name in recorded}}
        kept.append({**q, "run_dir": p.name, "log": "", "status": archived_state(runs.get(p.name, {}))})
    write_json_atomic(dest / MANIFEST, {"kind": "archlab-sweep", "version": 1, "spec": spec, "points": kept},
                      sort_keys=False)
    return len(new), sum(q["status"] != "not archived" for q in kept)


def _without_paths(cooldown: dict) -> dict:
    """A point's cooldown settings less the trunk checkpoint's path (the archive was written elsewhere)."""
    return {k: v for k, v in cooldown.items() if k != "branch_from"}


def restore_sweep(spec: dict, src: Path) -> int:
    """Write the archived runs of ``src`` (written by :func:`archive_sweep`, or an earlier archlab's plain run
    folders) that the sweep folder lacks into it as run folders, with their recorded wall times, so that the sweep
    trains only the rest. The archive must hold the spec's
    points with the same settings; a spec narrowed to part of the archived one (``--grid train.seed=0``) restores
    its own points only. Returns the runs restored."""
    src = Path(src)
    archived = read_manifest(src)
    if archived is None:
        raise ValueError(f"--restore {src}: no {MANIFEST} there (an archive written by --archive)")
    out_dir = Path(spec.get("out") or "runs/sweep").resolve()
    points = [plan_point(p, out_dir, 1, 8) for p in build_points(spec)]
    by_name = {q["name"]: q for q in archived["points"]}
    if not set(by_name) & {p.name for p in points}:
        some = sorted(by_name)[:3]
        raise ValueError(f"--restore {src}: the archive holds none of the points this spec plans (it holds "
                         f"{', '.join(some)}{', ...' if len(by_name) > 3 else ''}): not its archive")
    for p in points:
        q = by_name.get(p.name)
        if q and (q["recipe"] != p.recipe or q["overrides"] != p.overrides or q["max_steps"] != p.max_steps
                  or _without_paths(q.get("cooldown", {})) != _without_paths(p.cooldown)):
            raise ValueError(f"--restore {src}: point {p.name} was archived with other settings "
                             "(recipe/overrides/steps/cooldown) than this spec's")
    check_consistent(out_dir, points)
    before = {q["name"]: q for q in (read_manifest(out_dir) or {}).get("points", [])}
    packed, legacy = read_archive(src), _legacy_runs(src)
    restored = 0
    for p in points:
        q = by_name.get(p.name)
        if q is None or q["status"] not in ("finished", "diverged") or Path(p.run_dir).exists():
            continue
        if p.name in legacy:
            shutil.copytree(legacy[p.name], p.run_dir)
        elif p.name in packed:
            write_run(packed[p.name], Path(p.run_dir))
        else:
            raise ValueError(f"--restore {src}: its manifest says {p.name} is archived, but neither its "
                             f"runs.tar.xz nor a run folder holds it")
        p.status, p.returncode, p.elapsed_s = q["status"], q.get("returncode"), q.get("elapsed_s")
        p.peak_rss_bytes = q.get("peak_rss_bytes")
        before.pop(p.name, None)
        restored += 1
    for p in points:  # keep what the sweep folder recorded of the points not restored
        if p.name in before:
            p.status, p.returncode = before[p.name].get("status", p.status), before[p.name].get("returncode")
            p.elapsed_s, p.peak_rss_bytes = before[p.name].get("elapsed_s"), before[p.name].get("peak_rss_bytes")
    out_dir.mkdir(parents=True, exist_ok=True)
    write_manifest(out_dir, spec, points)
    return restored
