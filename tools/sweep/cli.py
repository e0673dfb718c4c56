"""Scaling sweeps: train a grid of recipes x sizes x overrides at token or FLOP budgets.

    # the quick path: a scaling smoke test that fits all three approaches in minutes (tools/sweep/quick.yaml)
    python -m tools.sweep --quick --jobs 2 --threads 1
    python -m analysis.scaling runs/sweep-quick --out runs/sweep-quick/report
    # the smallest sweep of the CPU study's setting that fits all three approaches
    python -m tools.sweep --spec docs/scaling/design/sweep-smallest.yaml --jobs 2 --threads 1
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
preemption; with ``--nodes N --gpus-per-node G`` one job of N nodes running ``accelerate launch`` on each,
N x G processes), with its run folder ``<out>/<point name>/``. ``train.max_steps`` comes from the budget:

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
import shlex
import sys
from pathlib import Path
from typing import Optional, Sequence

from omegaconf import OmegaConf

from archlab.config import RecipeError
from tools import launch
from tools.sweep.archive import archive_sweep, restore_sweep
from tools.sweep.manifest import RefusalRecorder, read_manifest, refusal_line
from tools.sweep.plan import build_points, plan_point
from tools.sweep.point import _safe
from tools.sweep.schedule import run_sweep
from tools.sweep.status import status_text, sweep_status
from tools.sweep_check import design_checks

QUICK_SPEC = "tools/sweep/quick.yaml"  # --quick's spec (its file beside this one)


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
    ap.add_argument("--quick", action="store_true",
                    help=f"the quick scaling sweep, {QUICK_SPEC}: tiny widths, three budgets, minutes on 2 cores; "
                         "a smoke test of sweep and analysis.scaling, not a study (out: runs/sweep-quick)")
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
    via = None
    try:
        if args.quick:
            if args.spec or args.recipes:
                raise RecipeError("--quick is its own spec (tools/sweep/quick.yaml); give it without --spec and "
                                  "--recipes")
            args.spec = str(Path(__file__).with_name("quick.yaml"))
        via = launch.from_args(args) if not (args.status or args.archive or args.dry_run) else None
        via = RefusalRecorder(via) if via is not None else None  # a refused point: refused in the manifest
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
        # --launcher slurm --nodes: each run's processes (every machine's) count in its tokens per step
        args.num_processes = max(args.num_processes, launch.world_size(args))
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
        print(f"error: {refusal_line(via, e)}", file=sys.stderr)
        return 2
    if args.dry_run:
        return 0
    bad = [p for p in points if p.status != "finished"]
    for p in bad:
        print(f"not finished: {p.name} ({p.status}, exit {p.returncode}); log: {p.log}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
