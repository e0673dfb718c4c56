"""Running an experiment: the tuning stage, every arm x cell x seed as one ``tools.sweep`` sweep (resumable),
the time-matched arms after the runs that set their time, the compute curve, a sequential design's later
looks; each run a typed record in ``<out>/experiment.json``; then the measurements that need more than the
run folders."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from tqdm.auto import tqdm

from analysis.experiment_spec import Arm, Budget, Spec
from analysis.experiments import run_tokens_per_s, wall_seconds
from analysis.measurements import MEASUREMENTS
from archlab.config import RecipeError
from archlab.io import write_json_atomic
from tools import experiment_ceg, experiment_finetune, experiment_seeds, experiment_tuning, sweep
from tools.experiment import init_from, registration
from tools.experiment.arms import resolve_arms
from tools.experiment.load import WORDS

RECORD = "experiment.json"
Stopped = sweep.Stopped
planned_points = sweep.plan_points


def grid_of(spec: Spec) -> dict:
    """The sweep grid: the experiment's own grid, then the seeds (last: point names end -seed<s>)."""
    return {**(spec.grid or {}), "train.seed": list(spec.seeds)}


def sweep_spec(spec: Spec, arms: Sequence[Arm], folder: str, budgets: dict[str, Budget]) -> dict:
    """A ``tools.sweep`` spec: one ladder per arm (its overrides, its own budget), grid x seeds."""
    ladders = {}
    for arm in arms:
        b = budgets[arm.name]
        ladders[arm.name] = {"recipe": arm.recipe, "set": list(arm.overrides), b.kind: [float(b.value)]}
    return {"out": str(Path(spec.out) / folder), "ladders": ladders, "grid": grid_of(spec),
            "description": f"experiment {spec.name}"}


def match_time_budgets(spec: Spec, arms: Sequence[Arm], runs: list[dict],
                       bench: Optional[dict] = None) -> dict[str, dict]:
    """Token budgets of the time-matched arms: the mean training time of ``match_time_of``'s runs
    (tokens / tokens per second) times the tokens per second of ``speed_of``, rounded to 3
    significant digits (so reruns find the same point names). Tokens per second: from ``bench``
    (the interleaved benchmark, ``analysis.measurements.throughput``: both arms under the same load) when given,
    else the mean over an arm's runs of each run's median over its logged windows
    (``analysis.experiments.run_tokens_per_s``)."""
    def mean_of(arm: str, fn) -> float:
        vals = []
        for r in runs:
            if r["arm"] != arm:
                continue
            path = Path(r["run_dir"]) / "summary.json"
            s = json.loads(path.read_text()) if path.is_file() else {}
            speed = run_tokens_per_s(r["run_dir"]) if s.get("status") == "completed" else None
            if bench is not None and speed:
                speed = bench[arm]["tokens_per_s"]
            if speed:
                vals.append(fn(s["tokens"], speed))
        if not vals:
            raise RecipeError(f"match_time_of/speed_of: arm {arm!r} has no completed run with a measured tokens/s")
        return sum(vals) / len(vals)

    out = {}
    for arm in arms:
        seconds = mean_of(arm.budget.match_time_of, lambda tokens, speed: tokens / speed)
        speed = mean_of(arm.budget.speed_of, lambda tokens, speed: speed)
        out[arm.name] = {"tokens": float(f"{seconds * speed:.3g}"), "seconds": seconds, "tokens_per_s": speed,
                         "speeds_from": "throughput benchmark" if bench is not None else "the runs"}
    return out


# --------------------------------------------------------------------------------------------
# the record
# --------------------------------------------------------------------------------------------


def record_runs(spec: Spec, points: list[sweep.Point], folder: str) -> list[dict]:
    """Typed records of the seeded runs: arm (the point's ladder), seed and grid cell (the point's
    own grid values), role "seeded"."""
    out = []
    for p in points:
        cell = dict(p.cell)
        seed = int(cell.pop("train.seed"))
        out.append({"arm": p.ladder, "seed": seed, "cell": cell, "role": "seeded", "point": p.name, "sweep": folder,
                    "run_dir": p.run_dir, "max_steps": p.max_steps, "planned_tokens": p.planned_tokens,
                    "planned_flops": p.planned_flops})
    return out


def write_record(spec: Spec, arms: Sequence[Arm], runs: list[dict], extra: dict) -> Path:
    out = Path(spec.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"kind": "archlab-experiment", "version": 1, "spec": spec.to_dict(), "arms": [a.to_dict() for a in arms],
              "runs": runs, **extra}
    previous = json.loads((out / RECORD).read_text()) if (out / RECORD).is_file() else None
    record = registration.stamp(record, previous, registration.read(out))  # every run: the spec hash it ran under
    return write_json_atomic(out / RECORD, record, sort_keys=False)


def read_record(out: Path) -> dict:
    path = Path(out) / RECORD
    if not path.is_file():
        raise RecipeError(f"{path}: no experiment record; run `python -m tools.experiment run SPEC` first")
    return json.loads(path.read_text())


def with_current_words(record: dict, spec: Spec, arms: Sequence[Arm]) -> dict:
    """The record of the runs with the current spec's descriptive text: its title, description,
    claim, notes and the arms' labels and notes (what the runs are stays the record's)."""
    record["spec"]["spec_path"] = spec.spec_path
    record["spec"].update({k: getattr(spec, k) for k in WORDS if getattr(spec, k) is not None})
    words = {a.name: a for a in arms}
    for a in record["arms"]:
        if a["name"] in words:
            a["label"], a["note"] = words[a["name"]].label, words[a["name"]].note
    return record


# --------------------------------------------------------------------------------------------
# the stages
# --------------------------------------------------------------------------------------------


def run_experiment(spec: Spec, *, jobs: int = 1, threads: Optional[int] = None, log=print,
                   show_progress: bool = True, command: str = "", amend: Optional[str] = None) -> dict:
    """Train every arm x cell x seed (resumable), then the time-matched arms; returns the record. The spec is
    registered first (``tools.experiment.registration``: refused when its decision-relevant part changed after the
    seeded runs began, unless ``amend`` gives the reason)."""
    arms = resolve_arms(spec)
    registration.register(spec, amend, log=log)
    n_cells = len(sweep._grid_items(grid_of(spec)))
    t0 = time.time()
    arms, extra = tune_arms(spec, arms, jobs=jobs, threads=threads, log=log)
    fixed, later = init_from.split([a for a in arms if not a.timed])  # later: train.init_from=arm:<name>
    timed = [a for a in arms if a.timed]
    phase1 = sweep_spec(spec, fixed, "sweep", {a.name: a.budget for a in fixed})
    points = planned_points(phase1)
    bar = tqdm(total=len(arms) * n_cells, desc=f"{spec.name} runs", unit="run", disable=not show_progress,
               file=sys.stderr, dynamic_ncols=True)
    write = bar.write if show_progress else log
    bar.update(sum(sweep.is_done(p) for p in points))
    check_stopped(sweep.run_sweep(phase1, jobs=jobs, threads=threads, log=write, progress=lambda p: bar.update(1)))
    runs = record_runs(spec, points, "sweep")
    runs += init_from.run(spec, later, runs, {"sweep_spec": sweep_spec, "record_runs": record_runs,
                                              "check_stopped": check_stopped}, jobs=jobs, threads=threads, log=write)
    bar.update(len(later) * n_cells)
    timed_budgets = {}
    if timed:
        bench = None
        if "throughput" in spec.wanted:  # the speeds, side by side, before phase 2
            write_record(spec, arms, runs, {"threads": threads})
            bench = MEASUREMENTS["throughput"].run(read_record(Path(spec.out)), log=write)
        timed_budgets = match_time_budgets(spec, timed, runs, bench)
        phase2 = sweep_spec(spec, timed, "sweep-time", {n: Budget("tokens", b["tokens"])
                                                         for n, b in timed_budgets.items()})
        points2 = planned_points(phase2)
        bar.update(sum(sweep.is_done(p) for p in points2))
        check_stopped(sweep.run_sweep(phase2, jobs=jobs, threads=threads, log=write,
                                      progress=lambda p: bar.update(1)))
        runs += record_runs(spec, points2, "sweep-time")
    bar.close()
    if spec.ceg:  # the reference's compute curve, at its tuned lr
        ref = next(a for a in arms if a.name == spec.reference)
        extra["ceg_runs"] = experiment_ceg.run(spec, ref, [], jobs=jobs, threads=threads, log=log)
    if spec.sequential:  # more seeds for what is unresolved (tools.experiment_seeds)
        stage = {"sweep_spec": sweep_spec, "record_runs": record_runs, "read_record": read_record,
                 "check_stopped": check_stopped,
                 "write_record": lambda rs: write_record(spec, arms, rs, {**extra, "threads": threads})}
        runs = experiment_seeds.run_looks(spec, fixed, runs, stage, jobs=jobs, threads=threads, log=log)
    if spec.finetune:  # every arm's pre-trained runs fine-tuned (tools.experiment_finetune)
        extra.update(experiment_finetune.run(spec, arms, runs, extra, jobs=jobs, threads=threads, log=log,
                                             check_stopped=check_stopped))
    write_record(spec, arms, runs, {**extra, "timed_budgets": timed_budgets,
                                    "train_wall_s": round(time.time() - t0, 1), "command": command,
                                    "threads": threads})
    return read_record(Path(spec.out))


def tune_arms(spec: Spec, arms: Sequence[Arm], *, jobs: int = 1, threads: Optional[int] = None,
              log=print) -> tuple[list[Arm], dict]:
    """The tuning stage (``tools.experiment_tuning``) of the fixed-budget arms: every arm with its tuned lr
    appended to its overrides (time-matched arms take their parent's), and what the record keeps of it."""
    if not spec.tune.searched:
        return list(arms), {}
    tuned, recs = experiment_tuning.run(spec, [a for a in arms if not a.timed], jobs=jobs, threads=threads, log=log)
    lr_sets = experiment_tuning.tuned_overrides(arms, tuned)
    arms = [dataclasses.replace(a, overrides=[*a.overrides, *lr_sets[a.name]]) if a.name in lr_sets else a
            for a in arms]
    manifest = sweep.read_manifest(Path(spec.out) / experiment_tuning.FOLDER) or {}
    wall = {p["name"]: wall_seconds(p) or 0.0 for p in manifest.get("points", [])}  # per tuning run
    return arms, {"tuning": tuned, "tune_runs": recs, "tune_wall_s": wall}


def check_stopped(points: list[sweep.Point]) -> None:
    left = [p.name for p in points if p.status in ("pending", "running", "interrupted")]
    if left:
        raise Stopped(f"{len(left)} runs not finished ({', '.join(left[:3])}{', ...' if len(left) > 3 else ''}); "
                      "run the same command again to resume them")


def measure(record: dict, log=print, jobs: int = 1) -> dict:
    """{name: result} of the spec's measurements that compute something beyond the run folders
    (``Measurement.run``), each result cached as JSON under ``<out>/measurements/``; a measurement whose runs are
    independent (``parallel``) computes ``jobs`` at a time."""
    wanted = Spec.from_dict(record["spec"]).wanted
    results = {}
    for name, m in MEASUREMENTS.items():
        if name in wanted:
            result = m.run(record, log=log, jobs=jobs) if m.parallel else m.run(record, log=log)
            if result is not None:
                results[name] = result
    return results
