"""What a stage of an experiment is (:class:`Stage`), the one object the stages share while they run
(:class:`Context`), and the pieces several stages use: a ``tools.sweep`` spec of arms x seeds, the typed records of
its runs, the stop when runs are left, and the record ``<out>/experiment.json``. Imports no stage."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Protocol, Sequence, runtime_checkable

from analysis.experiment_spec import Arm, Budget, Spec
from archlab.config import RecipeError
from archlab.io import write_json_atomic
from tools import sweep
from tools.experiment import registration

RECORD = "experiment.json"
Stopped = sweep.Stopped


@runtime_checkable
class Stage(Protocol):
    """One stage of an experiment, registered in :data:`tools.experiment.stages.STAGES` (run in that order).

    - :attr:`name`: what the plan and the logs call it.
    - :attr:`trains`: True for a stage that trains runs; False for one that reads the finished record (the
      measurements), which ``report`` runs again without training anything.
    - :meth:`wanted`: whether the spec asks for it; ``run`` skips a stage that is not wanted.
    - :meth:`plan`: print what it would train (``python -m tools.experiment plan``) and return
      ``{cost-table row: planned sweep points}``; called for every stage, wanted or not, so that a stage
      can say why it trains nothing.
    - :meth:`run`: do it, reading and adding to the :class:`Context` (resumable: finished runs are skipped).
    """

    name: str
    trains: bool

    def wanted(self, spec: Spec) -> bool: ...

    def plan(self, spec: Spec, arms: Sequence[Arm], log: Callable) -> dict[str, list]: ...

    def run(self, ctx: Context) -> None: ...


@dataclass
class Context:
    """What the stages of one invocation share: the spec, the arms (tuned once the tuning stage has run), the run
    records so far, what the record keeps beside them (``extra``), and, once the training stages are done, the
    record itself and the measurements' results."""

    spec: Spec
    arms: list[Arm]
    jobs: int = 1
    threads: Optional[int] = None
    log: Callable = print
    show_progress: bool = True
    runs: list[dict] = field(default_factory=list)  # the seeded runs (role "seeded"), every look's
    extra: dict = field(default_factory=dict)  # tuning, ceg_runs, finetune_runs, timed_budgets, ...
    record: Optional[dict] = None  # experiment.json as written after the training stages
    measurements: dict[str, Any] = field(default_factory=dict)

    @property
    def out(self) -> Path:
        return Path(self.spec.out)

    def arm(self, name: str) -> Arm:
        return next(a for a in self.arms if a.name == name)

    def write_record(self, **more) -> Path:
        """Write ``experiment.json`` with the runs and extras so far (and ``more``)."""
        return write_record(self.spec, self.arms, self.runs, {**self.extra, "threads": self.threads, **more})

    def read_record(self) -> dict:
        return read_record(self.out)


# --------------------------------------------------------------------------------------------
# sweeps of arms x seeds
# --------------------------------------------------------------------------------------------


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


def check_stopped(points: list[sweep.Point]) -> None:
    """Stop the experiment (``Stopped``) when any of ``points`` is not finished."""
    left = [p.name for p in points if p.status in ("pending", "running", "interrupted")]
    if left:
        raise Stopped(f"{len(left)} runs not finished ({', '.join(left[:3])}{', ...' if len(left) > 3 else ''}); "
                      "run the same command again to resume them")


# --------------------------------------------------------------------------------------------
# the record
# --------------------------------------------------------------------------------------------


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
