"""The seeded runs of an experiment: every arm x grid cell x seed at the arm's (tuned) lr as one ``tools.sweep``
sweep under ``<out>/sweep/`` (resumable: a finished run is skipped, a started one continues from its checkpoint);
then the arms that start from another arm's runs (``stages.init_from``, ``<out>/sweep-init/``); then the arms whose
budget is a wall-clock time (``match_time_of``), under ``<out>/sweep-time/``, once the runs that set their time are
done (their speeds: the throughput benchmark if the spec measures it, else the runs' own)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional, Sequence

from tqdm.auto import tqdm

from analysis.experiment_spec import Arm, Budget, Spec
from analysis.experiments import run_tokens_per_s
from analysis.measurements import MEASUREMENTS
from archlab.config import RecipeError
from tools import sweep
from tools.experiment.stages import init_from
from tools.experiment.stages.base import Context, check_stopped, grid_of, record_runs, sweep_spec

FOLDER, TIMED_FOLDER = "sweep", "sweep-time"


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


class SeededRuns:
    """The stage (module docstring); its runs are ``ctx.runs``, the time-matched budgets ``timed_budgets``."""

    name = "seeded runs"
    trains = True

    def wanted(self, spec: Spec) -> bool:
        return True

    def plan(self, spec: Spec, arms, log=print) -> dict[str, list]:
        fixed = [a for a in arms if not a.timed]
        log("\n== stage 2: seeded runs" + (" (at each arm's tuned lr)" if spec.tune.searched else ""))
        sspec = sweep_spec(spec, fixed, FOLDER, {a.name: a.budget for a in fixed})
        # listed without the tuned lrs (chosen by stage 1): not compared with seeded runs already trained at them
        sweep.run_sweep(sspec, dry_run=True, log=log, check=not spec.tune.searched)
        if len(fixed) < len(arms):
            log("time-matched arms (" + ", ".join(a.name for a in arms if a.timed) + "): their token budgets are "
                "set once the runs they match are finished (not in the estimate)")
        return {"seeded runs": sweep.plan_points(sspec)}

    def run(self, ctx: Context) -> None:
        spec = ctx.spec
        fixed, later = init_from.split([a for a in ctx.arms if not a.timed])  # later: train.init_from=arm:<name>
        timed = [a for a in ctx.arms if a.timed]
        n_cells = len(sweep._grid_items(grid_of(spec)))
        phase1 = sweep_spec(spec, fixed, FOLDER, {a.name: a.budget for a in fixed})
        points = sweep.plan_points(phase1)
        bar = tqdm(total=len(ctx.arms) * n_cells, desc=f"{spec.name} runs", unit="run",
                   disable=not ctx.show_progress, file=sys.stderr, dynamic_ncols=True)
        write = bar.write if ctx.show_progress else ctx.log
        bar.update(sum(sweep.is_done(p) for p in points))
        check_stopped(sweep.run_sweep(phase1, jobs=ctx.jobs, threads=ctx.threads, log=write,
                                      progress=lambda p: bar.update(1)))
        ctx.runs = record_runs(spec, points, FOLDER)
        ctx.runs += init_from.run(spec, later, ctx.runs, jobs=ctx.jobs, threads=ctx.threads, log=write)
        bar.update(len(later) * n_cells)
        ctx.extra["timed_budgets"] = {}
        if timed:
            bench = None
            if "throughput" in spec.wanted:  # the speeds, side by side, before the time-matched runs
                ctx.write_record()
                bench = MEASUREMENTS["throughput"].run(ctx.read_record(), log=write)
            budgets = match_time_budgets(spec, timed, ctx.runs, bench)
            ctx.extra["timed_budgets"] = budgets
            phase2 = sweep_spec(spec, timed, TIMED_FOLDER, {n: Budget("tokens", b["tokens"])
                                                             for n, b in budgets.items()})
            points2 = sweep.plan_points(phase2)
            bar.update(sum(sweep.is_done(p) for p in points2))
            check_stopped(sweep.run_sweep(phase2, jobs=ctx.jobs, threads=ctx.threads, log=write,
                                          progress=lambda p: bar.update(1)))
            ctx.runs += record_runs(spec, points2, TIMED_FOLDER)
        bar.close()


STAGE = SeededRuns()
