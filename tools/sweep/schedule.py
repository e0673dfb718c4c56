"""Training a sweep: one subprocess (or SLURM job) per point, ``--jobs`` at a time, trunks before their branches,
``--hours`` respected, the manifest rewritten after each change; a second call resumes."""

from __future__ import annotations

import os
import shlex
import signal
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from tools import launch
from tools.sweep.cooldown import is_ready
from tools.sweep.manifest import check_consistent, is_done, read_manifest, run_state, write_manifest
from tools.sweep.plan import build_points, plan_point
from tools.sweep.point import Point
from tools.sweep.status import RunTimes

REPO_ROOT = Path(__file__).resolve().parents[2]


class Stopped(Exception):
    """A sweep was stopped (Ctrl-C, SIGTERM) before every run ended: nothing is reported from half
    the runs; the same command resumes them."""


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
    via = via or launch.current()
    # a multi-node launcher (--launcher slurm --nodes N) runs each point on all its machines' processes: they
    # count in every step's tokens, so a budget plans that many fewer steps (sweeps and experiments alike)
    processes = max(processes, getattr(getattr(via, "options", None), "world_size", 1))
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
              lambda p: command(p, launcher, processes, accelerate_args), progress, hours, via)
    return points


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
