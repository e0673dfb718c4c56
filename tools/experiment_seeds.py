"""The sequential stage of an experiment: more seeds for the comparisons still unresolved, by the design of
``analysis.sequential`` (``seeds: {min: 3, max: 9, step: 2, spending: pocock}``).

The seeded runs train seeds 0..min-1 (``<out>/sweep/``) and the compute curve its trunks; then each look reads
every verdict of the family at that look's level; the arms of the comparisons still open train the next
``step`` seeds under ``<out>/sweep-look<k>/``; until nothing is open or ``max`` is reached. The decisions are
replayed from the finished runs, so the same command resumes an interrupted look and the report reads the
verdicts the runs stopped on.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Optional, Sequence

from analysis import ceg_report, sequential
from analysis.experiment_spec import Spec
from analysis.experiments import build_context
from archlab.config import RecipeError
from tools import sweep


def check(spec: dict, where: str) -> Optional[sequential.Design]:
    """The YAML's ``seeds:`` read as a design (None for a list): the first look trains seeds 0..min-1.
    Grids and time-matched arms keep a fixed list of seeds."""
    design = sequential.check(spec.get("seeds"), f"{where}: seeds")
    if design is None:
        return None
    if spec.get("grid"):
        raise RecipeError(f"{where}: seeds: {{min, max}} with grid: the grid's cells are not read as one family; "
                          f"give a list of seeds, e.g. seeds: {list(range(design.max))}")
    timed = [a.get("name") for a in spec.get("arms") or [] if "match_time_of" in (a.get("budget") or {})]
    if timed:
        raise RecipeError(f"{where}: seeds: {{min, max}} with time-matched arms ({', '.join(map(str, timed))}): "
                          "their budgets are set from the first seeds' runs; give a list of seeds")
    return design


def folder(look: int) -> str:
    return f"sweep-look{look}"


def run_looks(spec: Spec, arms: Sequence, runs: list[dict], stage: dict, *, jobs: int = 1,
              threads: Optional[int] = None, log=print) -> list[dict]:
    """Train the later looks (module docstring); returns the seeded runs of every look. ``stage``: the
    experiment's own steps, {sweep_spec, record_runs, write_record, read_record, check_stopped}."""
    sweep_spec, record_runs = stage["sweep_spec"], stage["record_runs"]
    design = spec.sequential
    out = Path(spec.out)
    by_name = {a.name: a for a in arms}
    for look in range(2, len(design.stages) + 1):
        stage["write_record"](runs)
        ctx = build_context(stage["read_record"](out), {}, out)
        results = [a["verdict"] for a in ceg_report.compare(ctx)["arms"].values() if a.get("verdict")]
        add = sequential.next_seeds(design, results)
        if not add:
            log(f"sequential: every comparison resolved after look {look - 1}")
            break
        seeds = sorted({s for v in add.values() for s in v})
        open_rows = [r for r in results if r["class"] == "unresolved"]
        log(f"sequential look {look}: {len(open_rows)} comparisons unresolved "
            f"({', '.join(r['arm'] + ' vs ' + r['against'] for r in open_rows)}); arms {', '.join(add)} train "
            f"seeds {seeds}")
        lspec = sweep_spec(replace(spec, seeds=seeds), [by_name[a] for a in add], folder(look),
                           {a: by_name[a].budget for a in add})
        points = sweep.plan_points(lspec)
        done = sweep.run_sweep(lspec, jobs=jobs, threads=threads, log=log)
        stage["check_stopped"](done)
        runs = runs + record_runs(replace(spec, seeds=seeds), points, folder(look))
    return runs


def plan(spec: Spec, arms: Sequence, sweep_spec, log=print) -> dict[str, list]:
    """The later looks' runs in the worst case (every comparison unresolved until ``max``): {stage: points}."""
    design = spec.sequential
    if design is None:
        return {}
    log(f"\n== sequential looks: {design.describe()}; a comparison stops at the first look that resolves it "
        "(better, worse or equivalent within the margin), its arms stop when all of theirs are")
    out = {}
    for look in range(2, len(design.stages) + 1):
        seeds = list(range(design.stages[look - 2], design.stages[look - 1]))
        lspec = sweep_spec(replace(spec, seeds=seeds), arms, folder(look), {a.name: a.budget for a in arms})
        pts = sweep.plan_points(lspec)
        log(f"- look {look}: seeds {seeds} for the arms still open (worst case all {len(arms)} arms: {len(pts)} runs)")
        out[f"seeded runs, look {look} (worst case)"] = pts
    return out
