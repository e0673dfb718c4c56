"""``python -m tools.experiment plan SPEC``: every arm with its overrides, steps and costs, the training
commands of each stage and an estimate of their CPU time; trains nothing."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from analysis.experiment_spec import Arm, Spec
from analysis.experiments import kv_and_state
from analysis.measurements.throughput import benchmark
from archlab.config import load_recipe, model_config
from archlab.costs import param_counts, training_flops_per_token
from tools import sweep
from tools.experiment import registration
from tools.experiment import stages as registry
from tools.experiment.arms import resolve_arms
from tools.experiment.stages.base import grid_of
from tools.sweep.schedule import _child_env

REPO_ROOT = Path(__file__).resolve().parents[2]


def plan(spec: Spec, log=print, estimate: bool = True) -> dict:
    """Print every arm with its overrides, steps and costs, the training commands of each stage
    (``tools.experiment.stages.STAGES``, in order) and an estimate of their CPU time; train nothing.
    Returns {stage: {"runs", "flops"}} and the estimate."""
    arms = resolve_arms(spec)
    log(f"experiment {spec.name}: {len(arms)} arms x {len(sweep._grid_items(grid_of(spec)))} runs "
        f"(grid x seeds {spec.seeds}), reference {spec.reference}, out {spec.out}")
    log(registration.plan_line(spec))
    for a in arms:
        cfg = load_recipe(a.recipe, a.overrides)
        pc = param_counts(cfg)
        fpt = training_flops_per_token(model_config(cfg), int(cfg.train.seq_len))
        kv, state = kv_and_state(cfg)
        changes = a.overrides[len(spec.set):]  # everything beyond the common overrides
        log(f"- {a.name} ({a.label}): {a.recipe} {' '.join(changes)}; budget {a.budget.to_dict()}; params "
            f"{pc.total:,} total / {pc.active:,} active; {fpt / 1e6:.2f} MFLOP/token; "
            f"KV {kv:.0f} B/token" + (f" + state {state:.0f} B/sequence" if state else ""))
    stages = {}
    for stage in registry.STAGES:  # each says what it trains (or why nothing), in the order they run
        stages.update(stage.plan(spec, arms, log=log))
    ref = next(a for a in arms if a.name == spec.reference)
    out = {name: {"runs": len(pts), "flops": sum(_new_flops(p) for p in pts)} for name, pts in stages.items()}
    speed = _flops_per_s(ref) if estimate else None
    overhead = run_overhead(ref, speed) if estimate else None
    log("\n== cost" + (f" (estimated at {speed / 1e9:.2f} GFLOP/s of training, the reference arm's step timed here "
                       f"on 1 thread, plus {overhead:.1f} s a run of start-up, evaluation and checkpoints, measured "
                       "on a 2-step run of the reference arm; a run per core)" if speed else ""))
    for name, o in out.items():
        o["cpu_s"] = o["runs"] * overhead + o["flops"] / speed if speed else None
        est = f", {cpu_minutes(o['cpu_s'])} CPU-min" if speed else ""
        log(f"- {name}: {o['runs']} runs, {o['flops']:.3g} training FLOPs{est}")
    if speed:
        total = sum(o["cpu_s"] for o in out.values())
        log(f"- total: {cpu_minutes(total)} CPU-min ({cpu_minutes(total / 2)} min wall with --jobs 2)")
    return {"stages": out, "flops_per_s": speed, "run_overhead_s": overhead}


def cpu_minutes(seconds: float) -> str:
    """Minutes as the plan prints them: '<1' under a minute, '~1.5' under ten, else '~12'."""
    m = seconds / 60
    return "<1" if m < 1 else f"~{m:.1f}" if m < 10 else f"~{m:.0f}"


def run_overhead(arm: Arm, flops_per_s: float, steps: int = 2) -> float:
    """Seconds a training run of ``arm`` costs beyond its steps (start-up, data, evaluation, checkpoints): the
    wall time of a ``steps``-step run of it (evaluating every step, as a short run does) less its steps'
    FLOPs at ``flops_per_s``."""
    cfg = load_recipe(arm.recipe, arm.overrides)
    step_flops = (training_flops_per_token(model_config(cfg), int(cfg.train.seq_len)) * int(cfg.train.seq_len)
                  * int(cfg.train.micro_batch_size) * int(cfg.train.grad_accum))
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "archlab.train", arm.recipe, *arm.overrides, f"train.max_steps={steps}",
               "train.eval_every=1", f"train.ckpt_every={steps}", f"train.out_dir={tmp}", "train.run_name=overhead",
               "train.warmup_steps=0"]
        start = time.perf_counter()
        subprocess.run(cmd, env=_child_env(1), cwd=REPO_ROOT, check=True, capture_output=True)
        wall = time.perf_counter() - start
    return max(0.0, wall - steps * step_flops / flops_per_s)


def _new_flops(p: sweep.Point) -> float:
    """The FLOPs a point trains itself: a cooldown branch only its steps after the trunk's checkpoint."""
    if p.role == "cooldown" and p.cooldown:
        return p.cooldown["decay_steps"] * p.tokens_per_step * p.flops_per_token
    return p.planned_flops


def _flops_per_s(arm: Arm) -> Optional[float]:
    """Training FLOP/s of the arm's step on this machine (1 thread, a few steps): the plan's yardstick."""
    cfg = load_recipe(arm.recipe, arm.overrides)
    tps = benchmark({arm.name: (arm.recipe, arm.overrides)}, steps=2, rounds=2, warmup=1, threads=1)
    return tps[arm.name]["tokens_per_s"] * training_flops_per_token(model_config(cfg), int(cfg.train.seq_len))
