"""``archive`` / ``restore``: an experiment's finished runs kept slim in a folder to commit, and written back as run
folders in another checkout, so that a run continues there and trains only what is left.

    python -m tools.experiment archive experiments/model-types.yaml     # -> <report>/runs (or --dest)
    python -m tools.experiment restore experiments/model-types.yaml     # <report>/runs -> <out> (or --src)

The archive mirrors ``<out>``: each of its sweep folders (``tune/``, ``sweep/``, ``ceg/``, ``finetune/tune/``, ...,
any folder with a ``manifest.json``) as the manifest and a ``runs.tar.xz`` of its finished runs, slimmed as
``tools.sweep --archive`` slims them (``analysis.run_archive``: the records, no checkpoints) but with every
training row of ``metrics.jsonl`` (a run's tokens/s is read from them); the measurements'
caches (``<out>/measurements/``) and ``experiment.json`` as they are; ``archive.json`` names the ``<out>`` they
were written in. Restoring writes into ``<out>`` only what it lacks, with that folder's path replaced by the new
one in every file (run records, manifests, caches), so that the stages find their runs done.

A restored run has no checkpoint: a stage that starts from a run (fine-tuning from a pre-trained run, a compute
curve's branch from its trunk) must have trained before the archive was written, or it is refused when it starts
(``train.init_from`` names a run without a checkpoint). A trunk whose branches are not all done is left out.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from analysis.run_archive import read_archive, slim_run, write_archive, write_run
from archlab.io import write_json_atomic, write_text_atomic
from archlab.train.run_folder import METRICS
from tools.experiment.run import RECORD
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


def archive_experiment(out: Path, dest: Path) -> dict:
    """Write ``out``'s finished runs, manifests and measurement caches into ``dest`` (see the module); runs already
    archived there stay. Returns the index written (``archive.json``)."""
    out, dest = Path(out).resolve(), Path(dest).resolve()
    if dest == out or out in dest.parents:
        raise ValueError(f"archive: the archive folder {dest} lies inside the runs folder {out}; give one outside "
                         "it (--dest)")
    if not out.is_dir() or not ((out / RECORD).is_file() or _sweep_folders(out)):
        raise ValueError(f"archive: {out} holds no experiment runs; run `python -m tools.experiment run SPEC` first")
    folders = {}
    for rel in _sweep_folders(out):
        manifest = read_manifest(out / rel)
        points = manifest.get("points", [])
        done = {q["name"] for q in points if run_dir_state(out / rel / q["name"]) in ("finished", "diverged")}
        runs = read_archive(dest / rel)
        runs.update({name: _kept(out / rel / name) for name in archivable(points, done)})
        write_archive(dest / rel, runs)
        write_json_atomic(dest / rel / MANIFEST, manifest, sort_keys=False)
        folders[str(rel)] = {"runs": len(runs), "points": len(points)}
    caches = sorted(p.relative_to(out) for p in (out / MEASUREMENTS).rglob("*.json")) \
        if (out / MEASUREMENTS).is_dir() else []
    for rel in caches + ([Path(RECORD)] if (out / RECORD).is_file() else []):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out / rel, dest / rel)
    index = {"kind": "archlab-experiment-archive", "version": 1, "out": str(out), "folders": folders,
             "files": [str(p) for p in caches] + ([RECORD] if (out / RECORD).is_file() else [])}
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
        points = [here[q["name"]] if q["name"] in here and Path(here[q["name"]]["run_dir"]).exists() else q
                  for q in archived["points"]]
        points += [q for name, q in here.items() if name not in {p["name"] for p in points}]
        write_json_atomic(out / rel / MANIFEST, {**archived, "points": points}, sort_keys=False)
        restored[rel] = n
    for rel in index["files"]:
        if not (out / rel).exists():
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(out / rel, _moved((src / rel).read_text(), old, new))
    return restored
