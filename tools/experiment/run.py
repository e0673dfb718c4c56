"""Running an experiment: the spec registered, then its stages (``tools.experiment.stages.STAGES``: tuning, seeded
runs, compute curve, sequential looks, fine-tuning, measurements) in order over one shared context; each run a
typed record in ``<out>/experiment.json``, written once the training stages are done."""

from __future__ import annotations

import time
from typing import Optional, Sequence

from analysis.experiment_spec import WORDS, Arm, Spec
from tools import sweep
from tools.experiment import registration
from tools.experiment import stages as registry
from tools.experiment.arms import resolve_arms
from tools.experiment.stages import Context, Stage
from tools.experiment.stages.base import (  # noqa: F401  (the runner's names, for its callers)
    RECORD,
    Stopped,
    check_stopped,
    grid_of,
    read_record,
    record_runs,
    sweep_spec,
    write_record,
)
from tools.experiment.stages.measure import measure  # noqa: F401
from tools.experiment.stages.seeded import match_time_budgets  # noqa: F401

planned_points = sweep.plan_points


def run_experiment(spec: Spec, *, jobs: int = 1, threads: Optional[int] = None, log=print,
                   show_progress: bool = True, command: str = "", amend: Optional[str] = None,
                   stages: Optional[Sequence[Stage]] = None) -> Context:
    """Run every stage the spec wants, in the order of ``stages`` (default: the registry,
    ``tools.experiment.stages.STAGES``), resumable; the record is written when the last training stage is done,
    before the first stage that reads it (the measurements). Returns the context: ``.record``, ``.measurements``.
    The spec is registered first (``tools.experiment.registration``: refused when its decision-relevant part changed
    after the seeded runs began, unless ``amend`` gives the reason)."""
    ctx = Context(spec, resolve_arms(spec), jobs=jobs, threads=threads, log=log, show_progress=show_progress)
    registration.register(spec, amend, log=log)
    t0 = time.time()

    def close() -> dict:
        ctx.write_record(train_wall_s=round(time.time() - t0, 1), command=command)
        return ctx.read_record()

    for stage in registry.STAGES if stages is None else stages:
        if not stage.wanted(spec):
            continue
        if not stage.trains and ctx.record is None:
            ctx.record = close()
        stage.run(ctx)
    if ctx.record is None:
        ctx.record = close()
    return ctx


def finish_record(record: dict, spec: Spec, *, jobs: int = 1, log=print,
                  stages: Optional[Sequence[Stage]] = None) -> Context:
    """The stages that read a finished record (the measurements), run on ``record`` as ``report`` does: nothing
    trains."""
    ctx = Context(spec, [Arm.from_dict(a) for a in record["arms"]], jobs=jobs, log=log, record=record)
    for stage in registry.STAGES if stages is None else stages:
        if not stage.trains and stage.wanted(spec):
            stage.run(ctx)
    return ctx


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

