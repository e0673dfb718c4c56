"""WSD cooldown branches: the ``cooldown:`` spec, a stable trunk and its branches per point, their steps
and overrides (the method: ``tools.sweep.cli``'s help)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional, Sequence

from archlab.config import RecipeError, model_config
from archlab.costs import param_counts
from archlab.train.checkpoint import CKPT_DIR, checkpoints, step_dir_name
from archlab.train.checkpoint import MANIFEST as CKPT_MANIFEST
from tools.sweep.point import Point, _budget_tag

COOLDOWN_KEYS = ("tokens", "flops", "budgets", "compute", "decay_fraction", "shape")


# what a FLOPs budget counts: archlab's measured training FLOPs per token (attention, LM head and all), or Kaplan's
# C = 6 N D with N the active non-embedding parameters without the LM head (analysis.scaling's N)
COMPUTE_CONVENTIONS = ("measured", "6nd")


# set by the sweep for stable trunks and their branches; a point's own value would break the branches
COOLDOWN_OWNED = ("train.schedule", "train.decay_steps", "train.decay_fraction", "train.decay_shape",
                  "train.ckpt_steps", "train.branch_from", "train.resume")


def cooldown_spec(value) -> Optional[dict]:
    """The spec's ``cooldown:`` mapping, checked: ``{tokens: [D...], decay_fraction: f, shape: s}``, or
    ``flops: [C...]`` instead of ``tokens`` (each size then branches where its training FLOPs reach C:
    D = C / training FLOPs per token, so that every size has a point on each IsoFLOP line)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise RecipeError("cooldown: expected a mapping such as {tokens: [2.0e6, 4.0e6], decay_fraction: 0.2, "
                          "shape: sqrt}")
    unknown = sorted(set(value) - set(COOLDOWN_KEYS))
    if unknown:
        raise RecipeError(f"cooldown: unknown keys {unknown}; valid: {', '.join(COOLDOWN_KEYS)}")
    if sum(k in value for k in ("tokens", "flops", "budgets")) != 1:
        raise RecipeError("cooldown: give exactly one of tokens: [D...] (branch ends in tokens), flops: [C...] "
                          "(branch ends in training FLOPs) or budgets: [{flops: C, sizes: [...]}, ...] (each "
                          "budget its own sizes)")
    sizes_at = None
    if "budgets" in value:
        kind, budgets, sizes_at = _budget_sizes(value["budgets"])
    else:
        kind = "tokens" if "tokens" in value else "flops"
        budgets = value[kind]
        if not isinstance(budgets, (list, tuple)) or not budgets:
            raise RecipeError(f"cooldown.{kind}={budgets!r}: needs a list of {kind} budgets, one branch each")
    try:
        budgets = sorted({float(v) for v in budgets})
        fraction = float(value.get("decay_fraction", 0.2))
    except (TypeError, ValueError) as e:
        raise RecipeError(f"cooldown: {e}") from None
    if not all(v > 0 for v in budgets):
        raise RecipeError(f"cooldown.{kind}={budgets}: budgets must be positive")
    if not 0.0 < fraction < 1.0:
        raise RecipeError(f"cooldown.decay_fraction={fraction}: must lie in (0, 1)")
    shape = value.get("shape", "sqrt")
    if shape not in ("linear", "sqrt"):
        raise RecipeError(f"cooldown.shape={shape!r}: must be one of: linear, sqrt")
    compute = value.get("compute", "measured")
    if compute not in COMPUTE_CONVENTIONS:
        raise RecipeError(f"cooldown.compute={compute!r}: must be one of: {', '.join(COMPUTE_CONVENTIONS)}")
    if compute != "measured" and kind != "flops":
        raise RecipeError(f"cooldown.compute={compute}: only FLOPs budgets have a compute convention; remove it or "
                          "give flops: / budgets: [{flops: ...}]")
    out = {kind: budgets, "decay_fraction": fraction, "shape": shape}
    if compute != "measured":
        out["compute"] = compute
    if sizes_at is not None:
        out["sizes_at"] = sizes_at
    return out


def _budget_sizes(entries) -> tuple[str, list[float], dict]:
    """``cooldown.budgets``: ``[{flops: C, sizes: [size names]}, ...]`` (or ``tokens: D``), an IsoFLOP
    design where each budget trains only the sizes around its optimum (``python -m analysis.scaling
    design --propose`` plans one). Returns the kind, the budgets and {budget: size names}."""
    where = "cooldown.budgets"
    if not isinstance(entries, (list, tuple)) or not entries:
        raise RecipeError(f"{where}={entries!r}: needs a list such as [{{flops: 1.0e12, sizes: [s1, s2]}}, ...]")
    kinds, sizes_at = set(), {}
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or set(e) - {"flops", "tokens", "sizes"} or ("flops" in e) == ("tokens" in e):
            raise RecipeError(f"{where}[{i}]={e!r}: expected {{flops: C, sizes: [...]}} or {{tokens: D, sizes: "
                              "[...]}}")
        kind = "flops" if "flops" in e else "tokens"
        kinds.add(kind)
        try:
            budget = float(e[kind])
        except (TypeError, ValueError):
            raise RecipeError(f"{where}[{i}].{kind}={e[kind]!r}: not a number") from None
        names = e.get("sizes")
        if not isinstance(names, (list, tuple)) or not names or not all(isinstance(n, str) for n in names):
            raise RecipeError(f"{where}[{i}].sizes={names!r}: needs a list of size names (keys of sizes:)")
        if budget in sizes_at:
            raise RecipeError(f"{where}[{i}]: budget {budget:g} is listed twice; merge its sizes into one entry")
        sizes_at[budget] = list(names)
    if len(kinds) > 1:
        raise RecipeError(f"{where}: mixes flops and tokens budgets; give every budget in one unit")
    return kinds.pop(), list(sizes_at), sizes_at


def _cooldown_for_size(cooldown: Optional[dict], size: str) -> Optional[dict]:
    """The cooldown of one size: with ``budgets:``, only the budgets that list it (None: no trunk)."""
    if cooldown is None or "sizes_at" not in cooldown:
        return cooldown
    kind = "tokens" if "tokens" in cooldown else "flops"
    own = [b for b in cooldown[kind] if size in cooldown["sizes_at"][b]]
    if not own:
        return None
    return {kind: own, **{k: v for k, v in cooldown.items() if k not in ("tokens", "flops", "sizes_at")}}


def cooldown_points(base: str, point: dict, cooldown: dict) -> list[Point]:
    """The stable trunk ``<base>-stable`` and one branch ``<base>-cd<D>`` per token count D."""
    owned = [o for o in point["overrides"] if o.split("=", 1)[0].strip() in COOLDOWN_OWNED]
    if owned:
        raise RecipeError(f"cooldown: {owned[0]!r} (point {base}) is set by the sweep for stable trunks and their "
                          "branches; remove it (full-schedule runs of the same spec take the recipe's schedule)")
    kind = "tokens" if "tokens" in cooldown else "flops"
    trunk = Point(name=f"{base}-stable", budget_kind="tokens", budget=0.0, role="stable",
                  cooldown=dict(cooldown), **point)  # budget: the tokens it trains, once planned
    def tag(b: float) -> str:  # cd2e6 (tokens) or cdflop3e13
        return "cd" + (_budget_tag("tokens", b)[3:] if kind == "tokens" else _budget_tag(kind, b))

    branches = [Point(name=f"{base}-{tag(b)}", budget_kind=kind, budget=b, role="cooldown", parent=trunk.name,
                      cooldown=dict(cooldown), **point)
                for b in cooldown[kind]]
    return [trunk, *branches]


def branch_steps(tokens: float, tokens_per_step: int, decay_fraction: float) -> tuple[int, int]:
    """(branch step s, decay steps d) of the branch that ends at ``tokens``: as many steps n as a
    full run of that budget, n = ceil(tokens / tokens_per_step), the last d = round(f * n) of them
    (at least 1) decaying, from the trunk's checkpoint at s = n - d."""
    n = max(1, math.ceil(tokens / tokens_per_step))
    d = max(1, round(decay_fraction * n))
    return n - d, d


def plan_cooldown(p: Point, cfg, out_dir: Path) -> None:
    """Steps of a stable trunk (to its last branch step, checkpoints at every branch step) or of a
    branch (s + d); the shared warmup (the user's, else the recipe's but at most a tenth of the
    shortest branch); RecipeError when a branch would start before the warmup ends."""
    c, tps = p.cooldown, p.tokens_per_step
    if "flops" in c:  # this size's token count at each compute budget
        c["tokens"] = [C / _budget_flops_per_token(p, cfg) for C in c["flops"]]
    starts = [branch_steps(d, tps, c["decay_fraction"])[0] for d in c["tokens"]]
    shortest = math.ceil(c["tokens"][0] / tps)
    warmup = int(cfg.train.warmup_steps) if _user_sets(p.overrides, "train.warmup_steps") else \
        min(int(cfg.train.warmup_steps), shortest // 10)
    if min(starts) < max(1, warmup):
        raise RecipeError(f"cooldown.tokens={c['tokens'][0]:g} (point {p.name}): {shortest} steps of {tps} tokens "
                          f"leave the branch start at step {min(starts)}, before the end of the warmup ({warmup} "
                          "steps) or of step 1; raise the smallest token count or lower train.warmup_steps")
    c["warmup_steps"] = warmup
    if p.role == "stable":
        c["branch_steps"] = sorted(set(starts))
        p.max_steps = max(starts)
        return
    tokens = p.budget if p.budget_kind == "tokens" else p.budget / _budget_flops_per_token(p, cfg)
    s, d = branch_steps(tokens, tps, c["decay_fraction"])
    trunk_ckpt = out_dir / p.parent / CKPT_DIR / step_dir_name(s)
    c.update(branch_step=s, decay_steps=d, branch_from=str(trunk_ckpt))
    p.max_steps = s + d


def _budget_flops_per_token(p: Point, cfg) -> float:
    """FLOPs per token that a point's FLOPs budget counts: measured, or 6 N (``cooldown.compute: 6nd``)."""
    if p.cooldown.get("compute") == "6nd":
        return 6.0 * param_counts(model_config(cfg)).active_no_head
    return p.flops_per_token


def cooldown_overrides(p: Point) -> list[str]:
    """What makes a point a stable trunk (constant lr, checkpoints at the branch steps) or a branch
    (wsd decaying over its last d steps from the trunk's checkpoint at s)."""
    c = p.cooldown
    if not c:
        return []
    if p.role == "stable":
        return ["train.schedule=constant", f"train.ckpt_steps=[{','.join(str(s) for s in c['branch_steps'])}]"]
    return ["train.schedule=wsd", f"train.decay_steps={c['decay_steps']}", f"train.decay_shape={c['shape']}",
            f"train.branch_from={c['branch_from']}"]


def is_ready(p: Point) -> bool:
    """A branch starts once its trunk's checkpoint at the branch step is complete (or it has a
    checkpoint of its own to continue from); other points are always ready."""
    if p.role != "cooldown" or not p.cooldown:
        return True
    return (Path(p.cooldown["branch_from"]) / CKPT_MANIFEST).is_file() or bool(checkpoints(p.run_dir))


def _user_sets(overrides: Sequence[str], key: str) -> bool:
    return any(o.split("=", 1)[0].strip() == key for o in overrides)
