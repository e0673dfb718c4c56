"""Resolving a spec's arms: each arm's recipe and full override list (the common ``set``, the chain of
``extends``, its own ``set``, the compute curve's schedule), its budget, and every recipe loaded now, not
half-way through the experiment."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

from analysis.experiment_spec import TIMED, Arm, Budget, Spec
from archlab.config import RecipeError, load_recipe
from tools.experiment.stages import ceg


def resolve_arms(spec: Spec) -> list[Arm]:
    """Each arm's recipe and full override list: common set, then the chain of ``extends``, then its own."""
    arms: dict[str, Arm] = {}
    previous: Optional[str] = None
    for i, entry in enumerate(spec.arms):
        where, name = f"arms[{i}]", entry.name
        parent_name = entry.extends
        if parent_name == "previous":
            parent_name = previous
            if parent_name is None:
                raise RecipeError(f"{where}: 'extends: previous' on the first arm")
        if parent_name is not None:
            if parent_name not in arms:
                raise RecipeError(f"{where}: extends {parent_name!r}, which is not an arm listed before it "
                                  f"(arms so far: {', '.join(arms) or 'none'})")
            parent = arms[parent_name]
            if entry.recipe:
                raise RecipeError(f"{where}: give either 'recipe:' or 'extends:', not both")
            recipe, inherited = parent.recipe, parent.overrides
        else:
            recipe, inherited = entry.recipe, list(spec.set)
            if not recipe:
                raise RecipeError(f"{where} ({name}): needs 'recipe:' or 'extends:'")
            if not Path(recipe).is_file():
                raise RecipeError(f"{where}.recipe={recipe!r}: file not found")
        budget = entry.budget or spec.budget
        if budget.timed:
            budget = Budget(TIMED, match_time_of=budget.match_time_of, speed_of=budget.speed_of or parent_name)
            for key in ("match_time_of", "speed_of"):
                other = getattr(budget, key)
                if other not in arms or arms[other].timed:
                    raise RecipeError(f"{where}.budget.{key}={other!r}: must name an earlier arm with a "
                                      "tokens or flops budget (its runs measure the time or the speed)")
        own = list(entry.set or [])
        arms[name] = Arm(name=name, label=str(entry.label or name), recipe=str(recipe),
                         overrides=list(inherited) + own, own=own, parent=parent_name, budget=budget,
                         side=bool(entry.side or False), note=str(entry.note or ""), compare=entry.compare)
        if not arms[name].side:
            previous = name
    if spec.reference not in arms:
        raise RecipeError(f"reference={spec.reference!r}: not an arm (arms: {', '.join(arms)})")
    for arm in arms.values():
        if arm.compare is not None and arm.compare not in arms:
            raise RecipeError(f"arm {arm.name}: compare={arm.compare!r} is not an arm (arms: {', '.join(arms)})")
    if spec.verdicts == "pairs" and not any(a.compare for a in arms.values()):
        raise RecipeError("verdicts=pairs: no arm names a compare: arm, so there would be no verdict; add compare: "
                          "to the arms to pair, or drop verdicts")
    if spec.verdicts == "parent" and not any(a.parent for a in arms.values() if not a.side):
        raise RecipeError("verdicts=parent: no arm extends another, so there would be no verdict; give the arms "
                          "extends:, or drop verdicts")
    schedule = ceg.arms_schedule(spec)  # the compute curve's schedule (ceg.arms_schedule: wsd), last
    arms = {n: dataclasses.replace(a, overrides=[*a.overrides, *schedule]) for n, a in arms.items()}
    for arm in arms.values():  # every arm's recipe must load now, not half-way through the experiment
        try:
            load_recipe(arm.recipe, arm.overrides)
        except RecipeError as e:
            raise RecipeError(f"arm {arm.name} ({arm.recipe} + its overrides): {e}") from None
    only = spec.only_arms
    if only:
        missing = [a for a in only if a not in arms]
        if missing:
            raise RecipeError(f"quick.arms: {missing} are not arms (arms: {', '.join(arms)})")
        needed = {spec.reference} | {getattr(a.budget, k) for a in arms.values() if a.name in only and a.timed
                                     for k in ("match_time_of", "speed_of")}
        if not needed <= set(only):
            raise RecipeError(f"quick.arms={only}: must include {sorted(needed - set(only))} (the reference arm and "
                              "the arms whose runs set a time-matched budget)")
        return [a for a in arms.values() if a.name in only]
    return list(arms.values())
