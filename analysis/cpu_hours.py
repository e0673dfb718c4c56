"""What an experiment cost in CPU-hours, as its report prints it, and per resolved comparison.

Training: every run of the record (tuning, seeded, compute curve, fine-tuning and its tuning), its wall seconds
(its sweep manifest's ``elapsed_s``, else the run folder's own) times the torch threads each trainer ran with
(``--threads``, kept in the record as ``threads``). Measurements: the process CPU time (user + system) each cached
result took where it was computed (``analysis.measurements.base.cached`` stores it; a probe's result carries its
own), so a report regenerated from the caches counts the same hours. A comparison is resolved when its verdict is
better, worse or equivalent within the margin (``analysis.verdicts``), not unresolved.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from analysis.experiments import wall_seconds

RUN_LISTS = ("runs", "tune_runs", "ceg_runs", "finetune_runs", "finetune_tune_runs")  # the record's run records
UNDER = {"finetune_tune_runs": "finetune"}  # the fine-tuning's tuning sweep ("tune") lies under <out>/finetune/
UNRESOLVED = "unresolved"


def _manifest(folder: Path, cache: dict) -> dict[str, dict]:
    """{point name: manifest entry} of the sweep in ``folder`` (read once)."""
    if folder not in cache:
        path = folder / "manifest.json"
        points = json.loads(path.read_text()).get("points", []) if path.is_file() else []
        cache[folder] = {p["name"]: p for p in points}
    return cache[folder]


def training(record: dict) -> dict:
    """{cpu_s, runs, untimed, threads, threads_recorded}: every training run's wall seconds x its threads."""
    out = Path(record["spec"]["out"])
    threads = record.get("threads")
    per_run = int(threads) if threads else 1
    manifests: dict = {}
    seconds, runs, untimed = 0.0, 0, 0
    for key in RUN_LISTS:
        for r in record.get(key) or []:
            entry = _manifest(out / UNDER.get(key, "") / r["sweep"], manifests).get(r["point"], {})
            wall = wall_seconds({**entry, "run_dir": r["run_dir"]})
            runs += 1
            if wall is None:
                untimed += 1
            else:
                seconds += wall * per_run
    return {"cpu_s": seconds, "runs": runs, "untimed": untimed, "threads": per_run,
            "threads_recorded": threads is not None}


def measurements(record: dict) -> dict:
    """{cpu_s, results, untimed}: the CPU seconds the measurements' cached results took (``untimed``: results
    cached before their time was stored)."""
    folder = Path(record["spec"]["out"]) / "measurements"
    seconds, results, untimed = 0.0, 0, 0
    for path in sorted(folder.rglob("*.json")) if folder.is_dir() else []:
        try:
            stored = json.loads(path.read_text())
        except ValueError:
            continue
        if not (isinstance(stored, dict) and "settings" in stored and "result" in stored):
            continue  # not a cached result
        results += 1
        result = stored["result"]
        own = result.get("cpu_s") if isinstance(result, dict) else None  # a probe's result carries its own
        spent = stored.get("cpu_s", own)
        if isinstance(spent, (int, float)):
            seconds += float(spent)
        else:
            untimed += 1
    return {"cpu_s": seconds, "results": results, "untimed": untimed}


def resolved(comparison: Optional[dict]) -> tuple[int, int]:
    """(resolved, all) comparisons of the report's family (``analysis.ceg_report.compare``)."""
    classes = [a["verdict"]["class"] for a in ((comparison or {}).get("arms") or {}).values() if a.get("verdict")]
    return sum(c != UNRESOLVED for c in classes), len(classes)


def cpu_hours(record: dict, comparison: Optional[dict]) -> dict:
    """Training and measurement CPU-hours, their total, the comparisons resolved and the hours per resolved one."""
    train, meas = training(record), measurements(record)
    total = (train["cpu_s"] + meas["cpu_s"]) / 3600
    n_resolved, n_all = resolved(comparison)
    return {"total": total, "training": train["cpu_s"] / 3600, "measurements": meas["cpu_s"] / 3600,
            "training_runs": train["runs"], "untimed_runs": train["untimed"], "threads": train["threads"],
            "threads_recorded": train["threads_recorded"], "measurement_results": meas["results"],
            "untimed_results": meas["untimed"], "comparisons": n_all, "resolved": n_resolved,
            "per_resolved": total / n_resolved if n_resolved else None}


def text(c: dict) -> str:
    """The report's sentence on the CPU-hours and how they are counted."""
    threads = (f"{c['threads']} thread{'s' if c['threads'] > 1 else ''} per run (`--threads`)"
               if c["threads_recorded"] else "1 thread per run (threads not recorded: a lower bound)")
    n = c["untimed_runs"]
    untimed_runs = f"; {n} run{'s' if n != 1 else ''} without a recorded time not counted" if n else ""
    untimed = (f"; {c['untimed_results']} of {c['measurement_results']} results cached before their time was "
               "recorded, not counted" if c["untimed_results"] else "")
    if not c["comparisons"]:
        per = "No comparison was classified (no verdicts): no CPU-hours per resolved comparison."
    elif not c["resolved"]:
        per = f"None of the {c['comparisons']} comparisons is resolved: no CPU-hours per resolved comparison."
    else:
        per = (f"{c['resolved']} of {c['comparisons']} comparisons resolved (better, worse or equivalent within the "
               f"margin): {c['per_resolved']:.2f} CPU-hours per resolved comparison.")
    return (f"CPU cost: {c['total']:.2f} CPU-hours: training {c['training']:.2f} ({c['training_runs']} runs, each "
            f"run's wall time from its sweep manifest x {threads}{untimed_runs}), measurements "
            f"{c['measurements']:.2f} (process CPU time, user + system, of each cached result where it was "
            f"computed{untimed}). {per}")
