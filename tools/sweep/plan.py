"""A sweep spec's grid (ladders x sizes x grid x budgets) as points, planned: steps from the budget, run folders,
launch overrides."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

from archlab.config import RecipeError, load_recipe, model_config
from archlab.costs import training_flops_per_token
from archlab.train.run_folder import run_role
from tools.sweep.cooldown import (
    _cooldown_for_size,
    _user_sets,
    cooldown_overrides,
    cooldown_points,
    cooldown_spec,
    plan_cooldown,
)
from tools.sweep.point import Point, _budget_tag, _safe


def _as_override_list(value, where: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    out = [str(v) for v in value]
    for o in out:
        if "=" not in o:
            raise RecipeError(f"{where}: override {o!r} is not of the form key=value (e.g. model.n_layers=4)")
    return out


def _grid_tag(override: str) -> str:
    """``train.lr=1e-3`` -> ``lr1e-3``: the last key part and the value, for point names."""
    key, value = override.split("=", 1)
    return f"{key.split('.')[-1]}{value}"


def _grid_items(grid: dict) -> list[list[str]]:
    """Cartesian product of ``{key: [v1, v2]}`` as lists of ``key=value`` overrides."""
    if not grid:
        return [[]]
    keys = list(grid)
    values = []
    for k in keys:
        v = grid[k]
        values.append(list(v) if isinstance(v, (list, tuple)) else [v])
        if not values[-1]:
            raise RecipeError(f"grid.{k}: empty list of values")
    return [[f"{k}={v}" for k, v in zip(keys, combo)] for combo in itertools.product(*values)]


def _budgets(entry: dict, where: str) -> list[tuple[str, float]]:
    """``tokens: [...]`` and ``flops: [...]`` of a spec or of one ladder entry, as (kind, value)."""
    budgets = []
    for kind in ("tokens", "flops"):
        values = entry.get(kind) or []
        for v in values if isinstance(values, (list, tuple)) else [values]:
            try:
                budgets.append((kind, float(v)))
            except (TypeError, ValueError):
                raise RecipeError(f"{where}{kind}: {v!r} is not a number") from None
    for kind, v in budgets:
        if not v > 0:
            raise RecipeError(f"sweep: {kind} budget {v!r} must be positive")
    return budgets


def build_points(spec: dict) -> list[Point]:
    """Expand a sweep spec (ladders x sizes x grid x budgets) into named points. A ladder entry
    with its own ``tokens:``/``flops:`` trains at those budgets instead of the spec's."""
    ladders = spec.get("ladders") or {}
    if not ladders:
        raise RecipeError("sweep: no recipes given (use --recipes FILE... or a spec with 'ladders:')")
    budgets = _budgets(spec, "")
    cooldown = cooldown_spec(spec.get("cooldown"))
    own = {name: _budgets(e, f"ladders.{name}.") for name, e in ladders.items() if isinstance(e, dict)}
    if not budgets and cooldown is None and not (own and all(own.get(name) for name in ladders)):
        raise RecipeError("sweep: no budget given "
                          "(use --tokens N... or --flops C..., or 'tokens:'/'flops:'/'cooldown:' in the spec)")
    common = _as_override_list(spec.get("set"), "set")
    sizes = spec.get("sizes") or {}
    if cooldown is not None and "sizes_at" in cooldown:
        known = set(sizes) | {n for e in ladders.values() if isinstance(e, dict) for n in (e.get("sizes") or {})}
        listed = {n for names in cooldown["sizes_at"].values() for n in names}
        if listed - known:
            raise RecipeError(f"cooldown.budgets: sizes {sorted(listed - known)} are not defined under sizes: "
                              f"(defined: {', '.join(sorted(known)) or 'none'})")
        if known - listed and not budgets:
            raise RecipeError(f"cooldown.budgets: sizes {sorted(known - listed)} are in no budget, so they would "
                              "train nothing; add them to a budget or remove them from sizes:")
    points = []
    for ladder, entry in ladders.items():
        recipe = entry.get("recipe") if isinstance(entry, dict) else entry
        if not recipe:
            raise RecipeError(f"ladders.{ladder}: needs a 'recipe:' path")
        ladder_set = _as_override_list(entry.get("set") if isinstance(entry, dict) else None, f"ladders.{ladder}.set")
        ladder_sizes = (entry.get("sizes") or {}) if isinstance(entry, dict) else {}
        size_names = list(sizes) or list(ladder_sizes) or [""]
        for size in size_names:
            size_set = _as_override_list(sizes.get(size), f"sizes.{size}")
            size_set += _as_override_list(ladder_sizes.get(size), f"ladders.{ladder}.sizes.{size}")
            for grid_set in _grid_items(spec.get("grid") or {}):
                tags = [ladder, size] + [_grid_tag(o) for o in grid_set]
                point = dict(ladder=ladder, size=size, recipe=str(recipe), overrides=common + ladder_set + size_set
                             + grid_set, cell=dict(o.split("=", 1) for o in grid_set))
                for kind, value in own.get(ladder) or budgets:
                    name = _safe("-".join(t for t in tags + [_budget_tag(kind, value)] if t))
                    points.append(Point(name=name, budget_kind=kind, budget=value, **point))
                size_cooldown = _cooldown_for_size(cooldown, size)
                if size_cooldown is not None:
                    points += cooldown_points(_safe("-".join(t for t in tags if t)), point, size_cooldown)
    names = [p.name for p in points]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise RecipeError(f"sweep: point names collide ({', '.join(dupes)}); give ladders or sizes distinct names")
    return points


def plan_point(p: Point, out_dir: Path, processes: int, evals: int) -> Point:
    """Fill in steps from the budget; validate the point's recipe (raises RecipeError)."""
    cfg = load_recipe(p.recipe, p.overrides)
    t = cfg.train
    p.tokens_per_step = int(t.seq_len * t.micro_batch_size * t.grad_accum * processes)
    p.flops_per_token = float(training_flops_per_token(model_config(cfg), t.seq_len))
    p.run_dir = str(out_dir / p.name)
    if p.cooldown:
        plan_cooldown(p, cfg, out_dir)
    elif p.budget_kind == "tokens":
        p.max_steps = max(1, math.ceil(p.budget / p.tokens_per_step))
    else:
        p.max_steps = max(1, math.ceil(p.budget / (p.flops_per_token * p.tokens_per_step)))
    if not p.cooldown:
        p.role = run_role(t, branched=False)  # as the trainer's summary.json will say
    p.planned_tokens = p.max_steps * p.tokens_per_step
    p.planned_flops = p.planned_tokens * p.flops_per_token
    if p.role == "stable" and p.cooldown:
        p.budget = float(p.planned_tokens)
    p.log = str(out_dir / "logs" / f"{p.name}.log")
    p.extra = {"family": str(cfg.family), "recipe_name": str(cfg.name),
               "launch_overrides": launch_overrides(p, cfg, out_dir, evals)}
    load_recipe(p.recipe, p.overrides + p.extra["launch_overrides"])  # the final recipe must validate too
    return p


def launch_overrides(p: Point, cfg, out_dir: Path, evals: int) -> list[str]:
    """Overrides the sweep adds: steps from the budget, the run folder, and (unless the user set
    them) warmup, evaluation and checkpoint intervals scaled to the run's length."""
    steps = p.max_steps
    extra = [f"train.max_steps={steps}", f"train.out_dir={out_dir}", f"train.run_name={p.name}"]
    extra += cooldown_overrides(p)
    defaults = {
        # warmup: the recipe's, but at most a tenth of a short run (cooldowns: of the shortest branch,
        # the same for the trunk and all its branches)
        "train.warmup_steps": p.cooldown["warmup_steps"] if p.cooldown else
        min(int(cfg.train.warmup_steps), max(0, steps // 10)),
        # about `evals` validation points per run, for the loss-against-tokens curves
        "train.eval_every": max(1, steps // max(1, evals)),
        "train.log_every": max(1, min(int(cfg.train.log_every), steps // 10 or 1)),
        # a checkpoint half-way and the final one, the two that keep_last=2 keeps (routing
        # saturation compares checkpoints); (steps+1)//2 so that no second one lands just before the end;
        # a cooldown branch: half-way through its decay
        "train.ckpt_every": p.cooldown["branch_step"] + (p.cooldown["decay_steps"] + 1) // 2
        if p.role == "cooldown" and p.cooldown else max(1, (steps + 1) // 2),
    }
    for key, value in defaults.items():
        if not _user_sets(p.overrides, key):
            extra.append(f"{key}={value}")
    return extra


def plan_points(sspec: dict) -> list[Point]:
    """Every point of a sweep spec, planned (steps, folders, launch overrides), on one process."""
    out_dir = Path(sspec["out"]).resolve()
    return [plan_point(p, out_dir, 1, 8) for p in build_points(sspec)]
