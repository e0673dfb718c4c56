"""``archive`` / ``restore``: an experiment's finished runs kept slim in a folder to commit, and written back as run
folders in another checkout, so that a run continues there and trains only what is left.

    python -m tools.experiment archive experiments/model-types.yaml     # -> <report>/runs (or --dest)
    python -m tools.experiment restore experiments/model-types.yaml     # <report>/runs -> <out> (or --src)

The archive mirrors ``<out>``: each of its sweep folders (``tune/``, ``sweep/``, ``ceg/``, ``finetune/tune/``, ...,
any folder with a ``manifest.json``) as the manifest and a ``runs.tar.xz`` of its finished runs, slimmed as
``tools.sweep --archive`` slims them (``analysis.run_archive``: the records, no checkpoints) but with every
training row of ``metrics.jsonl`` (a run's tokens/s is read from them); the measurements'
caches (``<out>/measurements/``), ``experiment.json`` and ``registration.json`` (the spec's pre-registration) as
they are; ``archive.json`` names the ``<out>`` they
were written in. Restoring writes into ``<out>`` only what it lacks, with that folder's path replaced by the new
one in every file (run records, manifests, caches), so that the stages find their runs done.

A restored run has no checkpoint, so the archive leaves out the finished runs that a run still to train starts
from: a trunk whose branches are not all done, a pre-trained run before its fine-tuning (a seeded run until its
fine-tuned run is done; of an arm's lr grid, the best run so far until its fine-tuning lr is tuned, since that
tuning starts from the grid's best); they train again after a restore. So are the finished runs whose checkpoints a
measurement of the spec still has to score (its cache is missing: ``Measurement.checkpoints``, read from
``experiment.json``; without a record, every finished seeded and fine-tuned run when the spec names such a
measurement): archive after ``run`` has measured.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

from analysis.measurements import MEASUREMENTS as KINDS
from analysis.run_archive import read_archive, slim_run, write_archive, write_run
from archlab.io import write_json_atomic, write_text_atomic
from archlab.train.run_folder import METRICS
from tools.experiment.registration import FILE as REGISTRATION
from tools.experiment.stages.base import RECORD
from tools.experiment.stages.tuning import score
from tools.sweep.archive import archivable, archived_state
from tools.sweep.manifest import MANIFEST, read_manifest, run_dir_state

INDEX = "archive.json"
MEASUREMENTS = "measurements"


def _is_sweep_manifest(path: Path) -> bool:
    """A sweep's ``manifest.json`` (a checkpoint folder has a manifest of another kind)."""
    try:
        return json.loads(path.read_text()).get("kind") == "archlab-sweep"
    except (ValueError, AttributeError):
        return False


def _sweep_folders(out: Path) -> list[Path]:
    """Every sweep folder under ``out`` (a folder holding a sweep manifest), relative, in path order."""
    return sorted(p.parent.relative_to(out) for p in out.rglob(MANIFEST) if _is_sweep_manifest(p))


def _moved(text: str, old: str, new: str) -> str:
    return text.replace(old, new) if old != new else text


def _kept(run_dir: Path) -> dict[str, str]:
    """A run's files as the archive keeps them: ``slim_run``'s, but ``metrics.jsonl`` whole (the report reads every
    training row: a run's tokens/s is the median over its logged windows)."""
    files = slim_run(run_dir)
    if (run_dir / METRICS).is_file():
        files[METRICS] = (run_dir / METRICS).read_text()
    return files


def _starts_from(point: dict) -> list[str]:
    """The run folders a point starts from: its ``train.init_from`` (fine-tuning). A cooldown branch's trunk is kept
    back by ``tools.sweep.archive.archivable`` (from the points' ``parent``)."""
    return [o.split("=", 1)[1] for o in point.get("overrides", []) if o.startswith("train.init_from=")]


def _still_needed(out: Path, manifests: dict[Path, list[dict]], finetune: bool) -> set[str]:
    """The finished runs whose checkpoints a run still to train needs, which the archive leaves out (trained again
    after a restore): those an unfinished point starts from; and with a fine-tuning stage, every pre-training run
    before its fine-tuning: a seeded run until a finished fine-tuning run starts from it, and of an arm whose
    fine-tuning lr is not tuned yet its best tuning run so far (:func:`_best_tuning_runs`)."""
    done = {str(out / rel / q["name"]) for rel, points in manifests.items() for q in points
            if run_dir_state(out / rel / q["name"]) in ("finished", "diverged")}
    named_by_done, needed = set(), set()
    for rel, points in manifests.items():
        for q in points:
            (named_by_done if str(out / rel / q["name"]) in done else needed).update(_starts_from(q))
    if finetune:
        for rel, points in manifests.items():  # a seeded run: until its fine-tuned run is done
            if len(rel.parts) == 1 and rel.name.startswith("sweep"):
                needed.update(str(out / rel / q["name"]) for q in points
                              if str(out / rel / q["name"]) not in named_by_done)
        needed.update(_best_tuning_runs(out, manifests, done))
    return needed


def _to_measure(out: Path, manifests: dict[Path, list[dict]], wanted) -> set[str]:
    """The finished runs whose checkpoints a measurement the spec names (``wanted``) has not scored yet: those
    its ``checkpoints`` names without a cache file, from the record (``experiment.json``), which points at
    ``out``'s caches; and every finished run of a seeded or fine-tuning sweep folder the record does not list (it
    was written before they finished) when any of these measurements loads checkpoints."""
    scoring = [KINDS[n] for n in wanted if n in KINDS and KINDS[n].loads_checkpoints]
    if not scoring:
        return set()
    record = json.loads((out / RECORD).read_text()) if (out / RECORD).is_file() else {"runs": []}
    listed = {r["run_dir"] for r in record["runs"] + (record.get("finetune_runs") or [])}
    needed = set()
    if "spec" in record:
        record["spec"]["out"] = str(out)  # the caches beside the runs, wherever the record was written
        needed = {run_dir for m in scoring for run_dir, cache in m.checkpoints(record).items()
                  if not cache.is_file()}
    for rel, points in manifests.items():
        if (len(rel.parts) == 1 and rel.name.startswith("sweep")) or rel == Path("finetune/sweep"):
            needed.update(str(out / rel / q["name"]) for q in points if str(out / rel / q["name"]) not in listed
                          and run_dir_state(out / rel / q["name"]) == "finished")
    return needed


def _best_tuning_runs(out: Path, manifests: dict[Path, list[dict]], done: set[str]) -> set[str]:
    """Of each arm whose fine-tuning lr is not tuned yet, the finished pre-training tuning runs that may be where
    that tuning starts: the grid's best so far (``tools.experiment.stages.tuning.score``; every finished run when none
    learned). The grid's final best is one of them or a run still to train; the rest are archived."""
    arm_of = lambda q: q["ladder"].rsplit("-lr", 1)[0]  # noqa: E731  (tuning ladders: <arm>-lr<lr>)
    ft_tune = manifests.get(Path("finetune/tune"), [])
    tuned = {arm_of(q) for q in ft_tune} - {arm_of(q) for q in ft_tune
                                             if str(out / "finetune/tune" / q["name"]) not in done}
    scores: dict[str, dict[str, float]] = {}
    for q in manifests.get(Path("tune"), []):
        path = str(out / "tune" / q["name"])
        if path in done and arm_of(q) not in tuned:
            loss = score(path)
            scores.setdefault(arm_of(q), {})[path] = math.inf if loss is None else loss
    out_set = set()
    for runs in scores.values():
        best = min(runs.values())
        out_set.update(p for p, v in runs.items() if v == best)
    return out_set


def _points(folder: Path, archived: Path) -> list[dict]:
    """The sweep folder's manifest points, and a point for each finished run folder it no longer lists (a stage that
    extends a grid plans the whole grid again, each invocation its own): the entry an earlier archive kept of it,
    else one with its name, its ladder (the name less its budget) and its state."""
    points = list(read_manifest(folder).get("points", []))
    earlier = {q["name"]: q for q in (read_manifest(archived) or {}).get("points", [])}
    listed = {q["name"] for q in points}
    for d in sorted(p for p in folder.iterdir() if p.is_dir() and p.name not in listed):
        state = run_dir_state(d)
        if state in ("finished", "diverged"):
            points.append(earlier.get(d.name) or {"name": d.name, "ladder": d.name.rsplit("-", 1)[0],
                                                  "overrides": [], "run_dir": str(d), "status": state})
    return points


def archive_experiment(out: Path, dest: Path, finetune: bool = False, measurements=()) -> dict:
    """Write ``out``'s finished runs, manifests and measurement caches into ``dest`` (see the module), less the runs
    a run still to train starts from (:func:`_still_needed`; ``finetune``: the spec has a fine-tuning stage) or a
    measurement still has to score (:func:`_to_measure`; ``measurements``: the names the spec wants); runs already
    archived there stay. Returns the index written (``archive.json``)."""
    out, dest = Path(out).resolve(), Path(dest).resolve()
    if dest == out or out in dest.parents:
        raise ValueError(f"archive: the archive folder {dest} lies inside the runs folder {out}; give one outside "
                         "it (--dest)")
    if not out.is_dir() or not ((out / RECORD).is_file() or _sweep_folders(out)):
        raise ValueError(f"archive: {out} holds no experiment runs; run `python -m tools.experiment run SPEC` first")
    manifests = {rel: _points(out / rel, dest / rel) for rel in _sweep_folders(out)}
    needed = _still_needed(out, manifests, finetune) | _to_measure(out, manifests, measurements)
    folders = {}
    for rel, points in manifests.items():
        done = {q["name"] for q in points if run_dir_state(out / rel / q["name"]) in ("finished", "diverged")
                and str(out / rel / q["name"]) not in needed}
        runs = read_archive(dest / rel)
        runs.update({name: _kept(out / rel / name) for name in archivable(points, done)})
        write_archive(dest / rel, runs)
        write_json_atomic(dest / rel / MANIFEST, {**read_manifest(out / rel), "points": points}, sort_keys=False)
        folders[str(rel)] = {"runs": len(runs), "points": len(points), "left_out": sorted(
            Path(p).name for p in needed if Path(p).parent == out / rel and Path(p).name not in runs
            and run_dir_state(p) in ("finished", "diverged"))}
    caches = sorted(p.relative_to(out) for p in (out / MEASUREMENTS).rglob("*.json")) \
        if (out / MEASUREMENTS).is_dir() else []
    records = [Path(name) for name in (RECORD, REGISTRATION) if (out / name).is_file()]
    for rel in caches + records:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out / rel, dest / rel)
    index = {"kind": "archlab-experiment-archive", "version": 1, "out": str(out), "folders": folders,
             "files": [str(p) for p in caches + records]}
    write_json_atomic(dest / INDEX, index, sort_keys=False)
    return index


def read_index(src: Path) -> dict:
    path = Path(src) / INDEX
    if not path.is_file():
        raise ValueError(f"restore: {path} does not exist: not an experiment archive "
                         "(write one with `python -m tools.experiment archive SPEC`)")
    index = json.loads(path.read_text())
    if index.get("kind") != "archlab-experiment-archive":
        raise ValueError(f"restore: {path} is not an experiment archive")
    return index


def restore_experiment(src: Path, out: Path) -> dict[str, int]:
    """Write the archived runs, manifests and caches of ``src`` that ``out`` lacks into it, the archive's ``<out>``
    path replaced by ``out``'s. A manifest entry ``out`` already has wins unless its run folder is missing. Returns
    {folder: runs restored}."""
    src, out = Path(src), Path(out).resolve()
    index = read_index(src)
    old, new = index["out"], str(out)
    restored = {}
    for rel in index["folders"]:
        runs = read_archive(src / rel)
        n = 0
        for name, files in runs.items():
            if archived_state(files) == "not archived" or (out / rel / name).exists():
                continue
            write_run({f: _moved(text, old, new) for f, text in files.items()}, out / rel / name)
            n += 1
        archived = json.loads(_moved((src / rel / MANIFEST).read_text(), old, new))
        here = {q["name"]: q for q in (read_manifest(out / rel) or {}).get("points", [])}
        points = [here[q["name"]] if q["name"] in here and Path(here[q["name"]]["run_dir"]).exists() else
                  q if q["name"] in runs else {**q, "status": "not archived", "returncode": None, "elapsed_s": None}
                  for q in archived["points"]]
        points += [q for name, q in here.items() if name not in {p["name"] for p in points}]
        write_json_atomic(out / rel / MANIFEST, {**archived, "points": points}, sort_keys=False)
        restored[rel] = n
    for rel in index["files"]:
        if not (out / rel).exists():
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(out / rel, _moved((src / rel).read_text(), old, new))
    return restored
