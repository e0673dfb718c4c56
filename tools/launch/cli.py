"""One training run on this machine or as one SLURM job, e.g. across two nodes of 8 GPUs:

    python -m tools.launch recipes/mixtral/tiny.yaml train.run_name=mx --launcher slurm \\
        --nodes 2 --gpus-per-node 8 --accelerate-config recipes/launch/multinode-8gpu.yaml --slurm-time 240

The run writes ``<train.out_dir>/<train.run_name>/`` (run_name defaults to the recipe's name), its output
goes to ``<train.out_dir>/logs/<run_name>.log`` (a multi-node job's other machines: ``<run_name>.task<R>.log``),
submitit's files to ``<train.out_dir>/slurm/<job id>/``. The same command again continues the run from its
newest checkpoint (after ``scancel``, a failure, a finished time limit), or follows the job if it is still
queued or running. ``--detach`` returns once the job is submitted. Exit status: 0 when the run ended
(completed or stopped after a checkpoint), 1 when it failed, 2 on bad input or a job sbatch refused.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Optional, Sequence

from archlab.config import RecipeError, load_recipe
from tools import launch

REPO_ROOT = Path(__file__).resolve().parents[2]


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m tools.launch", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("recipe", help="recipe file, e.g. recipes/mixtral/tiny.yaml")
    ap.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="recipe overrides, as archlab.train takes them")
    ap.add_argument("--launcher", choices=["python", "slurm"], default="python",
                    help="train here (python -m archlab.train) or as one SLURM job (submitit; --slurm-*, --nodes)")
    ap.add_argument("--detach", action="store_true", help="return once the job is submitted (SLURM)")
    launch.add_arguments(ap)
    return ap


def _record(out_dir: Path, name: str) -> Path:
    return out_dir / "slurm" / f"{name}.job.json"


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.detach and args.launcher != "slurm":
            raise RecipeError("--detach returns once a SLURM job is submitted: it needs --launcher slurm")
        overrides = list(args.overrides)
        cfg = load_recipe(args.recipe, overrides)  # a bad recipe or override stops here, before any job
        name = cfg.train.run_name or cfg.name
        if not cfg.train.run_name:  # every task (and a later resubmission) must find the same folder
            overrides.append(f"train.run_name={name}")
        out_dir = Path(cfg.train.out_dir).resolve()
        record = _record(out_dir, name)
        point = SimpleNamespace(name=name, log=str(out_dir / "logs" / f"{name}.log"), run_dir=str(out_dir / name),
                                job=json.loads(record.read_text()) if record.is_file() else {})
        via = launch.from_args(args)
        cmd = [sys.executable, "-m", "archlab.train", args.recipe, *overrides]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        run = via.start(point, cmd, env)
    except (RecipeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if run.job:
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps(run.job))
        world = launch.world_size(args)
        print(f"{run.describe()}: {name}, {world} process{'es' if world > 1 else ''}; log {point.log}; "
              f"stop it with scancel {run.job['id']}; the same command continues the run", flush=True)
    if args.detach:
        return 0
    try:
        while True:
            rc, _ = run.poll_with_peak_rss()
            if rc is not None:
                break
            time.sleep(2)
    except KeyboardInterrupt:
        run.interrupted()
        print(f"stopping {name} (it saves a checkpoint); the same command continues it", file=sys.stderr)
        return 1
    state = f" (SLURM job {run.job['id']}: {run.job['state']})" if run.job else ""
    print(f"{name}: exit {rc}{state}; run folder {point.run_dir}")
    return 0 if rc == 0 else 1
