"""Scaling sweeps: train a grid of recipes x sizes x overrides at token or FLOP budgets.

    # a family's size ladder at two token budgets
    python -m tools.sweep --recipes recipes/dense/tiny.yaml recipes/dense/mini.yaml \\
        --tokens 2e6 8e6 --out runs/sweep-dense
    # a sweep described in a file (ladders x sizes x grid x budgets), e.g. the LLaMA scaling study
    python -m tools.sweep --spec docs/scaling/design/sweep-llama.yaml --jobs 2 --threads 1
    # where it stands: points and FLOPs done, each size's measured speed, the time left at --jobs 2
    python -m tools.sweep --spec docs/scaling/design/sweep-llama.yaml --status --jobs 2
    # keep the finished runs' records (no checkpoints) in a folder to commit; bring them back in a new clone
    python -m tools.sweep --spec docs/scaling/design/sweep-llama.yaml --archive docs/scaling/runs/llama
    python -m tools.sweep --spec docs/scaling/design/sweep-llama.yaml --restore docs/scaling/runs/llama --jobs 2

Each point of the grid is one run of ``python -m archlab.train`` (or ``accelerate launch -m
archlab.train`` with ``--launcher accelerate``) in a subprocess, or one SLURM job with ``--launcher slurm``
(``tools.launch``: resources from ``--slurm-*``, requeued from its checkpoint at a time limit or a
preemption), with its run folder ``<out>/<point name>/``. ``train.max_steps`` comes from the budget:

    tokens budget T:  max_steps = ceil(T / tokens_per_step)
    FLOPs budget C:   max_steps = ceil(C / (training_flops_per_token * tokens_per_step))

with tokens_per_step = seq_len * micro_batch_size * grad_accum * processes and the FLOPs per
token from ``archlab.costs``. The sweep is resumable: a point whose run folder holds a
``summary.json`` of a completed run is skipped (so is one that stopped on non-finite numbers:
rerunning it would diverge again; it is reported as diverged); a started but unfinished one
continues from its last checkpoint (``train.resume=auto``). ``--jobs N`` trains N points at once.
``<out>/manifest.json`` records every point (recipe, overrides, budget, steps, status, exit code,
log file, role, and ``peak_rss_bytes``: the peak resident memory of the trainer process, from the
kernel's accounting of the finished child) and is rewritten atomically after each change;
``<out>/logs/<point>.log`` holds each run's output.

``--hours H`` starts no run that would not end within H hours of the sweep's start at the speeds measured
so far (:class:`RunTimes`; a stable trunk counts its queued branches, which need its checkpoints): a
machine with a time limit ends with whole runs instead of half-trained ones.

A sweep that outlasts its machine (or a clone) keeps its results with ``--archive DIR``: a manifest whose
``run_dir`` are relative and ``runs.tar.xz``, the finished runs slimmed to what the analysis reads (run.json,
recipe.yaml, summary.json, env.json, the evaluation rows of metrics.jsonl, routing summaries; no checkpoints,
no tokenizer: ``analysis.run_archive``), well under 1 KB a run compressed, so that ``analysis.scaling DIR`` reads
it like the sweep folder. A stable trunk is archived only once all its branches are done (its checkpoints stay
behind). ``--restore DIR`` writes the archived runs that the sweep folder lacks into it as run folders (refusing
an archive of other settings) before training the rest.

WSD cooldown branches (Hägele et al. 2024; ``cooldown:`` in the spec): per ladder x size x grid
combination, one stable trunk ``<point>-stable`` (warmup, then a constant lr) and one branch
``<point>-cd<D>`` per token count D. A branch trains as many steps as a full run of D tokens,
n = ceil(D / tokens_per_step); its last d = max(1, round(decay_fraction * n)) steps decay
(``train.schedule=wsd``, ``train.decay_steps=d``, ``train.decay_shape``) and it starts from the
trunk's checkpoint at step s = n - d (``train.branch_from``). So D, the branch's ``tokens`` in its
summary.json, counts the trunk's tokens and the cooldown's, and its FLOPs are those of the whole
n steps. The trunk runs to the largest s with a checkpoint at every s (``train.ckpt_steps``, spared
by keep_last). The trunk and its branches share one warmup: the recipe's but at most a tenth of the
shortest branch (or the user's ``train.warmup_steps``); a branch that would start inside it is
refused. A branch starts once its trunk checkpoint exists (with ``--jobs`` > 1 while the trunk still
trains); when the trunk failed before it, the branch is reported ``blocked``. Which run is what: the
field ``role`` of each manifest point and of each run's summary.json, ``full`` (a whole schedule from
step 0) | ``stable`` (the trunk: constant lr to the end, NOT a scaling point) | ``cooldown`` (a
branch: the scaling point (N, D)); a branch's manifest entry names its trunk (``parent``) and its
summary.json ``branch_from`` and ``branch_step``.

Spec file keys (YAML; all but the recipes and one budget, tokens, flops or cooldown, are optional):

    out: runs/sweep-demo           # sweep folder
    tokens: [1.0e6]                # or flops: [1.0e13, 3.0e13]
    set: [data.max_bytes=1000000]  # overrides for every point
    ladders:                       # name -> recipe (+ overrides, + per-size overrides)
      dense: {recipe: recipes/dense/tiny.yaml}
      dense-long: {recipe: recipes/dense/tiny.yaml, tokens: [4.0e6]}  # own budgets instead of the spec's
      mixtral: {recipe: recipes/mixtral/tiny.yaml, sizes: {s1: [model.moe.expert_hidden=64]}}
    sizes:                         # size name -> overrides, crossed with every ladder
      s1: [model.d_model=32, model.n_layers=2]
    grid: {train.lr: [1.0e-3, 3.0e-3]}  # cartesian product of extra overrides
    cooldown:                      # WSD trunk + cooldown branches per ladder x size x grid (see above)
      tokens: [2.0e6, 4.0e6]       # D of each branch: tokens at its end, the trunk's included; or
                                   # flops: [C...]: each size branches at D = C / its training FLOPs
                                   # per token (every size on each IsoFLOP line; names -cdflop<C>)
      # budgets:                   # instead of tokens/flops: each budget its own sizes (an IsoFLOP
      #   - {flops: 1.0e12, sizes: [s1, s2, s3]}   # grid centred on each budget's optimum; a size
      #   - {flops: 4.0e12, sizes: [s2, s3, s4]}   # trains one trunk to its largest budget)
      compute: measured            # what a FLOPs budget counts: measured training FLOPs (default) or 6nd,
                                   # Kaplan's C = 6 N D with N the active non-embedding parameters without
                                   # the LM head (analysis.scaling's N; at tiny sizes the LM head and
                                   # attention make the measured FLOPs 2-8x 6 N D)
      decay_fraction: 0.2          # share of each branch's steps n that decays (default 0.2; a share g
                                   # of the branch step s instead is decay_fraction = g / (1 + g))
      shape: sqrt                  # 1 - sqrt (default, best in Hägele et al.) | linear

``tokens``/``flops`` points and ``cooldown`` branches can share a spec: full-schedule runs (the
recipe's schedule, cosine by default) and cooldown branches of the same token counts train the same
number of steps, so ``tokens: [2.0e6, 4.0e6]`` with ``cooldown: {tokens: [2.0e6, 4.0e6]}`` compares
them point for point (``docs/scaling/cooldown_vs_cosine.yaml``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import re
import shlex
import shutil
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
from omegaconf import OmegaConf

from analysis.run_archive import read_archive, slim_run, write_archive, write_run
from archlab.config import RecipeError, load_recipe, model_config
from archlab.costs import param_counts, training_flops_per_token
from archlab.io import write_json_atomic
from archlab.train.checkpoint import CKPT_DIR, checkpoints, step_dir_name
from archlab.train.checkpoint import MANIFEST as CKPT_MANIFEST
from archlab.train.run_folder import RUN_MARKER, SUMMARY, run_role
from tools import launch
from tools.sweep_check import design_checks

REPO_ROOT = Path(__file__).resolve().parents[1]
MANIFEST = "manifest.json"


@dataclass
class Point:
    """One run of the sweep: what to train, for how long, and what became of it."""

    name: str
    ladder: str
    size: str
    recipe: str
    overrides: list  # the point's own overrides (size, grid, common); steps and folders added at launch
    budget_kind: str  # tokens | flops
    budget: float  # a cooldown branch: its D; a stable trunk: the tokens it trains (to the last branch step)
    max_steps: int = 0
    tokens_per_step: int = 0
    flops_per_token: float = 0.0
    planned_tokens: int = 0
    planned_flops: float = 0.0
    run_dir: str = ""
    status: str = "pending"  # pending | running | finished | diverged | failed | interrupted | blocked
    returncode: Optional[int] = None
    elapsed_s: Optional[float] = None
    log: str = ""
    extra: dict = field(default_factory=dict)
    # full: a whole schedule from step 0 | stable: a WSD trunk (constant lr to the end; not a scaling
    # point) | cooldown: a branch of the stable trunk ``parent``, the scaling point (N, D = its tokens)
    role: str = "full"
    parent: Optional[str] = None
    cooldown: dict = field(default_factory=dict)  # cooldown.* of the spec and the planned branch steps
    peak_rss_bytes: Optional[int] = None  # peak resident memory of the trainer process (ru_maxrss of the child)
    cell: dict = field(default_factory=dict)  # the grid's values of this point: {key: value} (as written in the spec)
    job: dict = field(default_factory=dict)  # a SLURM job's {"launcher", "id", "folder", "state"} (tools.launch)


# --------------------------------------------------------------------------------------------
# the grid
# --------------------------------------------------------------------------------------------


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


def _budget_tag(kind: str, value: float) -> str:
    """4096 tokens -> tok4096; 2.5e13 FLOPs -> flop2.5e13 (6 significant digits)."""
    number = f"{value:.6g}".replace("e+0", "e").replace("e+", "e")
    return f"{'tok' if kind == 'tokens' else 'flop'}{number}"


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_")


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


# --------------------------------------------------------------------------------------------
# WSD cooldown branches
# --------------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------------
# running
# --------------------------------------------------------------------------------------------


class Stopped(Exception):
    """A sweep was stopped (Ctrl-C, SIGTERM) before every run ended: nothing is reported from half
    the runs; the same command resumes them."""


def plan_points(sspec: dict) -> list[Point]:
    """Every point of a sweep spec, planned (steps, folders, launch overrides), on one process."""
    out_dir = Path(sspec["out"]).resolve()
    return [plan_point(p, out_dir, 1, 8) for p in build_points(sspec)]


def write_manifest(out_dir: Path, spec: dict, points: list[Point]) -> None:
    write_json_atomic(out_dir / MANIFEST, {"kind": "archlab-sweep", "version": 1, "spec": spec,
                                           "points": [asdict(p) for p in points]}, sort_keys=False)


def read_manifest(out_dir: Path) -> Optional[dict]:
    path = Path(out_dir) / MANIFEST
    if not path.is_file():
        return None
    try:
        m = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e}); delete it to start the sweep afresh") from None
    if not isinstance(m, dict) or m.get("kind") != "archlab-sweep":
        raise ValueError(f"{path}: not an archlab sweep manifest")
    return m


def check_consistent(out_dir: Path, points: list[Point]) -> None:
    """A point already in the manifest must describe the same run, or resuming would mix runs."""
    old = read_manifest(out_dir)
    if old is None:
        return
    before = {q["name"]: q for q in old.get("points", [])}
    for p in points:
        q = before.get(p.name)
        if q and (q["recipe"] != p.recipe or q["overrides"] != p.overrides or q["max_steps"] != p.max_steps
                  or q.get("cooldown", {}) != p.cooldown):
            raise ValueError(f"sweep folder {out_dir} already holds point {p.name} with different settings "
                             f"(recipe/overrides/steps/cooldown); use a new --out folder or delete that point's run "
                             f"folder and its manifest entry")


def run_state(p: Point) -> str:
    """What the point's run folder says (:func:`run_dir_state`)."""
    return run_dir_state(p.run_dir)


def run_dir_state(run_dir) -> str:
    """What a run folder says: finished | diverged (stopped on non-finite numbers: rerunning the
    same deterministic run would diverge again) | started (resumable) | new."""
    path = Path(run_dir) / SUMMARY
    if path.is_file():
        try:
            status = json.loads(path.read_text()).get("status")
        except (ValueError, AttributeError):
            status = None
        if status == "completed":
            return "finished"
        if status == "nonfinite":
            return "diverged"
    return "started" if Path(run_dir).is_dir() else "new"


def is_done(p: Point) -> bool:
    return run_state(p) in ("finished", "diverged")


def command(p: Point, launcher: str, processes: int, accelerate_args: Sequence[str]) -> list[str]:
    """The command line that trains one point."""
    overrides = p.overrides + p.extra["launch_overrides"]
    if Path(p.run_dir).is_dir():
        overrides = overrides + ["train.resume=auto"]  # started before: continue from its checkpoint
    train = ["-m", "archlab.train", p.recipe, *overrides]
    if launcher == "python":
        return [sys.executable, *train]
    launch = [sys.executable, "-m", "accelerate.commands.launch"]
    if processes > 1 and not any(a.startswith("--config_file") for a in accelerate_args):
        launch += ["--multi_gpu", "--num_processes", str(processes)]  # gives MULTI_CPU without GPUs
    return [*launch, *accelerate_args, *train]


def _child_env(threads: Optional[int]) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    if threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)  # torch's intra-op threads
    return env


def start_point(p: Point, cmd: list[str], env: dict, via=None):
    """Launch one point in the background (a process, or a job with ``via``: ``tools.launch``), its output
    appended to its log file."""
    run = (via or launch.LocalLauncher()).start(p, cmd, env)
    p.status, p.returncode, p.elapsed_s, p.job = "running", None, None, run.job  # a job's state as last polled
    return run


def finish_point(p: Point, rc: int, elapsed: float, interrupted: bool) -> Point:
    """Record how a point ended: finished | diverged | interrupted (resumable) | failed. ``elapsed``: the
    wall time of all its invocations (a resumed run's earlier ones included)."""
    p.returncode = rc
    p.elapsed_s = round(elapsed, 2)
    state = run_state(p)
    if state in ("finished", "diverged"):
        p.status = state
    else:  # the trainer exits 0 when a signal stopped it after a checkpoint
        p.status = "interrupted" if interrupted or rc < 0 or rc == 0 else "failed"
    return p


def run_sweep(spec: dict, *, launcher: str = "python", processes: int = 1, accelerate_args: Sequence[str] = (),
              evals: int = 8, dry_run: bool = False, stop_on_failure: bool = False, jobs: int = 1,
              threads: Optional[int] = None, log=print, progress=None, check: bool = True,
              hours: Optional[float] = None, via=None) -> list[Point]:
    """Plan every point (all recipes validated before anything runs), then train the unfinished
    ones, ``jobs`` at a time. Ctrl-C (or SIGTERM to the sweep) stops the running trainers
    cleanly (each writes a checkpoint); running the same command again resumes. ``progress``,
    if given, is called with each point as it ends (e.g. to advance a progress bar). ``check=False``
    (a dry run only) lists the commands without comparing them with the runs already in the folder. ``via``:
    where the runs train (``tools.launch``; default the one :func:`tools.launch.use` set, else this machine)."""
    out_dir = Path(spec.get("out") or "runs/sweep").resolve()
    points = [plan_point(p, out_dir, processes, evals) for p in build_points(spec)]
    if check or not dry_run:
        check_consistent(out_dir, points)
    if dry_run:
        for p in points:
            log(shlex.join(command(p, launcher, processes, accelerate_args)))
        return points
    out_dir.mkdir(parents=True, exist_ok=True)
    before = {q["name"]: q for q in (read_manifest(out_dir) or {}).get("points", [])}
    for p in points:
        if p.name in before:  # keep what earlier invocations recorded
            p.returncode, p.elapsed_s = before[p.name].get("returncode"), before[p.name].get("elapsed_s")
            p.peak_rss_bytes, p.job = before[p.name].get("peak_rss_bytes"), before[p.name].get("job") or {}
        if is_done(p):
            p.status = run_state(p)
    write_manifest(out_dir, spec, points)
    todo = [p for p in points if p.status not in ("finished", "diverged")]
    log(f"sweep {out_dir}: {len(points)} points, {len(points) - len(todo)} already done")
    _schedule(todo, points, out_dir, spec, jobs, _child_env(threads), stop_on_failure, log,
              lambda p: command(p, launcher, processes, accelerate_args), progress, hours, via or launch.current())
    return points


def own_steps(p: Point) -> int:
    """The steps a point trains itself: a cooldown branch starts from its trunk's checkpoint, so only its decay."""
    start = p.cooldown.get("branch_step", 0) if p.role == "cooldown" and p.cooldown else 0
    return p.max_steps - start


def steps_done(p: Point) -> int:
    """Of :func:`own_steps`, how many the run folder holds: all when finished, else up to its latest checkpoint."""
    if is_done(p):
        return own_steps(p)
    ckpts = checkpoints(p.run_dir) if Path(p.run_dir).is_dir() else []
    if not ckpts:
        return 0
    start = p.max_steps - own_steps(p)
    return max(0, min(own_steps(p), int(ckpts[-1].name.split("_")[1]) - start))


def _time_model(runs: list[tuple[float, float]]) -> Optional[tuple[float, float]]:
    """(start seconds, FLOPs per second) of one size from its finished runs' (FLOPs, wall seconds):
    a least-squares line elapsed = start + FLOPs / speed when the runs span >= 3x in FLOPs (short
    branches are mostly process start and data loading), else None."""
    if len(runs) < 2 or max(f for f, _ in runs) < 3 * min(f for f, _ in runs):
        return None
    slope, start = np.polyfit([f for f, _ in runs], [t for _, t in runs], 1)
    return (max(0.0, float(start)), 1.0 / float(slope)) if slope > 0 else None


@dataclass
class RunTimes:
    """Each (ladder, size)'s wall time fitted as start-up + FLOPs / speed (:func:`_time_model`) to its
    finished runs, and the seconds a run still needs: its own size's model, else the fitted sizes' speed as a
    power law of the FLOPs per token (wider models use the cores better), kept within the fitted speeds (a
    trend of a few sizes is not extrapolated), with the median start-up time; None before any size is fitted."""

    models: dict  # (ladder, size) -> (start-up s, FLOPs/s)
    flops_per_token: dict  # (ladder, size) -> training FLOPs per token

    @classmethod
    def fit(cls, points: list[Point], elapsed: dict) -> RunTimes:
        """``elapsed``: point name -> recorded wall seconds (the manifest's ``elapsed_s``)."""
        timed: dict[tuple, list] = {}
        for p in points:
            if elapsed.get(p.name) and run_state(p) == "finished":
                timed.setdefault((p.ladder, p.size), []).append((own_flops(p), float(elapsed[p.name])))
        models = {k: m for k, runs in timed.items() if (m := _time_model(runs)) is not None}
        return cls(models, {(p.ladder, p.size): p.flops_per_token for p in points})

    def seconds(self, p: Point, flops_left: Optional[float] = None) -> Optional[float]:
        key = (p.ladder, p.size)
        if key in self.models:
            start, speed = self.models[key]
        elif self.models:  # wider models run more FLOPs a second: the fitted sizes' speed trend, log-log
            start = float(np.median([m[0] for m in self.models.values()]))
            x = np.log([self.flops_per_token[k] for k in self.models])
            y = np.log([m[1] for m in self.models.values()])
            if np.ptp(x) > 0:
                slope, icpt = np.polyfit(x, y, 1)
                speed = float(np.exp(np.clip(icpt + slope * math.log(p.flops_per_token), y.min(), y.max())))
            else:  # one fitted size (or several of one width): its speed
                speed = float(np.exp(np.median(y)))
        else:
            return None
        left = own_flops(p) * (1 - steps_done(p) / max(1, own_steps(p))) if flops_left is None else flops_left
        return start + left / speed


def own_flops(p: Point) -> float:
    """The training FLOPs of :func:`own_steps`."""
    return own_steps(p) * p.tokens_per_step * p.flops_per_token


def sweep_status(spec: dict, jobs: int = 1, processes: int = 1, evals: int = 8) -> dict:
    """Where a sweep stands, from its folder and manifest, training nothing: points finished, started and
    to go; the training FLOPs of each run's own steps, done and left; each (ladder, size)'s speed and
    start-up time fitted to its finished runs' recorded wall times (:class:`RunTimes`); and the time
    left at ``jobs`` runs at a time."""
    out_dir = Path(spec.get("out") or "runs/sweep").resolve()
    points = [plan_point(p, out_dir, processes, evals) for p in build_points(spec)]
    recorded = {q["name"]: q for q in (read_manifest(out_dir) or {}).get("points", [])}
    times = RunTimes.fit(points, {n: q.get("elapsed_s") for n, q in recorded.items()})
    models, fpt = times.models, times.flops_per_token
    rows, left = [], []
    for p in points:
        flops, state = own_flops(p), run_state(p)
        done = steps_done(p) / max(1, own_steps(p)) * flops
        job = dict(recorded.get(p.name, {}).get("job") or {})
        if job and state not in ("finished", "diverged"):  # the scheduler's word on a run still to finish
            job["state"] = launch.recorded_state(job)
        rows.append({"name": p.name, "ladder": p.ladder, "size": p.size, "state": state, "flops": flops,
                     "flops_done": done, "flops_per_token": p.flops_per_token, "job": job})
        if state not in ("finished", "diverged"):
            left.append(times.seconds(p, flops - done))
    seconds = sum(left) / jobs if models and None not in left else None
    count = {s: sum(r["state"] == s for r in rows) for s in ("finished", "diverged", "started")}
    return {"out": str(out_dir), "points": len(rows), **count,
            "flops_total": sum(r["flops"] for r in rows), "flops_done": sum(r["flops_done"] for r in rows),
            "speed": {f"{k[0]}/{k[1]}": {"flops_per_s": m[1], "start_s": m[0]}
                      for k, m in sorted(models.items(), key=lambda km: fpt[km[0]])},
            "jobs": jobs, "seconds_left": seconds, "rows": rows}


def status_text(st: dict) -> str:
    """:func:`sweep_status` as lines for the terminal."""
    to_go = st["points"] - st["finished"] - st["diverged"]
    lines = [f"sweep {st['out']}: {st['points']} points: {st['finished']} finished, {st['diverged']} diverged, "
             f"{to_go} to go ({st['started']} of them started)",
             f"training FLOPs of each run's own steps (a cooldown branch: its decay only): {st['flops_done']:.3g} of "
             f"{st['flops_total']:.3g} done ({st['flops_done'] / max(st['flops_total'], 1e-30):.0%})"]
    if st["speed"]:
        lines.append("speed fitted to the finished runs (FLOPs/s per run + start-up s): "
                     + ", ".join(f"{k} {v['flops_per_s']:.3g} + {v['start_s']:.0f} s" for k, v in st["speed"].items()))
    if st["seconds_left"] is not None:
        lines.append(f"time left at --jobs {st['jobs']}: about {st['seconds_left'] / 3600:.2g} h (each run by its "
                     "size's fit, or the fitted sizes' speed trend; an estimate, not a promise)")
    elif to_go:
        lines.append("time left: unknown until some size has finished runs of >= 3x different lengths "
                     "(their wall times give its speed and start-up time)")
    jobs = [r for r in st["rows"] if r.get("job") and r["state"] not in ("finished", "diverged")]
    if jobs:
        lines.append("SLURM jobs of the runs to go (the scheduler's state): "
                     + ", ".join(f"{r['name']} {r['job']['id']} {r['job']['state']}" for r in jobs))
    return "\n".join(lines)


def _fits(p: Point, queue: list[Point], times: Optional[RunTimes], deadline: Optional[float]) -> bool:
    """Whether ``p`` (a stable trunk: with its branches still queued, which need its checkpoints) ends before
    ``deadline`` at the measured speeds; True without a deadline or before any speed is measured."""
    if deadline is None or times is None:
        return True
    unit = [p] + ([q for q in queue if q.parent == p.name] if p.role == "stable" else [])
    seconds = [times.seconds(q) for q in unit]
    return None in seconds or time.time() + sum(seconds) <= deadline


def _next_point(queue: list[Point], points: list[Point], deadline: Optional[float]) -> Optional[Point]:
    """The first queued point that is ready and, before ``deadline``, fits at the speeds measured so far."""
    times = None if deadline is None else RunTimes.fit(points, {q.name: q.elapsed_s for q in points})
    return next((q for q in queue if is_ready(q) and _fits(q, queue, times, deadline)), None)


def _schedule(todo, points, out_dir, spec, jobs, env, stop_on_failure, log, make_cmd, progress=None,
              hours: Optional[float] = None, via=None) -> None:
    """Keep up to ``jobs`` trainers running until ``todo`` is done or the sweep is stopped. A point
    starts when it is ready (:func:`is_ready`: a branch waits for its trunk's checkpoint) and, with
    ``hours``, when it fits (:func:`_fits`); when nothing runs and nothing left is ready, the rest is
    marked blocked; when nothing runs and what is ready does not fit, the sweep ends, the rest pending."""
    running: dict[str, tuple] = {}  # name -> (point, run (tools.launch), start time)
    queue = list(todo)
    stopping = False
    deadline = None if hours is None else time.time() + hours * 3600

    def forward_sigterm(*_):
        nonlocal stopping
        stopping = True
        for _, proc, _ in running.values():
            proc.stop()

    previous = signal.signal(signal.SIGTERM, forward_sigterm)
    n, total = 0, len(todo)
    try:
        while queue or running:
            try:
                while queue and len(running) < jobs and not stopping:
                    p = _next_point(queue, points, deadline)
                    if p is None:
                        break
                    queue.remove(p)
                    n += 1
                    branch = (f" (branch of {p.parent}: {p.cooldown['decay_steps']} decay steps from step "
                              f"{p.cooldown['branch_step']})" if p.role == "cooldown" and p.cooldown else "")
                    log(f"[{n}/{total}] {p.name}: {p.max_steps} steps{branch}, {p.planned_tokens:.3g} tokens, "
                        f"{p.planned_flops:.3g} FLOPs")
                    # a resumed run (its folder exists) adds this invocation's wall time to the earlier ones'
                    prior = (p.elapsed_s or 0.0) if Path(p.run_dir).is_dir() else 0.0
                    running[p.name] = (p, start_point(p, make_cmd(p), env, via), time.time() - prior)
                    if running[p.name][1].describe():
                        log(f"    {p.name}: {running[p.name][1].describe()}")
                    write_manifest(out_dir, spec, points)
                for name, (p, proc, t0) in list(running.items()):
                    rc, peak_rss = proc.poll_with_peak_rss()
                    if rc is None:
                        continue
                    del running[name]
                    finish_point(p, rc, time.time() - t0, stopping)
                    if peak_rss is not None:  # a resumed run: the peak of all its invocations
                        p.peak_rss_bytes = max(peak_rss, p.peak_rss_bytes or 0)
                    write_manifest(out_dir, spec, points)
                    log(f"    {p.name} -> {p.status} (exit {rc}, {p.elapsed_s:.0f} s)"
                        + ("" if p.status == "finished" else f"; see {p.log}"))
                    if progress is not None:
                        progress(p)
                    if p.status == "failed" and stop_on_failure:
                        stopping = True
                # runs that ended in this pass freed their slots after the start loop above: stop only if
                # something is ready but nothing ready fits
                if (deadline is not None and not running and not stopping and any(map(is_ready, queue))
                        and _next_point(queue, points, deadline) is None):
                    log(f"stopping: the {len(queue)} runs left would not end within --hours {hours:g} at the "
                        "measured speeds; run the same command again to go on")
                    break
                if not running and not stopping and queue and not any(is_ready(q) for q in queue):
                    for q in queue:
                        q.status = "blocked"
                        log(f"    {q.name} -> blocked: {q.cooldown['branch_from']} does not exist "
                            f"(see the stable trunk {q.parent})")
                    queue.clear()
                    write_manifest(out_dir, spec, points)
                if running:
                    time.sleep(0.5)
                elif stopping:
                    break
            except KeyboardInterrupt:  # Ctrl-C reached the trainers too: let them checkpoint and exit
                if not stopping:
                    log("stopping: waiting for the running trainers to write their checkpoints")
                    for _, proc, _ in running.values():
                        proc.interrupted()
                stopping = True
    finally:
        signal.signal(signal.SIGTERM, previous)
    if stopping and any(p.status in ("pending", "interrupted") for p in points):
        log("sweep stopped; run the same command again to resume")


# --------------------------------------------------------------------------------------------
# archive: a sweep's finished runs kept small (to commit), and restored from it
# --------------------------------------------------------------------------------------------


def _archivable(points: list[dict], done: set) -> list[str]:
    """The points worth keeping: every finished (or diverged) run, but a stable trunk only once all its branches
    are done too; without its checkpoints a restored trunk could not start the branches still to train."""
    children: dict[str, list[str]] = {}
    for q in points:
        if q.get("parent"):
            children.setdefault(q["parent"], []).append(q["name"])
    return [q["name"] for q in points if q["name"] in done
            and all(c in done for c in children.get(q["name"], []))]


def _legacy_runs(folder: Path) -> dict[str, Path]:
    """The run folders of an archive written by an earlier archlab (one plain folder per run)."""
    return {d.name: d for d in sorted(Path(folder).iterdir()) if (d / RUN_MARKER).is_file()} \
        if Path(folder).is_dir() else {}


def _archived_state(files: dict[str, str]) -> str:
    """finished | diverged | not archived, from an archived run's summary (as :func:`run_dir_state` reads it)."""
    try:
        status = json.loads(files.get(SUMMARY, "")).get("status")
    except (ValueError, AttributeError):
        status = None
    return {"completed": "finished", "nonfinite": "diverged"}.get(status, "not archived")


def archive_sweep(spec: dict, dest: Path) -> tuple[int, int]:
    """Add the sweep's finished runs, slimmed (:func:`analysis.run_archive.slim_run`), to ``dest/runs.tar.xz``, an
    archive that ``analysis.scaling`` reads like the sweep folder and ``--restore`` brings back. Runs already in
    ``dest`` stay (those of an earlier archlab's plain run folders are packed and their folders removed); the
    manifest records every point the spec plans, its ``run_dir`` relative, with status ``finished``/``diverged``
    for the archived ones and ``not archived`` for the rest, and the wall times the sweep folder's manifest (or an
    earlier archive's) recorded. Returns (runs archived now, runs in the archive)."""
    out_dir = Path(spec.get("out") or "runs/sweep").resolve()
    if not out_dir.is_dir():
        raise ValueError(f"--archive: the sweep folder {out_dir} does not exist; run the sweep first")
    points = [plan_point(p, out_dir, 1, 8) for p in build_points(spec)]
    dest = Path(dest)
    recorded = {q["name"]: q for m in (read_manifest(dest), read_manifest(out_dir))  # the sweep folder's win
                for q in (m or {}).get("points", [])}
    done = {p.name for p in points if run_state(p) in ("finished", "diverged")}
    legacy = _legacy_runs(dest)
    runs = {**read_archive(dest), **{name: slim_run(d) for name, d in legacy.items()}}
    new = _archivable([asdict(p) for p in points], done)
    runs.update({name: slim_run(out_dir / name) for name in new})
    write_archive(dest, runs)
    for d in legacy.values():  # now in the archive
        shutil.rmtree(d)
    kept = []
    for p in points:
        q = {**asdict(p), **{k: recorded[p.name].get(k) for k in ("returncode", "elapsed_s", "peak_rss_bytes")
                             if p.name in recorded}}
        kept.append({**q, "run_dir": p.name, "log": "", "status": _archived_state(runs.get(p.name, {}))})
    write_json_atomic(dest / MANIFEST, {"kind": "archlab-sweep", "version": 1, "spec": spec, "points": kept},
                      sort_keys=False)
    return len(new), sum(q["status"] != "not archived" for q in kept)


def _without_paths(cooldown: dict) -> dict:
    """A point's cooldown settings less the trunk checkpoint's path (the archive was written elsewhere)."""
    return {k: v for k, v in cooldown.items() if k != "branch_from"}


def restore_sweep(spec: dict, src: Path) -> int:
    """Write the archived runs of ``src`` (written by :func:`archive_sweep`, or an earlier archlab's plain run
    folders) that the sweep folder lacks into it as run folders, with their recorded wall times, so that the sweep
    trains only the rest. The archive must hold the spec's
    points with the same settings; a spec narrowed to part of the archived one (``--grid train.seed=0``) restores
    its own points only. Returns the runs restored."""
    src = Path(src)
    archived = read_manifest(src)
    if archived is None:
        raise ValueError(f"--restore {src}: no {MANIFEST} there (an archive written by --archive)")
    out_dir = Path(spec.get("out") or "runs/sweep").resolve()
    points = [plan_point(p, out_dir, 1, 8) for p in build_points(spec)]
    by_name = {q["name"]: q for q in archived["points"]}
    if not set(by_name) & {p.name for p in points}:
        some = sorted(by_name)[:3]
        raise ValueError(f"--restore {src}: the archive holds none of the points this spec plans (it holds "
                         f"{', '.join(some)}{', ...' if len(by_name) > 3 else ''}): not its archive")
    for p in points:
        q = by_name.get(p.name)
        if q and (q["recipe"] != p.recipe or q["overrides"] != p.overrides or q["max_steps"] != p.max_steps
                  or _without_paths(q.get("cooldown", {})) != _without_paths(p.cooldown)):
            raise ValueError(f"--restore {src}: point {p.name} was archived with other settings "
                             "(recipe/overrides/steps/cooldown) than this spec's")
    check_consistent(out_dir, points)
    before = {q["name"]: q for q in (read_manifest(out_dir) or {}).get("points", [])}
    packed, legacy = read_archive(src), _legacy_runs(src)
    restored = 0
    for p in points:
        q = by_name.get(p.name)
        if q is None or q["status"] not in ("finished", "diverged") or Path(p.run_dir).exists():
            continue
        if p.name in legacy:
            shutil.copytree(legacy[p.name], p.run_dir)
        elif p.name in packed:
            write_run(packed[p.name], Path(p.run_dir))
        else:
            raise ValueError(f"--restore {src}: its manifest says {p.name} is archived, but neither its "
                             f"runs.tar.xz nor a run folder holds it")
        p.status, p.returncode, p.elapsed_s = q["status"], q.get("returncode"), q.get("elapsed_s")
        p.peak_rss_bytes = q.get("peak_rss_bytes")
        before.pop(p.name, None)
        restored += 1
    for p in points:  # keep what the sweep folder recorded of the points not restored
        if p.name in before:
            p.status, p.returncode = before[p.name].get("status", p.status), before[p.name].get("returncode")
            p.elapsed_s, p.peak_rss_bytes = before[p.name].get("elapsed_s"), before[p.name].get("peak_rss_bytes")
    out_dir.mkdir(parents=True, exist_ok=True)
    write_manifest(out_dir, spec, points)
    return restored


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def _load_spec(path: Optional[str]) -> dict:
    if path is None:
        return {}
    p = Path(path)
    if not p.is_file():
        raise RecipeError(f"--spec {path}: file not found")
    try:
        spec = OmegaConf.to_container(OmegaConf.load(p), resolve=True)
    except Exception as e:
        raise RecipeError(f"--spec {path}: not valid YAML ({e})") from None
    if not isinstance(spec, dict):
        raise RecipeError(f"--spec {path}: a sweep spec is a YAML mapping")
    unknown = set(spec) - {"out", "tokens", "flops", "cooldown", "set", "ladders", "sizes", "grid", "description",
                           "check"}
    if unknown:
        raise RecipeError(f"--spec {path}: unknown keys {sorted(unknown)}; valid: out, tokens, flops, cooldown, set, "
                          "ladders, sizes, grid, description, check")
    return spec


def _parse_grid(items: Sequence[str]) -> dict:
    grid = {}
    for item in items:
        if "=" not in item:
            raise RecipeError(f"--grid {item!r}: expected key=v1,v2,... (e.g. train.lr=1e-3,3e-3)")
        k, v = item.split("=", 1)
        grid[k.strip()] = [x for x in v.split(",") if x != ""]
    return grid


def spec_from_args(args) -> dict:
    spec = _load_spec(args.spec)
    if args.recipes:
        ladders = dict(spec.get("ladders") or {})
        for r in args.recipes:
            recipe = Path(r)
            ladder = recipe.stem if recipe.parent.name in ("", ".") else f"{recipe.parent.name}-{recipe.stem}"
            ladders[_safe(ladder)] = {"recipe": r}
        spec["ladders"] = ladders
    if args.tokens or args.flops:
        spec["tokens"], spec["flops"] = list(args.tokens or []), list(args.flops or [])
    if args.set:
        spec["set"] = list(spec.get("set") or []) + list(args.set)
    if args.grid:
        spec["grid"] = {**(spec.get("grid") or {}), **_parse_grid(args.grid)}
    if args.out:
        spec["out"] = args.out
    return spec


def _design_check(spec: dict, args) -> Optional[int]:
    """The design check before a sweep trains (:mod:`tools.sweep_check`), printed: the exit status when the
    sweep stops here (``--check``: 2 with problems, else 0; problems without ``--yes``: 2), else None. A sweep
    folder whose manifest exists has started before (checked then, or trained with ``--yes``): it resumes."""
    out_dir = Path(spec.get("out") or "runs/sweep").resolve()
    if not args.check and read_manifest(out_dir) is not None:
        print(f"design check: skipped ({out_dir} holds a sweep that started before; it resumes)")
        return None
    points = [plan_point(p, out_dir, args.num_processes, args.evals) for p in build_points(spec)]
    checks, text = design_checks(spec, points)
    print(text, flush=True)
    n = sum(len(c.problems) for c in checks)
    if args.check:
        return 2 if n else 0
    if n and not args.yes:
        print(f"error: the design check found {n} problem(s), listed above: change the spec as each says (and "
              "check it again with --check), or add --yes to train it anyway", file=sys.stderr)
        return 2
    if n:
        print(f"design check: {n} problem(s); --yes given, training anyway")
    return None


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.sweep", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--spec", help="YAML sweep spec (ladders, sizes, grid, budgets, out)")
    ap.add_argument("--recipes", nargs="+", metavar="RECIPE", help="recipe files, one ladder entry each")
    ap.add_argument("--tokens", nargs="+", type=float, metavar="T", help="token budgets per run (e.g. 1e6 4e6)")
    ap.add_argument("--flops", nargs="+", type=float, metavar="C", help="training FLOPs budgets per run")
    ap.add_argument("--set", nargs="+", metavar="KEY=VALUE", help="overrides for every point")
    ap.add_argument("--grid", nargs="+", metavar="KEY=V1,V2", help="cartesian grid of overrides")
    ap.add_argument("--out", help="sweep folder (default: the spec's 'out', else runs/sweep)")
    ap.add_argument("--launcher", choices=["python", "accelerate", "slurm"], default="python",
                    help="run each point with python -m archlab.train or accelerate launch on this machine, or as "
                         "one SLURM job (submitit; --slurm-* options; --jobs: jobs queued at once)")
    ap.add_argument("--num-processes", type=int, default=1, help="processes per run (accelerate launcher)")
    ap.add_argument("--accelerate-args", default="", help="extra arguments for accelerate launch (quoted)")
    ap.add_argument("--evals", type=int, default=8, help="validation points per run (default 8)")
    ap.add_argument("--jobs", type=int, default=1, help="points trained at the same time (default 1)")
    ap.add_argument("--threads", type=int, help="torch threads per trainer (OMP_NUM_THREADS; default: torch's)")
    ap.add_argument("--hours", type=float, metavar="H",
                    help="start no run (a stable trunk: with its branches) that the measured speeds say would not end "
                         "within H hours of the start, so that a time-limited machine ends without half-trained runs")
    ap.add_argument("--stop-on-failure", action="store_true", help="stop at the first failed point")
    ap.add_argument("--dry-run", action="store_true", help="print the planned commands, run nothing")
    ap.add_argument("--check", action="store_true",
                    help="run the design check (near-unigram points, IsoFLOP budgets, the expected interval of a; "
                         "spec key check:, see tools/sweep_check.py), print it and train nothing: exit 2 when it "
                         "finds a problem. A new sweep runs it before training and refuses to start on a problem")
    ap.add_argument("--yes", action="store_true", help="train even when the design check finds problems")
    ap.add_argument("--status", action="store_true",
                    help="print where the sweep stands (points and FLOPs done, measured speed, time left at --jobs) "
                         "and train nothing")
    ap.add_argument("--archive", metavar="DIR",
                    help="add the finished runs, slimmed to what the analysis reads (no checkpoints), to DIR's "
                         "runs.tar.xz, a small folder to commit that analysis.scaling reads like the sweep folder, "
                         "and train nothing")
    ap.add_argument("--restore", metavar="DIR",
                    help="first write the runs archived in DIR (--archive) that the sweep folder lacks into it as "
                         "run folders, then train (or --status) as usual: only the rest trains")
    launch.add_arguments(ap)
    args = ap.parse_args(argv)
    try:
        via = launch.from_args(args) if not (args.status or args.archive or args.dry_run) else None
        if args.num_processes < 1:
            raise RecipeError(f"--num-processes {args.num_processes}: must be >= 1")
        if args.jobs < 1 or (args.threads is not None and args.threads < 1):
            raise RecipeError("--jobs and --threads must be >= 1")
        if args.hours is not None and not args.hours > 0:
            raise RecipeError(f"--hours {args.hours}: must be > 0 (the time the sweep may take)")
        if args.hours is not None and (args.status or args.archive or args.dry_run):
            raise RecipeError("--hours limits a sweep that trains; --status, --archive and --dry-run train nothing")
        if args.check and (args.status or args.archive or args.dry_run):
            raise RecipeError("--check prints the design check and trains nothing; use it without --status, "
                              "--archive and --dry-run")
        if args.num_processes > 1 and args.launcher != "accelerate":
            raise RecipeError("--num-processes > 1 needs --launcher accelerate")
        if args.archive:
            copied, kept = archive_sweep(spec_from_args(args), Path(args.archive))
            print(f"archived {copied} finished runs to {args.archive} ({kept} there in all; "
                  f"restore them with --restore {args.archive})")
            return 0
        if args.restore:
            n = restore_sweep(spec_from_args(args), Path(args.restore))
            print(f"restored {n} finished runs from {args.restore}")
        if args.status:
            print(status_text(sweep_status(spec_from_args(args), jobs=args.jobs, processes=args.num_processes,
                                           evals=args.evals)))
            return 0
        if args.check or not args.dry_run:
            refused = _design_check(spec_from_args(args), args)
            if refused is not None:
                return refused
        points = run_sweep(spec_from_args(args), launcher="accelerate" if args.launcher == "accelerate" else "python",
                           via=via, processes=args.num_processes,
                           accelerate_args=shlex.split(args.accelerate_args), evals=args.evals,
                           dry_run=args.dry_run, stop_on_failure=args.stop_on_failure, jobs=args.jobs,
                           threads=args.threads, hours=args.hours)
    except (RecipeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        return 0
    bad = [p for p in points if p.status != "finished"]
    for p in bad:
        print(f"not finished: {p.name} ({p.status}, exit {p.returncode}); log: {p.log}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
