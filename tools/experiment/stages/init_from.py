"""Arms that start from another arm's runs (part of the seeded runs' stage, ``stages.seeded``): an arm whose
overrides say ``train.init_from=arm:<name>`` trains, for each seed s, from ``<name>``'s seeded run of seed s
(continued training, sparse upcycling), after those runs.

Spec: ``set: [train.init_from=arm:dense-pre, train.upcycle.method=copy]`` on the arm. The arm named must be a
fixed-budget arm without such a reference itself. Its runs go under ``<out>/sweep-init/seed<s>/`` (one sweep per
seed: each seed's runs read their own trunk), recorded like the seeded runs (role ``seeded``)."""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

from analysis.experiment_spec import Arm, Spec
from archlab.config import RecipeError
from tools import sweep
from tools.experiment.stages.base import check_stopped, record_runs, sweep_spec

PREFIX = "train.init_from=arm:"
FOLDER = "sweep-init"


def source_of(arm: Arm) -> Optional[str]:
    """The arm whose runs ``arm`` starts from (``train.init_from=arm:<name>``), or None."""
    refs = [o[len(PREFIX):].strip() for o in arm.overrides if o.startswith(PREFIX)]
    return refs[-1] if refs else None


def split(arms: Sequence[Arm]) -> tuple[list[Arm], list[Arm]]:
    """(arms that train first, arms that start from their runs), each reference checked."""
    names = {a.name: a for a in arms}
    later = [a for a in arms if source_of(a) is not None]
    for a in later:
        src = source_of(a)
        if src not in names or source_of(names[src]) is not None or names[src].timed:
            raise RecipeError(f"arm {a.name}: train.init_from=arm:{src} must name a fixed-budget arm that starts "
                              f"from scratch (arms: {', '.join(names)})")
        if a.timed:
            raise RecipeError(f"arm {a.name}: an arm that starts from arm:{src} needs a tokens or flops budget")
    return [a for a in arms if a not in later], later


def with_source(arm: Arm, run_dir: str) -> Arm:
    """``arm`` with its ``arm:<name>`` reference replaced by the run folder of that arm's run."""
    overrides = [f"train.init_from={run_dir}" if o.startswith(PREFIX) else o for o in arm.overrides]
    return dataclasses.replace(arm, overrides=overrides)


def seed_spec(spec: Spec, arms: Sequence[Arm], seed: int, trunks: dict[tuple[str, int], str]) -> dict:
    """The ``tools.sweep`` spec of one seed's dependent runs."""
    resolved = [with_source(a, trunks[(source_of(a), seed)]) for a in arms]
    one = dataclasses.replace(spec, seeds=[seed])
    return sweep_spec(one, resolved, f"{FOLDER}/seed{seed}", {a.name: a.budget for a in arms})


def run(spec: Spec, arms: Sequence[Arm], runs: Sequence[dict], *, jobs: int = 1, threads: Optional[int] = None,
        log=print) -> list[dict]:
    """Train the dependent arms seed by seed (resumable); returns their records."""
    if not arms:
        return []
    trunks = {(r["arm"], int(r["seed"])): r["run_dir"] for r in runs if r.get("role", "seeded") == "seeded"}
    out = []
    for seed in spec.seeds:
        sspec = seed_spec(spec, arms, seed, trunks)
        points = sweep.plan_points(sspec)
        check_stopped(sweep.run_sweep(sspec, jobs=jobs, threads=threads, log=log))
        out += record_runs(spec, points, f"{FOLDER}/seed{seed}")
    return out
