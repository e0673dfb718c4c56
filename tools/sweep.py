"""Scaling sweeps: train a grid of recipes x sizes x overrides at token or FLOP budgets.

    # a family's size ladder at two token budgets
    python -m tools.sweep --recipes recipes/dense/tiny.yaml recipes/dense/mini.yaml \\
        --tokens 2e6 8e6 --out runs/sweep-dense
    # a sweep described in a file (ladders x sizes x grid x budgets), e.g. the committed demo
    python -m tools.sweep --spec docs/scaling/sweep.yaml

Each point of the grid is one run of ``python -m archlab.train`` (or ``accelerate launch -m
archlab.train`` with ``--launcher accelerate``) in a subprocess, with its run folder
``<out>/<point name>/``. ``train.max_steps`` comes from the budget:

    tokens budget T:  max_steps = ceil(T / tokens_per_step)
    FLOPs budget C:   max_steps = ceil(C / (training_flops_per_token * tokens_per_step))

with tokens_per_step = seq_len * micro_batch_size * grad_accum * processes and the FLOPs per
token from ``archlab.costs``. The sweep is resumable: a point whose run folder holds a
``summary.json`` of a completed run is skipped (so is one that stopped on non-finite numbers:
rerunning it would diverge again; it is reported as diverged); a started but unfinished one
continues from its last checkpoint (``train.resume=auto``). ``--jobs N`` trains N points at once.
``<out>/manifest.json`` records every point (recipe, overrides, budget, steps, status, exit code,
log file) and is rewritten atomically after each change; ``<out>/logs/<point>.log`` holds each
run's output.

Spec file keys (YAML; all but the recipes and one budget are optional):

    out: runs/sweep-demo           # sweep folder
    tokens: [1.0e6]                # or flops: [1.0e13, 3.0e13]
    set: [data.max_bytes=1000000]  # overrides for every point
    ladders:                       # name -> recipe (+ overrides, + per-size overrides)
      dense: {recipe: recipes/dense/tiny.yaml}
      mixtral: {recipe: recipes/mixtral/tiny.yaml, sizes: {s1: [model.moe.expert_hidden=64]}}
    sizes:                         # size name -> overrides, crossed with every ladder
      s1: [model.d_model=32, model.n_layers=2]
    grid: {train.lr: [1.0e-3, 3.0e-3]}  # cartesian product of extra overrides
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from omegaconf import OmegaConf

from archlab.config import RecipeError, load_recipe, model_config
from archlab.costs import training_flops_per_token
from archlab.io import write_json_atomic

REPO_ROOT = Path(__file__).resolve().parents[1]
MANIFEST = "manifest.json"
SUMMARY = "summary.json"  # written by the trainer when a run ends: its presence = finished


@dataclass
class Point:
    """One run of the sweep: what to train, for how long, and what became of it."""

    name: str
    ladder: str
    size: str
    recipe: str
    overrides: list  # the point's own overrides (size, grid, common); steps and folders added at launch
    budget_kind: str  # tokens | flops
    budget: float
    max_steps: int = 0
    tokens_per_step: int = 0
    flops_per_token: float = 0.0
    planned_tokens: int = 0
    planned_flops: float = 0.0
    run_dir: str = ""
    status: str = "pending"  # pending | running | finished | failed | interrupted
    returncode: Optional[int] = None
    elapsed_s: Optional[float] = None
    log: str = ""
    extra: dict = field(default_factory=dict)


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


def build_points(spec: dict) -> list[Point]:
    """Expand a sweep spec (ladders x sizes x grid x budgets) into named points."""
    ladders = spec.get("ladders") or {}
    if not ladders:
        raise RecipeError("sweep: no recipes given (use --recipes FILE... or a spec with 'ladders:')")
    budgets = [("tokens", float(v)) for v in spec.get("tokens") or []]
    budgets += [("flops", float(v)) for v in spec.get("flops") or []]
    if not budgets:
        raise RecipeError("sweep: no budget given "
                          "(use --tokens N... or --flops C..., or 'tokens:'/'flops:' in the spec)")
    for kind, v in budgets:
        if not v > 0:
            raise RecipeError(f"sweep: {kind} budget {v!r} must be positive")
    common = _as_override_list(spec.get("set"), "set")
    sizes = spec.get("sizes") or {}
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
                for kind, value in budgets:
                    tags = [ladder, size] + [_grid_tag(o) for o in grid_set] + [_budget_tag(kind, value)]
                    name = _safe("-".join(t for t in tags if t))
                    points.append(Point(name=name, ladder=ladder, size=size, recipe=str(recipe),
                                        overrides=common + ladder_set + size_set + grid_set,
                                        budget_kind=kind, budget=value))
    names = [p.name for p in points]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise RecipeError(f"sweep: point names collide ({', '.join(dupes)}); give ladders or sizes distinct names")
    return points


def _user_sets(overrides: Sequence[str], key: str) -> bool:
    return any(o.split("=", 1)[0].strip() == key for o in overrides)


def plan_point(p: Point, out_dir: Path, processes: int, evals: int) -> Point:
    """Fill in steps from the budget; validate the point's recipe (raises RecipeError)."""
    cfg = load_recipe(p.recipe, p.overrides)
    t = cfg.train
    p.tokens_per_step = int(t.seq_len * t.micro_batch_size * t.grad_accum * processes)
    p.flops_per_token = float(training_flops_per_token(model_config(cfg), t.seq_len))
    if p.budget_kind == "tokens":
        p.max_steps = max(1, math.ceil(p.budget / p.tokens_per_step))
    else:
        p.max_steps = max(1, math.ceil(p.budget / (p.flops_per_token * p.tokens_per_step)))
    p.planned_tokens = p.max_steps * p.tokens_per_step
    p.planned_flops = p.planned_tokens * p.flops_per_token
    p.run_dir = str(out_dir / p.name)
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
    defaults = {
        # warmup: the recipe's, but at most a tenth of a short run
        "train.warmup_steps": min(int(cfg.train.warmup_steps), max(0, steps // 10)),
        # about `evals` validation points per run, for the loss-against-tokens curves
        "train.eval_every": max(1, steps // max(1, evals)),
        "train.log_every": max(1, min(int(cfg.train.log_every), steps // 10 or 1)),
        # a checkpoint half-way and the final one, the two that keep_last=2 keeps (routing
        # saturation compares checkpoints); (steps+1)//2 so that no second one lands just before the end
        "train.ckpt_every": max(1, (steps + 1) // 2),
    }
    for key, value in defaults.items():
        if not _user_sets(p.overrides, key):
            extra.append(f"{key}={value}")
    return extra


# --------------------------------------------------------------------------------------------
# running
# --------------------------------------------------------------------------------------------


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
        if q and (q["recipe"] != p.recipe or q["overrides"] != p.overrides or q["max_steps"] != p.max_steps):
            raise ValueError(f"sweep folder {out_dir} already holds point {p.name} with different settings "
                             f"(recipe/overrides/steps); use a new --out folder or delete that point's run folder "
                             f"and its manifest entry")


def run_state(p: Point) -> str:
    """What the run folder says: finished | diverged (stopped on non-finite numbers: rerunning the
    same deterministic run would diverge again) | started (resumable) | new."""
    path = Path(p.run_dir) / SUMMARY
    if path.is_file():
        try:
            status = json.loads(path.read_text()).get("status")
        except (ValueError, AttributeError):
            status = None
        if status == "completed":
            return "finished"
        if status == "nonfinite":
            return "diverged"
    return "started" if Path(p.run_dir).is_dir() else "new"


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


def start_point(p: Point, cmd: list[str], env: dict) -> subprocess.Popen:
    """Launch one point in the background, its output appended to its log file."""
    Path(p.log).parent.mkdir(parents=True, exist_ok=True)
    with open(p.log, "a") as log:
        log.write(f"\n$ {shlex.join(cmd)}\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=os.getcwd())
    p.status, p.returncode, p.elapsed_s = "running", None, None
    return proc


def finish_point(p: Point, rc: int, elapsed: float, interrupted: bool) -> Point:
    """Record how a point ended: finished | diverged | interrupted (resumable) | failed."""
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
              threads: Optional[int] = None, log=print) -> list[Point]:
    """Plan every point (all recipes validated before anything runs), then train the unfinished
    ones, ``jobs`` at a time. Ctrl-C (or SIGTERM to the sweep) stops the running trainers
    cleanly (each writes a checkpoint); running the same command again resumes."""
    out_dir = Path(spec.get("out") or "runs/sweep").resolve()
    points = [plan_point(p, out_dir, processes, evals) for p in build_points(spec)]
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
        if is_done(p):
            p.status = run_state(p)
    write_manifest(out_dir, spec, points)
    todo = [p for p in points if p.status not in ("finished", "diverged")]
    log(f"sweep {out_dir}: {len(points)} points, {len(points) - len(todo)} already done")
    _schedule(todo, points, out_dir, spec, jobs, _child_env(threads), stop_on_failure, log,
              lambda p: command(p, launcher, processes, accelerate_args))
    return points


def _schedule(todo, points, out_dir, spec, jobs, env, stop_on_failure, log, make_cmd) -> None:
    """Keep up to ``jobs`` trainers running until ``todo`` is done or the sweep is stopped."""
    running: dict[str, tuple[Point, subprocess.Popen, float]] = {}
    queue = list(todo)
    stopping = False

    def forward_sigterm(*_):
        nonlocal stopping
        stopping = True
        for _, proc, _ in running.values():
            proc.send_signal(signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, forward_sigterm)
    n, total = 0, len(todo)
    try:
        while queue or running:
            try:
                while queue and len(running) < jobs and not stopping:
                    p = queue.pop(0)
                    n += 1
                    log(f"[{n}/{total}] {p.name}: {p.max_steps} steps, {p.planned_tokens:.3g} tokens, "
                        f"{p.planned_flops:.3g} FLOPs")
                    running[p.name] = (p, start_point(p, make_cmd(p), env), time.time())
                    write_manifest(out_dir, spec, points)
                for name, (p, proc, t0) in list(running.items()):
                    rc = proc.poll()
                    if rc is None:
                        continue
                    del running[name]
                    finish_point(p, rc, time.time() - t0, stopping)
                    write_manifest(out_dir, spec, points)
                    log(f"    {p.name} -> {p.status} (exit {rc}, {p.elapsed_s:.0f} s)"
                        + ("" if p.status == "finished" else f"; see {p.log}"))
                    if p.status == "failed" and stop_on_failure:
                        stopping = True
                if running:
                    time.sleep(0.5)
                elif stopping:
                    break
            except KeyboardInterrupt:  # Ctrl-C reached the trainers too: let them checkpoint and exit
                if not stopping:
                    log("stopping: waiting for the running trainers to write their checkpoints")
                stopping = True
    finally:
        signal.signal(signal.SIGTERM, previous)
    if stopping and any(p.status in ("pending", "interrupted") for p in points):
        log("sweep stopped; run the same command again to resume")


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
    unknown = set(spec) - {"out", "tokens", "flops", "set", "ladders", "sizes", "grid", "description"}
    if unknown:
        raise RecipeError(f"--spec {path}: unknown keys {sorted(unknown)}; valid: out, tokens, flops, set, "
                          "ladders, sizes, grid, description")
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
    ap.add_argument("--launcher", choices=["python", "accelerate"], default="python",
                    help="run each point with python -m archlab.train or accelerate launch")
    ap.add_argument("--num-processes", type=int, default=1, help="processes per run (accelerate launcher)")
    ap.add_argument("--accelerate-args", default="", help="extra arguments for accelerate launch (quoted)")
    ap.add_argument("--evals", type=int, default=8, help="validation points per run (default 8)")
    ap.add_argument("--jobs", type=int, default=1, help="points trained at the same time (default 1)")
    ap.add_argument("--threads", type=int, help="torch threads per trainer (OMP_NUM_THREADS; default: torch's)")
    ap.add_argument("--stop-on-failure", action="store_true", help="stop at the first failed point")
    ap.add_argument("--dry-run", action="store_true", help="print the planned commands, run nothing")
    args = ap.parse_args(argv)
    try:
        if args.num_processes < 1:
            raise RecipeError(f"--num-processes {args.num_processes}: must be >= 1")
        if args.jobs < 1 or (args.threads is not None and args.threads < 1):
            raise RecipeError("--jobs and --threads must be >= 1")
        if args.num_processes > 1 and args.launcher != "accelerate":
            raise RecipeError("--num-processes > 1 needs --launcher accelerate")
        points = run_sweep(spec_from_args(args), launcher=args.launcher, processes=args.num_processes,
                           accelerate_args=shlex.split(args.accelerate_args), evals=args.evals,
                           dry_run=args.dry_run, stop_on_failure=args.stop_on_failure, jobs=args.jobs,
                           threads=args.threads)
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
