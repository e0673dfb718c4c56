"""The fine-tuning stage of an experiment: every arm's pre-trained run of each seed fine-tuned on a labelled task,
each arm at its own lr, so that pre-trained models of different objectives are compared on one downstream task.

Spec key (``tools.experiment``)::

    finetune:
      set: [train.objective=classify, train.objective.train_examples=8192]  # overrides after the arm's own
      budget: {tokens: 6.0e5}                   # what each fine-tuning run trains
      tune: {lr: [3.0e-4, 1.0e-3, 3.0e-3]}      # as tune: (stages.tuning); seed: the spec's tune seed
      tasks: [tag, span_qa, bound]              # optional: each arm once per objective (set then names none)
      controls: true                            # optional, with tasks: each base arm from a fresh init per task

Runs (after the seeded pre-training runs, under ``<out>/finetune/``):

- tuning (``<out>/finetune/tune/``): per arm a log grid of lrs (extended until the best is interior, as the
  pre-training tune), each run fine-tuning the arm's pre-training *tuning* run at its best grid lr (seed
  ``tune.seed``, not one of the reported seeds; the arm's first seeded run when the pre-training lr was not
  searched), scored on the fine-tuning validation loss; the lr is chosen by ``analysis.lr_choice`` as there;
- the fine-tuning runs (``<out>/finetune/sweep/``): per arm and seed s, ``train.init_from`` = the arm's
  pre-trained run of seed s, ``train.seed`` = s, the arm's tuned fine-tuning lr.

Every run starts from the arm's recipe and overrides (its tuned pre-training lr included; the fine-tuning lr
comes later and wins), then ``finetune.set``. The record keeps them as ``finetune_runs`` (role ``finetune``),
``finetune_tune_runs`` and ``finetune_tuning``; ``analysis.measurements.finetune`` scores them on the test split.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, Optional, Sequence

from analysis.experiment_spec import Arm, Finetune, Spec, Tune
from archlab.config import RecipeError
from tools import sweep
from tools.experiment.stages import tuning
from tools.experiment.stages.base import Context, check_stopped, record_runs
from tools.experiment.stages.base import sweep_spec as seeded_sweep_spec

KEYS = ("set", "budget", "tune")
OPTIONAL = ("tasks", "controls")  # several objectives, each fine-tuned on its own; fresh-init controls
FOLDER = "finetune"
RESERVED = ("train.init_from", "train.seed", "train.lr")  # set by the stage per run


def check(value, tune: Optional[Tune], seeds: Sequence[int], check_budget: Callable,
          where: str = "finetune") -> Optional[Finetune]:
    """The spec's ``finetune:`` mapping, checked (None: no fine-tuning). ``check_budget(value, where)``: the
    loader's reading of a budget."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise RecipeError(f"{where}={value!r}: expected a mapping {{set: [...], budget: {{tokens: T}}, tune: "
                          "{lr: [...]}}")
    unknown = sorted(set(value) - set(KEYS) - set(OPTIONAL))
    missing = [k for k in KEYS if k not in value]
    if unknown or missing:
        raise RecipeError(f"{where}: unknown keys {unknown}, missing {missing}; give exactly {', '.join(KEYS)}")
    overrides = sweep._as_override_list(value["set"], f"{where}.set")
    keys = [o.split("=", 1)[0].strip() for o in overrides]
    tasks = value.get("tasks") or []
    if not (isinstance(tasks, list) and all(isinstance(t, str) and t for t in tasks) and len(set(tasks)) == len(tasks)):
        raise RecipeError(f"{where}.tasks={tasks!r}: a list of distinct objectives, e.g. [tag, span_qa, bound]")
    if not isinstance(value.get("controls", False), bool) or (value.get("controls") and not tasks):
        raise RecipeError(f"{where}.controls={value.get('controls')!r}: true or false, and only with tasks:")
    if any(k in ("train.objective", "train.objective.type") for k in keys) == bool(tasks):
        raise RecipeError(f"{where}.set: name the fine-tuning objective (e.g. train.objective=classify), or give "
                          "tasks: [..] and no train.objective in set")
    taken = sorted(set(keys) & set(RESERVED))
    if taken:
        raise RecipeError(f"{where}.set: {taken} are set per run by the stage (the pre-trained run, its seed, the "
                          "tuned lr)")
    budget = check_budget(value["budget"], f"{where}.budget")
    if budget.timed:
        raise RecipeError(f"{where}.budget: a tokens or flops budget")
    raw_tune = value["tune"]
    if isinstance(raw_tune, dict) and "shared" not in raw_tune and "seed" not in raw_tune and tune is not None \
            and tune.searched:
        raw_tune = {**raw_tune, "seed": tune.seed}  # the pre-training tune's seed: its runs are the ones tuned from
    ft_tune = tuning.check(raw_tune, seeds, f"{where}.tune")
    if ft_tune is None or ft_tune.mup:
        raise RecipeError(f"{where}.tune: a grid {{lr: [...]}} or {{shared: <why>}} (no muP transfer)")
    return Finetune(set=overrides, budget=budget, tune=ft_tune, tasks=list(tasks),
                    controls=bool(value.get("controls", False)))


def ft_arm(arm: Arm, ft: Finetune, init_from: str) -> Arm:
    """The arm fine-tuned from ``init_from``: its overrides, then ``finetune.set`` and the pre-trained run."""
    return dataclasses.replace(arm, overrides=[*arm.overrides, *ft.set, f"train.init_from={init_from}"],
                               budget=ft.budget)


def stage_spec(spec: Spec) -> Spec:
    """The spec the tuning machinery reads for the fine-tuning: its tune, its folder."""
    return dataclasses.replace(spec, tune=spec.finetune.tune, out=str(Path(spec.out) / FOLDER))


def tuning_inits(arms: Sequence[Arm], pre_tuning: dict, pre_tune_runs: Sequence[dict],
                 seeded: dict[tuple[str, int], str], first_seed: int) -> dict[str, str]:
    """{arm: the pre-trained run its fine-tuning lr is tuned from}: the arm's pre-training tuning run at its best
    grid lr (seed ``tune.seed``), else (not searched, or time-matched) its seeded run of ``first_seed``."""
    out = {}
    for a in arms:
        best = (pre_tuning.get(a.name) or {}).get("grid_lr")
        runs = [r["run_dir"] for r in pre_tune_runs if r["arm"] == a.name and best is not None
                and abs(r["lr"] - best) <= 1e-9 * best]
        out[a.name] = runs[0] if runs else seeded[(a.name, first_seed)]
    return out


def sweep_spec(spec: Spec, arms: Sequence[Arm], lrs: dict[str, Optional[float]],
               seeded: dict[tuple[str, int], str]) -> dict:
    """A ``tools.sweep`` spec of the fine-tuning runs: one ladder per arm and seed (its own ``init_from``)."""
    ft = spec.finetune
    ladders = {}
    for a in arms:
        for s in spec.seeds:
            lr = [f"train.lr={tuning._lr_text(lrs[a.name])}"] if lrs.get(a.name) else []
            ladders[f"{a.name}-s{s}"] = {"recipe": a.recipe, ft.budget.kind: [float(ft.budget.value)],
                                         "set": [*ft_arm(a, ft, seeded[(a.name, s)]).overrides, *lr,
                                                 f"train.seed={s}"]}
    return {"out": str(Path(spec.out) / FOLDER / "sweep"), "ladders": ladders,
            "description": f"fine-tuning of {spec.name}"}


def records(sspec: dict, points: Sequence[sweep.Point], arms: Sequence[Arm], seeds: Sequence[int],
            lrs: dict, seeded: dict) -> list[dict]:
    """Typed records of the fine-tuning runs (arm, seed, lr, role finetune, the pre-trained run)."""
    owner = {f"{a.name}-s{s}": (a.name, s) for a in arms for s in seeds}
    out = []
    for p in points:
        arm, seed = owner[p.ladder]
        out.append({"arm": arm, "seed": seed, "cell": {}, "lr": lrs.get(arm), "role": "finetune", "point": p.name,
                    "sweep": f"{FOLDER}/sweep", "run_dir": p.run_dir, "init_from": seeded[(arm, seed)],
                    "max_steps": p.max_steps, "planned_tokens": p.planned_tokens, "planned_flops": p.planned_flops})
    return out


def seeded_runs(runs: Sequence[dict]) -> dict[tuple[str, int], str]:
    """{(arm, seed): run folder} of the seeded pre-training runs."""
    return {(r["arm"], int(r["seed"])): r["run_dir"] for r in runs if r.get("role", "seeded") == "seeded"}


def run(spec: Spec, arms: Sequence[Arm], runs: Sequence[dict], extra: dict, *, jobs: int = 1,
        threads: Optional[int] = None, log=print) -> dict:
    """Tune and train the fine-tuning runs (resumable); returns what the record keeps of them."""
    ft = spec.finetune
    arms, seeded, meta = ft.expand(list(arms), seeded_runs(runs), spec.budgets)  # per task; the controls
    inits = tuning_inits(arms, extra.get("tuning") or {}, extra.get("tune_runs") or [], seeded, spec.seeds[0])
    tuned, recs = {}, []
    if ft.tune.searched:
        tuned, recs = tuning.search(stage_spec(spec), [ft_arm(a, ft, inits[a.name]) for a in arms],
                                               jobs=jobs, threads=threads, log=log)
    lrs = {a.name: (tuned.get(a.name) or {}).get("lr") for a in arms}
    sspec = sweep_spec(spec, arms, lrs, seeded)
    points = sweep.plan_points(sspec)
    check_stopped(sweep.run_sweep(sspec, jobs=jobs, threads=threads, log=log))
    return {"finetune_tuning": tuned, "finetune_tune_runs": recs, "finetune_tune_inits": inits,
            "finetune_runs": [{**r, **meta[r["arm"]]} for r in records(sspec, points, arms, spec.seeds, lrs, seeded)]}


def plan(spec: Spec, arms: Sequence[Arm], seeded: dict[tuple[str, int], str], log=print) -> dict[str, list]:
    """Print the fine-tuning stage (its tuning from the starting grid, its runs) and return {stage: points}.
    ``seeded``: the pre-training runs' planned folders. The tuning runs fine-tune the pre-training tuning run at
    the best grid lr, known only after stage 1: planned here from the seeded run of the first seed (same cost)."""
    ft = spec.finetune
    if ft is None:
        return {}
    arms, seeded, _ = ft.expand(list(arms), seeded, spec.budgets)  # per task; the controls
    log(f"\n== fine-tuning ({FOLDER}/): every arm's pre-trained run of each seed, {' '.join(ft.set)}, budget "
        f"{ft.budget.to_dict()}")
    out = {}
    if ft.tune.searched:
        log(f"fine-tuning lr: {len(arms)} arms x {len(ft.tune.lr)} lrs {ft.tune.lr}, seed {ft.tune.seed}, from each "
            "arm's pre-training tuning run at its best grid lr; up to "
            f"{ft.tune.max_extend} more lrs per side when the best is at an edge")
        inits = {a.name: seeded[(a.name, spec.seeds[0])] for a in arms}
        tspec = tuning.sweep_spec(stage_spec(spec), [ft_arm(a, ft, inits[a.name]) for a in arms],
                                             {a.name: list(ft.tune.lr) for a in arms})
        out["fine-tuning: tuning (starting grid)"] = sweep.plan_points(tspec)
    else:
        log(f"fine-tuning lr: none tuned by design: {ft.tune.shared}")
    sspec = sweep_spec(spec, arms, {}, seeded)
    log(f"fine-tuning runs: {len(arms)} arms x seeds {list(spec.seeds)}, each at its arm's tuned lr, from:")
    for a in arms:
        log(f"- {a.name}: " + ", ".join(f"s{s} <- {seeded[(a.name, s)]}" for s in spec.seeds))
    sweep.run_sweep(sspec, dry_run=True, log=log, check=False)
    out["fine-tuning runs"] = sweep.plan_points(sspec)
    return out


class Finetuning:
    """The stage: every arm's pre-trained runs fine-tuned (module docstring), after the seeded runs."""

    name = "fine-tuning"
    trains = True

    def wanted(self, spec: Spec) -> bool:
        return spec.finetune is not None

    def plan(self, spec: Spec, arms, log=print) -> dict[str, list]:
        fixed = [a for a in arms if not a.timed]
        points = sweep.plan_points(seeded_sweep_spec(spec, fixed, "sweep", {a.name: a.budget for a in fixed}))
        seeded = {(r["arm"], int(r["seed"])): r["run_dir"] for r in record_runs(spec, points, "sweep")}
        return plan(spec, fixed, seeded, log=log)

    def run(self, ctx: Context) -> None:
        ctx.extra.update(run(ctx.spec, ctx.arms, ctx.runs, ctx.extra, jobs=ctx.jobs, threads=ctx.threads,
                             log=ctx.log))


STAGE = Finetuning()
