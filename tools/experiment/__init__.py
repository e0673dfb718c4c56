"""Experiments: named arms (a recipe + overrides) x seeds at one budget, trained by ``tools.sweep``,
measured, and reported with intervals.

One module per job: ``load`` (the YAML, checked once, into ``analysis.experiment_spec``'s typed spec),
``arms``, ``stages`` (one module per stage, run in the order of ``stages.STAGES``), ``run`` (the stages in order
over one context), ``plan``, ``status``, ``archive`` (the finished runs kept slim, and restored elsewhere),
``cli`` (its docstring, the spec's keys, is ``--help``).
"""


from __future__ import annotations

from analysis.experiment_spec import Arm, Budget, Spec
from tools.experiment.arms import resolve_arms
from tools.experiment.cli import main, regenerate_command
from tools.experiment.load import QUICK_BUDGET, QUICK_SET, QUICK_TUNE, load_spec
from tools.experiment.plan import plan
from tools.experiment.run import (
    RECORD,
    Stopped,
    finish_record,
    grid_of,
    match_time_budgets,
    measure,
    planned_points,
    read_record,
    run_experiment,
    sweep_spec,
    with_current_words,
    write_record,
)
from tools.experiment.stages import STAGES, Context, Stage

__all__ = ["Arm", "Budget", "Spec", "resolve_arms", "main", "regenerate_command", "QUICK_BUDGET", "QUICK_SET",
           "QUICK_TUNE", "load_spec", "plan", "RECORD", "Stopped", "grid_of", "match_time_budgets", "measure",
           "planned_points", "read_record", "run_experiment", "sweep_spec", "with_current_words", "write_record",
           "finish_record", "STAGES", "Context", "Stage"]
