"""The tuning stage of an experiment: every arm's learning rate chosen on its own before the seeded
runs, so that no arm is compared at an lr that suits another arm better.

Spec key (``tools.experiment``)::

    tune:
      lr: [1.0e-3, 2.0e-3, 4.0e-3, 8.0e-3]   # the starting log grid (>= 2 values, increasing)
      budget_fraction: 1.0                    # share of the arm's budget each tuning run trains
      seed: 1000                              # train.seed of the tuning runs (not one of the seeds:)
      max_extend: 3                           # extensions allowed on each side of the grid
    tune: {shared: "why the arms share the recipe's lr"}   # the alternative: say why, tune nothing
    tune: {lr: [...], mup: true}       # width-only arms under muP: tune once at the base width, transfer

Procedure: a log grid at the arm's full budget (``budget_fraction: 1``), one run per lr. Successive
halving from shorter budgets was not chosen: the optimal lr shifts with the number of steps
(longer runs prefer a lower peak lr), and at the budgets a CPU experiment trains (a few hundred
steps) a shorter budget is exactly where that shift is largest. The best grid point is the one with
the lowest final validation loss (a run that diverged, or did not learn: not 0.1 nats below its training
split's unigram entropy, counts as +inf; when every lr does, the grid extends downwards, and when it may not,
the lowest loss of the runs that did not diverge is the choice). When that
point is at an end of the grid, the grid extends on that side by the grid's own ratio (``lr[1] / lr[0]``) and the new
point is trained; this repeats until the best point is interior (``bracketed``) or ``max_extend``
points were added on that side (reported: "at the edge, limit hit"). The chosen lr is then the minimum
of a weighted least-squares parabola in log lr through every finite point of the grid, inside the bracket
(``analysis.lr_choice``: one run per lr carries its seed's luck, which the grid's argmin follows when
neighbours differ by less than the seed sd), with an 80% interval on the optimal lr (its sd here: the parabola's
residuals; the report refits with the seeded runs' sd) and the fitted loss at the interval's ends; an interval
open on a side the grid does not bound. The seeded runs train at the chosen lr.

The tuning runs use their own seed (``seed``), different from the seeds of the measured runs:
choosing the best of several runs and then reporting that same run would bias the arm towards a
lucky draw (the winner's curse); a separate seed keeps the reported runs unselected. Tuning runs
are ordinary run folders of a ``tools.sweep`` sweep under ``<out>/tune/``: resumable, skipped when
finished. Arms whose budget is a wall-clock time (``match_time_of``) take the lr of the arm they
extend (the same model).

``mup: true`` is for arms that differ only in width and train with ``model.parametrization=mup``
(checked): the lr is searched once, at the base width (the arm whose ``d_model`` equals
``model.mup_base_width``, or else the first arm at that width), and every arm trains at it — muP's
promise is that the optimal lr transfers across widths (its coordinate check and lr transfer are
measured in ``tools/mup_sweep.py``).

The report section shows, per arm, the loss against lr (plot), the chosen lr, whether it is
bracketed, and what tuning cost (runs and the sum of their wall times, against the seeded runs').
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Optional, Sequence

from analysis import lr_choice
from analysis.experiment_spec import Spec, Tune
from analysis.experiments import wall_seconds
from analysis.runs import LEARN_MARGIN, open_run
from archlab.config import RecipeError, load_recipe
from tools import sweep
from tools.experiment.stages.base import Context

KEYS = ("lr", "budget_fraction", "seed", "max_extend", "shared", "mup")
FOLDER = "tune"
DEFAULTS = {"budget_fraction": 1.0, "seed": 1000, "max_extend": 3}


def check(value, seeds: Sequence[int], where: str = "tune") -> Optional[Tune]:
    """The spec's ``tune:`` mapping, checked and filled with defaults (None: no tuning key)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise RecipeError(f"{where}={value!r}: expected a mapping such as {{lr: [1.0e-3, 3.0e-3, 1.0e-2]}} or "
                          "{shared: 'why every arm keeps the recipe's lr'}")
    unknown = sorted(set(value) - set(KEYS))
    if unknown:
        raise RecipeError(f"{where}: unknown keys {unknown}; valid: {', '.join(KEYS)}")
    if "shared" in value:
        if len(value) != 1 or not str(value["shared"] or "").strip():
            raise RecipeError(f"{where}.shared: give only the reason the arms share one lr (a sentence), no grid")
        return Tune(shared=str(value["shared"]).strip())
    out = {**DEFAULTS, **value}
    lrs = out.get("lr")
    try:
        lrs = [float(v) for v in lrs]
    except (TypeError, ValueError):
        raise RecipeError(f"{where}.lr={lrs!r}: a list of learning rates, e.g. [1.0e-3, 3.0e-3, 1.0e-2]") from None
    if len(lrs) < 2 or any(v <= 0 for v in lrs) or any(b <= a for a, b in zip(lrs, lrs[1:])):
        raise RecipeError(f"{where}.lr={lrs}: needs >= 2 positive, increasing values on a log grid (3 or more let the "
                          "best be interior without extending)")
    if not 0.0 < float(out["budget_fraction"]) <= 1.0:
        raise RecipeError(f"{where}.budget_fraction={out['budget_fraction']}: must lie in (0, 1]")
    if not isinstance(out["seed"], int) or out["seed"] < 0 or out["seed"] in seeds:
        raise RecipeError(f"{where}.seed={out['seed']!r}: an integer >= 0 that is not one of seeds: {list(seeds)} "
                          "(the reported runs must not be the ones the lr was selected on)")
    if not isinstance(out["max_extend"], int) or out["max_extend"] < 0:
        raise RecipeError(f"{where}.max_extend={out['max_extend']!r}: an integer >= 0")
    if not isinstance(out.get("mup", False), bool):
        raise RecipeError(f"{where}.mup={out['mup']!r}: true (tune at the muP base width, transfer) or false")
    return Tune(budget_fraction=float(out["budget_fraction"]), seed=out["seed"], max_extend=out["max_extend"], lr=lrs,
                mup=bool(out.get("mup", False)))


def _lr_text(lr: float) -> str:
    return f"{lr:.3g}"


def ladder_name(arm: str, lr: float) -> str:
    return sweep._safe(f"{arm}-lr{_lr_text(lr)}")


def sweep_spec(spec: Spec, arms, lrs: dict[str, list[float]]) -> dict:
    """A ``tools.sweep`` spec: one ladder per (arm, lr) at the arm's budget x budget_fraction."""
    tune = spec.tune
    ladders = {}
    for arm in arms:
        for lr in lrs[arm.name]:
            ladders[ladder_name(arm.name, lr)] = {
                "recipe": arm.recipe, arm.budget.kind: [float(arm.budget.value) * tune.budget_fraction],
                "set": [*arm.overrides, f"train.lr={_lr_text(lr)}", f"train.seed={tune.seed}"]}
    return {"out": str(Path(spec.out) / FOLDER), "ladders": ladders, "description": f"tuning of {spec.name}"}


def records(sspec: dict, points: Sequence[sweep.Point], lrs: dict[str, list[float]], seed: int) -> list[dict]:
    """Typed run records of the tuning runs (arm, lr, seed, role), from the ladder each point belongs to."""
    owner = {ladder_name(arm, lr): (arm, lr) for arm, values in lrs.items() for lr in values}
    out = []
    for p in points:
        arm, lr = owner[p.ladder]
        out.append({"arm": arm, "seed": seed, "cell": {}, "lr": lr, "role": "tune", "point": p.name,
                    "sweep": FOLDER, "run_dir": p.run_dir, "max_steps": p.max_steps,
                    "planned_tokens": p.planned_tokens, "planned_flops": p.planned_flops})
    return out


def final_loss(run_dir: str) -> Optional[float]:
    """The run's final validation loss; +inf for a run that diverged; None while unfinished."""
    state = sweep.run_state(sweep.Point(name="", ladder="", size="", recipe="", overrides=[], budget_kind="tokens",
                                        budget=0.0, run_dir=run_dir))
    if state == "diverged":
        return math.inf
    if state != "finished":
        return None
    loss = open_run(run_dir).final_val_loss
    return float(loss) if loss is not None and math.isfinite(loss) else math.inf


def did_not_learn(run_dir: str) -> bool:
    """A finished run whose final validation loss is not ``LEARN_MARGIN`` below its training split's
    unigram entropy (near it or above it): it learned token frequencies and nothing more (``analysis.experiments``)."""
    run = open_run(run_dir)
    loss, unigram = run.final_val_loss, (run.summary or {}).get("unigram_entropy_train")
    if loss is None or unigram is None or not math.isfinite(loss):
        return False
    return loss >= float(unigram) - LEARN_MARGIN


def score(run_dir: str) -> Optional[float]:
    """What the lr choice minimises: the final validation loss; +inf for a run that diverged or did
    not learn (its loss says nothing about how close its lr is to the best); None while unfinished."""
    loss = final_loss(run_dir)
    if loss is not None and math.isfinite(loss) and did_not_learn(run_dir):
        return math.inf
    return loss


def choose(lrs: Sequence[float], losses: Sequence[Optional[float]]) -> dict:
    """The best lr of a grid and where it lies: {lr, index, side: None | 'low' | 'high'} (side: the end
    of the grid the best point sits on, so the grid must extend there)."""
    scored = [(loss if loss is not None else math.inf, i) for i, loss in enumerate(losses)]
    best_loss, i = min(scored)
    side = "low" if i == 0 else "high" if i == len(lrs) - 1 else None
    if not math.isfinite(best_loss):
        side = "low"  # every lr diverged or did not learn: go lower
    return {"lr": lrs[i], "index": i, "side": side, "loss": best_loss}


def extend(lrs: list[float], side: str, ratio: float) -> list[float]:
    """The grid with one more point beyond its ``side`` end, at the grid's own ratio."""
    if side == "low":
        return [float(_lr_text(lrs[0] / ratio))] + lrs
    return lrs + [float(_lr_text(lrs[-1] * ratio))]


def run(spec: Spec, arms, *, jobs: int = 1, threads: Optional[int] = None, log=print) -> tuple[dict, list[dict]]:
    """Tune every arm with a fixed budget (resumable), or under ``mup: true`` the base-width arm
    only; returns ({arm: result}, run records)."""
    if not spec.tune.mup:
        return search(spec, arms, jobs=jobs, threads=threads, log=log)
    base = mup_base_arm(arms)
    tuned, recs = search(spec, [base], jobs=jobs, threads=threads, log=log)
    return {a.name: {**tuned[base.name], "transferred_from": base.name} for a in arms}, recs


def mup_base_arm(arms):
    """The arm at the muP base width (every arm must train under muP with one base width); when no
    arm is that wide, the first arm narrowed to it."""
    widths, base = set(), None
    for a in arms:
        m = load_recipe(a.recipe, a.overrides).model
        if m.parametrization != "mup":
            raise RecipeError(f"tune.mup=true: arm {a.name} trains with model.parametrization={m.parametrization}; "
                              "muP transfer needs model.parametrization=mup on every arm")
        widths.add(int(m.mup_base_width))
        if int(m.d_model) == int(m.mup_base_width) and base is None:
            base = a
    if len(widths) != 1:
        raise RecipeError(f"tune.mup=true: the arms name different model.mup_base_width {sorted(widths)}; one base "
                          "width is tuned and transferred")
    width = widths.pop()
    if base is not None:
        return base
    first = arms[0]
    return dataclasses.replace(first, name=f"{first.name}-base{width}",
                               overrides=[*first.overrides, f"model.d_model={width}"])


def search(spec: Spec, arms, *, jobs: int = 1, threads: Optional[int] = None, log=print) -> tuple[dict, list[dict]]:
    """The bracketed log-grid search of each arm's lr (module docstring)."""
    tune = spec.tune
    ratio = tune.lr[1] / tune.lr[0]
    lrs, extended = grids_so_far(spec, arms)
    while True:
        sspec = sweep_spec(spec, arms, lrs)
        points = sweep.run_sweep(sspec, jobs=jobs, threads=threads, log=log)
        left = [p.name for p in points if p.status in ("pending", "running", "interrupted", "failed")]
        if left:
            raise sweep.Stopped(f"tuning: {len(left)} runs not finished ({', '.join(left[:3])}); run the same command "
                          "again to resume them")
        recs = records(sspec, points, lrs, tune.seed)
        again = False
        for a in arms:
            mine = sorted((r for r in recs if r["arm"] == a.name), key=lambda r: r["lr"])
            best = choose([r["lr"] for r in mine], [score(r["run_dir"]) for r in mine])
            side = best["side"]
            if side and extended[a.name][side] < tune.max_extend:
                log(f"tuning {a.name}: best lr {best['lr']:g} at the {side} end of {lrs[a.name]}; extending")
                lrs[a.name] = extend(lrs[a.name], side, ratio)
                extended[a.name][side] += 1
                again = True
        if not again:
            return summarise(recs, tune), recs


def grids_so_far(spec: Spec, arms) -> tuple[dict, dict]:
    """Each arm's grid as an earlier invocation left it: the starting grid and the extensions the tuning folder's
    manifest already lists (decided from finished runs, so the same decisions again), and how many on each side.
    Starting from it, the first manifest this invocation writes keeps those runs and their wall times."""
    tune = spec.tune
    ratio = tune.lr[1] / tune.lr[0]
    manifest = sweep.read_manifest(Path(spec.out) / FOLDER) or {}
    before = set((manifest.get("spec") or {}).get("ladders") or {})
    lrs, extended = {}, {}
    for a in arms:
        grid, done = list(tune.lr), {"low": 0, "high": 0}
        for side in ("low", "high"):
            while done[side] < tune.max_extend:
                wider = extend(grid, side, ratio)
                if ladder_name(a.name, wider[0] if side == "low" else wider[-1]) not in before:
                    break
                grid, done[side] = wider, done[side] + 1
        lrs[a.name], extended[a.name] = grid, done
    return lrs, extended


def summarise(recs: Sequence[dict], tune: Tune) -> dict:
    """{arm: {lrs, losses, lr (chosen), bracketed, limit_hit, runs, wall_s}} from the tuning records."""
    out = {}
    for arm in dict.fromkeys(r["arm"] for r in recs):
        mine = sorted((r for r in recs if r["arm"] == arm), key=lambda r: r["lr"])
        lrs = [r["lr"] for r in mine]
        losses = [final_loss(r["run_dir"]) for r in mine]
        scores = [score(r["run_dir"]) for r in mine]
        best = choose(lrs, scores)
        fitted = lr_choice.choose(lrs, scores)  # at an end of the grid: its end, and an interval open there
        if not math.isfinite(best["loss"]) and any(v is not None and math.isfinite(v) for v in losses):
            # no lr learned and the grid may extend no further: the lowest loss still ranks the lrs
            _, i = min((v, i) for i, v in enumerate(losses) if v is not None and math.isfinite(v))
            best = {**best, "lr": lrs[i], "index": i}
        out[arm] = {"lrs": lrs, "losses": [None if v is None or not math.isfinite(v) else v for v in losses],
                    "diverged": [v is not None and not math.isfinite(v) for v in losses],
                    "did_not_learn": [v is not None and math.isfinite(v) and did_not_learn(r["run_dir"])
                                      for v, r in zip(losses, mine)],
                    "lr": best["lr"], "loss": best["loss"] if math.isfinite(best["loss"]) else None,
                    "learned": math.isfinite(best["loss"]), "bracketed": best["side"] is None,
                    "limit_hit": best["side"] is not None, "runs": [r["point"] for r in mine],
                    "grid_lr": best["lr"], "choice": fitted}
        if best["side"] is None and fitted["kind"] == "parabola":  # the whole grid's minimum, inside the bracket
            out[arm]["lr"] = float(_lr_text(fitted["lr"]))
    return out


def tuned_overrides(arms, tuned: dict) -> dict[str, list[str]]:
    """Each arm's ``train.lr`` override: its own tuned lr, or its parent's (time-matched arms)."""
    out = {}
    for a in arms:
        source = a.name if a.name in tuned else a.parent  # time-matched arms: their parent's lr
        if source not in tuned:
            raise RecipeError(f"tuning: arm {a.name} has no tuned lr (nor has its parent {a.parent})")
        out[a.name] = [f"train.lr={_lr_text(tuned[source]['lr'])}"]
    return out


def plan(spec: Spec, arms, log=print) -> None:
    """Print the tuning runs of the starting grid (extensions, if any, are decided as results come in)."""
    tune = spec.tune
    if not tune.searched:
        log(f"tuning: none by design: {tune.shared}")
        return
    if tune.mup:
        arms = [mup_base_arm(arms)]
        log(f"tuning under muP: the base-width arm {arms[0].name} only; every arm trains at its lr")
    log(f"tuning: {len(arms)} arms x {len(tune.lr)} lrs {tune.lr} at {tune.budget_fraction:g} x each "
        f"arm's budget, seed {tune.seed}; up to {tune.max_extend} more lrs per side when the best is at an "
        "edge")
    sweep.run_sweep(sweep_spec(spec, arms, {a.name: list(tune.lr) for a in arms}), dry_run=True, log=log)


class Tuning:
    """The stage: each fixed-budget arm's lr searched (module docstring); every arm then carries its tuned lr
    (time-matched arms their parent's) in its overrides, and the record keeps the grids and their wall times."""

    name = "tuning"
    trains = True

    def wanted(self, spec: Spec) -> bool:
        return spec.tune.searched

    def plan(self, spec: Spec, arms, log=print) -> dict[str, list]:
        fixed = [a for a in arms if not a.timed]
        log("\n== stage 1: tuning")
        plan(spec, fixed, log=log)
        if not spec.tune.searched:
            return {}
        searched = [mup_base_arm(fixed)] if spec.tune.mup else fixed
        return {"tuning (starting grid)": sweep.plan_points(sweep_spec(spec, searched,
                                                                       {a.name: spec.tune.lr for a in searched}))}

    def run(self, ctx: Context) -> None:
        spec = ctx.spec
        tuned, recs = run(spec, [a for a in ctx.arms if not a.timed], jobs=ctx.jobs, threads=ctx.threads,
                          log=ctx.log)
        lr_sets = tuned_overrides(ctx.arms, tuned)
        ctx.arms = [dataclasses.replace(a, overrides=[*a.overrides, *lr_sets[a.name]]) if a.name in lr_sets else a
                    for a in ctx.arms]
        manifest = sweep.read_manifest(Path(spec.out) / FOLDER) or {}
        wall = {p["name"]: wall_seconds(p) or 0.0 for p in manifest.get("points", [])}  # per tuning run
        ctx.extra.update({"tuning": tuned, "tune_runs": recs, "tune_wall_s": wall})


STAGE = Tuning()
