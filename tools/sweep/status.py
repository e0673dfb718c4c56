"""Where a sweep stands: each run's own steps and FLOPs, done and left, and the wall times fitted to the finished
runs (:class:`RunTimes`), training nothing."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from archlab.train.checkpoint import checkpoints
from tools import launch
from tools.sweep.manifest import is_done, read_manifest, run_state
from tools.sweep.plan import build_points, plan_point
from tools.sweep.point import Point


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
    trend of a few sizes is not extrapolated), with the median start-up time. Before any size is fitted, one line
    through the finished runs of all sizes (``pooled``, when they span >= 3x in FLOPs); None before that."""

    models: dict  # (ladder, size) -> (start-up s, FLOPs/s)
    flops_per_token: dict  # (ladder, size) -> training FLOPs per token
    pooled: Optional[tuple] = None  # before any size has a fit: one (start-up s, FLOPs/s) over every size's runs

    @classmethod
    def fit(cls, points: list[Point], elapsed: dict) -> RunTimes:
        """``elapsed``: point name -> recorded wall seconds (the manifest's ``elapsed_s``)."""
        timed: dict[tuple, list] = {}
        for p in points:
            if elapsed.get(p.name) and run_state(p) == "finished":
                timed.setdefault((p.ladder, p.size), []).append((own_flops(p), float(elapsed[p.name])))
        models = {k: m for k, runs in timed.items() if (m := _time_model(runs)) is not None}
        pooled = None if models else _time_model([r for runs in timed.values() for r in runs])
        return cls(models, {(p.ladder, p.size): p.flops_per_token for p in points}, pooled)

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
        elif self.pooled:  # no size fitted yet: one line through the finished runs of every size
            start, speed = self.pooled
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
    seconds = sum(left) / jobs if (models or times.pooled) and None not in left else None
    count = {s: sum(r["state"] == s for r in rows) for s in ("finished", "diverged", "started")}
    return {"out": str(out_dir), "points": len(rows), **count,
            "flops_total": sum(r["flops"] for r in rows), "flops_done": sum(r["flops_done"] for r in rows),
            "speed": {f"{k[0]}/{k[1]}": {"flops_per_s": m[1], "start_s": m[0]}
                      for k, m in sorted(models.items(), key=lambda km: fpt[km[0]])},
            "pooled": None if times.pooled is None else {"flops_per_s": times.pooled[1], "start_s": times.pooled[0]},
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
    if st.get("pooled"):
        lines.append("speed fitted to the finished runs of every size together, until a size has runs of >= 3x "
                     f"different lengths: {st['pooled']['flops_per_s']:.3g} FLOPs/s per run + "
                     f"{st['pooled']['start_s']:.0f} s")
    if st["seconds_left"] is not None:
        how = ("that one fit for every run" if st.get("pooled")
               else "each run by its size's fit, or the fitted sizes' speed trend")
        lines.append(f"time left at --jobs {st['jobs']}: about {st['seconds_left'] / 3600:.2g} h ({how}; an "
                     "estimate, not a promise)")
    elif to_go:
        lines.append("time left: unknown until finished runs span >= 3x in FLOPs (their wall times give the speed "
                     "and start-up time)")
    jobs = [r for r in st["rows"] if r.get("job") and r["state"] not in ("finished", "diverged")]
    if jobs:
        lines.append("SLURM jobs of the runs to go (the scheduler's state): "
                     + ", ".join(f"{r['name']} {r['job']['id']} {r['job']['state']}" for r in jobs))
    return "\n".join(lines)
