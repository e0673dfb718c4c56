"""The compute-equivalent gain (CEG) stage of an experiment: its spec keys, the reference's compute-curve runs
and their plan (the comparisons and the report section: ``analysis.ceg_report``).

Spec keys (``tools.experiment``)::

    ceg:
      fractions: [0.25, 0.5, 1.0, 2.0]   # cooldown branches at these shares of the budget (>= 4)
      seeds: [0, 1, 2]                   # one WSD trunk per seed (default: the spec's seeds)
      decay_fraction: 0.2                # share of each branch's steps that decays
      shape: sqrt                        # 1 - sqrt (default) | linear
      arms_schedule: wsd                 # wsd (default): every arm trains the curve's WSD schedule | recipe
    margin: {ceg: [0.9, 1.1]}            # equivalence margin: CEG in [0.9, 1.1] (default), or {nats: 0.02}

The reference arm (at its tuned lr) trains one WSD trunk per seed with cooldown branches ending at
each fraction of the budget (``tools.sweep``'s cooldown machinery, under ``<out>/ceg/``): its loss
as a function of training compute, L_ref(C), measured at >= 4 points per seed. Fractions above 1
matter: an arm better than the reference reaches a loss the reference only reaches with more
compute than the budget, so the curve must be measured beyond it. ``analysis.fair`` fits
L_ref(C) = E + A C^-alpha; a loss outside its measured range is never extrapolated.

The report's family of comparisons (every arm against the reference; with ``verdicts: pairs``, every arm
that names a ``compare:`` arm against that arm, e.g. AdamW/Muon pairs; with ``verdicts: parent``, every arm
against the arm it extends, a ladder's steps; a side arm only against its ``compare:`` arm, if it names
one) is decided by ``analysis.verdicts``: one paired inference per comparison (per-seed ln CEG through the
curve, or the paired loss difference in nats where that cannot be read), t and TOST tests, Holm over the
family, and the interval printed at the level the verdict uses. The margin is ``margin: {ceg: [lo, hi]}``
(default [0.9, 1.1]) or ``{nats: m}``, converted to the other scale on the curve at the budget. Every arm
also gets its paired CEG against the reference (at 95% where that is not its verdict's comparison).

With ``arms_schedule: wsd`` (the default) every arm's tuning and seeded runs train the curve's own
schedule (WSD: warmup, constant lr, the last ``decay_fraction`` of the steps decaying with
``shape``), so that the curve is the reference arm's own loss against compute: a cooldown branch at
1x the budget is a seeded run of the reference. Measured on attention-kv, the recipes' cosine
schedule (to 0.1 x lr) lands 13% of compute below the WSD (1 - sqrt) branches (CEG 0.87 [0.77, 0.96]
of the reference against its own curve), a bias every arm's CEG would carry. ``recipe`` keeps the
recipes' schedules. Either way the reference's own seeded runs are converted too: their CEG should
include 1; it is reported as the calibration check of the method.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from analysis.experiment_spec import DEFAULT_MARGIN, Ceg, Margin, Spec
from archlab.config import RecipeError
from tools import sweep
from tools.experiment.stages.base import Context

KEYS = ("fractions", "seeds", "decay_fraction", "shape", "arms_schedule")
MARGIN_KEYS = ("ceg", "nats")
FOLDER = "ceg"


def check(value, seeds: Sequence[int], where: str = "ceg") -> Optional[Ceg]:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise RecipeError(f"{where}={value!r}: expected a mapping such as {{fractions: [0.25, 0.5, 1.0, 2.0]}}")
    unknown = sorted(set(value) - set(KEYS))
    if unknown:
        raise RecipeError(f"{where}: unknown keys {unknown}; valid: {', '.join(KEYS)}")
    out = {"fractions": [0.25, 0.5, 1.0, 2.0], "seeds": list(seeds), "decay_fraction": 0.2, "shape": "sqrt",
           "arms_schedule": "wsd", **value}
    if out["arms_schedule"] not in ("wsd", "recipe"):
        raise RecipeError(f"{where}.arms_schedule={out['arms_schedule']!r}: wsd (every arm trains the curve's "
                          "schedule) or recipe (the recipes' own schedules)")
    try:
        fractions = sorted({float(f) for f in out["fractions"]})
    except (TypeError, ValueError):
        raise RecipeError(f"{where}.fractions={out['fractions']!r}: a list of positive numbers") from None
    if len(fractions) < 4 or fractions[0] <= 0:
        raise RecipeError(f"{where}.fractions={fractions}: needs >= 4 distinct positive shares of the budget (a "
                          "power law has 3 parameters; the 4th point is what tests it)")
    s = out["seeds"]
    if not isinstance(s, list) or not s or not all(isinstance(x, int) and x >= 0 for x in s):
        raise RecipeError(f"{where}.seeds={s!r}: a list of integers >= 0")
    sweep.cooldown_spec({"tokens": [1.0], "decay_fraction": out["decay_fraction"], "shape": out["shape"]})
    return Ceg(fractions=fractions, seeds=s, decay_fraction=out["decay_fraction"], shape=out["shape"],
               arms_schedule=out["arms_schedule"])


def check_margin(value, where: str = "margin") -> Margin:
    if value is None:
        return DEFAULT_MARGIN
    if not isinstance(value, dict) or len(value) != 1 or next(iter(value)) not in MARGIN_KEYS:
        raise RecipeError(f"{where}={value!r}: give one of {{ceg: [0.9, 1.1]}} or {{nats: 0.02}}")
    kind, v = next(iter(value.items()))
    if kind == "ceg":
        ok = isinstance(v, (list, tuple)) and len(v) == 2 and 0 < float(v[0]) < 1 < float(v[1])
        if not ok:
            raise RecipeError(f"{where}.ceg={v!r}: [low, high] with 0 < low < 1 < high, e.g. [0.9, 1.1]")
        return Margin("ceg", [float(v[0]), float(v[1])])
    if not float(v) > 0:
        raise RecipeError(f"{where}.nats={v!r}: a positive number of nats")
    return Margin("nats", float(v))


def arms_schedule(spec: Spec) -> list[str]:
    """The overrides that give every arm the curve's schedule (``arms_schedule: wsd``), else none."""
    c = spec.ceg
    if not c or c.arms_schedule != "wsd":
        return []
    return ["train.schedule=wsd", f"train.decay_fraction={c.decay_fraction:g}", f"train.decay_shape={c.shape}"]


def ladder_name(arm: str, seed: int) -> str:
    return sweep._safe(f"{arm}-seed{seed}")


def sweep_spec(spec: Spec, arm, lr_set: Sequence[str]) -> dict:
    """One trunk per seed (a ladder each) with a branch at each fraction of the arm's budget."""
    c = spec.ceg
    kind, value = arm.budget.kind, arm.budget.value
    warmup = [f"train.warmup_steps={seeded_warmup(arm)}"]  # the seeded runs' warmup, not a shorter one
    own = [o for o in arm.overrides if o.split("=", 1)[0].strip() not in sweep.COOLDOWN_OWNED]  # the sweep's
    ladders = {ladder_name(arm.name, s): {"recipe": arm.recipe, "set": [*own, *lr_set, *warmup, f"train.seed={s}"]}
               for s in c.seeds}
    cooldown = {kind: [float(f"{float(value) * f:.6g}") for f in c.fractions], "decay_fraction": c.decay_fraction,
                "shape": c.shape}
    return {"out": str(Path(spec.out) / FOLDER), "ladders": ladders, "cooldown": cooldown,
            "description": f"compute curve of {arm.name} ({spec.name})"}


def seeded_warmup(arm) -> int:
    """The warmup steps of the arm's seeded runs (``tools.sweep``: the recipe's, at most a tenth of the run)."""
    ladder = {"recipe": arm.recipe, "set": arm.overrides, arm.budget.kind: [float(arm.budget.value)]}
    pt = sweep.plan_points({"out": "/nonexistent", "ladders": {arm.name: ladder}})
    launch = dict(o.split("=", 1) for o in pt[0].extra["launch_overrides"])
    return int(launch.get("train.warmup_steps") or next(o.split("=", 1)[1] for o in reversed(arm.overrides)
                                                         if o.startswith("train.warmup_steps=")))


def records(sspec: dict, points: Sequence[sweep.Point], arm: str, seeds: Sequence[int]) -> list[dict]:
    owner = {ladder_name(arm, s): s for s in seeds}
    return [{"arm": arm, "seed": owner[p.ladder], "cell": {}, "role": "ceg-" + p.role, "point": p.name,
             "sweep": FOLDER, "run_dir": p.run_dir, "max_steps": p.max_steps, "planned_tokens": p.planned_tokens,
             "planned_flops": p.planned_flops} for p in points]


def run(spec: Spec, arm, lr_set: Sequence[str], *, jobs: int = 1, threads: Optional[int] = None,
        log=print) -> list[dict]:
    sspec = sweep_spec(spec, arm, lr_set)
    points = sweep.run_sweep(sspec, jobs=jobs, threads=threads, log=log)
    left = [p.name for p in points if p.status in ("pending", "running", "interrupted", "failed", "blocked")]
    if left:
        raise sweep.Stopped(f"compute curve: {len(left)} runs not finished ({', '.join(left[:3])}); run the same "
                            "command again to resume them")
    return records(sspec, points, arm.name, spec.ceg.seeds)


def plan(spec: Spec, arm, log=print) -> None:
    if not spec.ceg:
        log("compute curve: none (no `ceg:` in the spec: no compute-equivalent gains)")
        return
    c = spec.ceg
    log(f"compute curve of {arm.name}: {len(c.seeds)} WSD trunks (seeds {c.seeds}), branches at "
        f"{c.fractions} x the budget (the trunk's lr: the arm's tuned lr, chosen before it trains)")
    try:
        sweep.run_sweep(sweep_spec(spec, arm, []), dry_run=True, log=log)
    except ValueError as e:  # the folder holds the trunks at the tuned lr, which the plan does not know
        log(f"(not listed: {e})")


class ComputeCurve:
    """The stage: the reference arm's compute curve at its tuned lr (module docstring)."""

    name = "compute curve"
    trains = True

    def wanted(self, spec: Spec) -> bool:
        return spec.ceg is not None

    def plan(self, spec: Spec, arms, log=print) -> dict[str, list]:
        log("\n== stage 3: compute curve (CEG)")
        ref = next(a for a in arms if a.name == spec.reference)
        plan(spec, ref, log=log)
        return {"compute curve": sweep.plan_points(sweep_spec(spec, ref, []))} if spec.ceg else {}

    def run(self, ctx: Context) -> None:
        ctx.extra["ceg_runs"] = run(ctx.spec, ctx.arm(ctx.spec.reference), [], jobs=ctx.jobs, threads=ctx.threads,
                                    log=ctx.log)


STAGE = ComputeCurve()
