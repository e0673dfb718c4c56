"""The measurements of an experiment: what its spec's ``measurements:`` compute beyond the run folders
(``analysis.measurements``: evaluation at longer contexts, gradient norms at initialisation, the throughput
benchmark, ...), after the training stages, each result cached under ``<out>/measurements/``. ``report`` runs this
stage again on the finished record: cached results are read, missing ones computed."""

from __future__ import annotations

import time

from analysis.experiment_spec import Spec
from analysis.measurements import MEASUREMENTS
from tools.experiment.stages.base import Context


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


class Measurements:
    """The stage: ``ctx.measurements`` from the finished record; ``measure_wall_s``: this invocation's time."""

    name = "measurements"
    trains = False

    def wanted(self, spec: Spec) -> bool:
        return True  # a spec without measurements: nothing to compute, the time is still recorded (0 s)

    def plan(self, spec: Spec, arms, log=print) -> dict[str, list]:
        return {}  # computed in this process after training: not runs of the plan's cost table

    def run(self, ctx: Context) -> None:
        t0 = time.time()
        ctx.measurements = measure(ctx.record, log=ctx.log, jobs=ctx.jobs)
        ctx.record["measure_wall_s"] = round(time.time() - t0, 1)


STAGE = Measurements()
