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
from typing import Optional, Sequence

from analysis import ceg_report, sequential
from analysis.experiment_spec import Spec
from analysis.experiments import build_context
from archlab.config import RecipeError
from tools import sweep
from tools.experiment.stages import init_from
from tools.experiment.stages.base import Context, check_stopped, record_runs, sweep_spec


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


def run_looks(ctx: Context, arms: Sequence) -> None:
    """Train the later looks of ``arms`` (module docstring), writing the record before each look reads its
    verdicts; each look's runs join ``ctx.runs``."""
    spec, log = ctx.spec, ctx.log
    design = spec.sequential
    by_name = {a.name: a for a in arms}
    for look in range(2, len(design.stages) + 1):
        ctx.write_record()
        vctx = build_context(ctx.read_record(), {}, ctx.out)
        results = [a["verdict"] for a in ceg_report.compare(vctx)["arms"].values() if a.get("verdict")]
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
        check_stopped(sweep.run_sweep(lspec, jobs=ctx.jobs, threads=ctx.threads, log=log))
        ctx.runs = ctx.runs + record_runs(replace(spec, seeds=seeds), points, folder(look))


def plan(spec: Spec, arms: Sequence, log=print) -> dict[str, list]:
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


class Looks:
    """The stage: a sequential design's later looks, after the compute curve that the verdicts read."""

    name = "sequential looks"
    trains = True

    def wanted(self, spec: Spec) -> bool:
        return spec.sequential is not None

    def plan(self, spec: Spec, arms, log=print) -> dict[str, list]:
        return plan(spec, [a for a in arms if not a.timed], log=log)

    def run(self, ctx: Context) -> None:
        fixed, _ = init_from.split([a for a in ctx.arms if not a.timed])  # an arm trained from another's runs
        run_looks(ctx, fixed)                                              # gets no more seeds


STAGE = Looks()
