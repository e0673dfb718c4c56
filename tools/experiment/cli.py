"""The command line of ``python -m tools.experiment``: run | report | plan | status SPEC (the spec's keys and
the stages: the package's docstring, printed by ``--help``)."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

import tools.experiment as package
from analysis.experiment_report import write_report
from analysis.experiment_spec import Spec
from analysis.runs import RunError
from archlab.config import RecipeError
from tools import experiment_status, launch
from tools.experiment.arms import resolve_arms
from tools.experiment.load import load_spec
from tools.experiment.plan import plan
from tools.experiment.run import RECORD, Stopped, measure, read_record, run_experiment, with_current_words


def regenerate_command(spec: Spec, args) -> str:
    """The command that rebuilds this report from scratch (finished runs are reused)."""
    cmd = ["python", "-m", "tools.experiment", "run", spec.spec_path]
    if spec.quick:
        cmd.append("--quick")
    if getattr(args, "out", None):
        cmd += ["--out", args.out]
    if getattr(args, "report", None):
        cmd += ["--report", args.report]
    if spec.extra_set:
        cmd += ["--set", *spec.extra_set]
    cmd += ["--jobs", str(getattr(args, "jobs", 1))]
    if getattr(args, "threads", None):
        cmd += ["--threads", str(args.threads)]
    return shlex.join(cmd)


def _parser() -> argparse.ArgumentParser:
    doc = package.__doc__
    ap = argparse.ArgumentParser(prog="python -m tools.experiment", description=doc.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=doc.split("\n\n", 1)[1])
    sub = ap.add_subparsers(dest="command", required=True)
    for name, text in (("run", "train (resumable), measure and write the report"),
                       ("report", "write the report from the finished runs (measuring what is missing)"),
                       ("plan", "print the arms, their costs and the training commands"),
                       ("status", "where the runs stand, stage by stage (trains nothing)")):
        p = sub.add_parser(name, help=text)
        p.add_argument("spec", help="experiment spec, e.g. experiments/evolution.yaml")
        p.add_argument("--quick", action="store_true", help="tiny models, a few steps, one seed (<out>-quick)")
        p.add_argument("--out", help="folder of the runs (default: the spec's out:)")
        p.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                       help="overrides for every arm, after the spec's set: (e.g. data.cache_dir=/tmp/cache)")
        if name not in ("plan", "status"):
            p.add_argument("--report", help="report folder (default: the spec's report:, or <out>/report)")
        if name == "run":
            p.add_argument("--jobs", type=int, default=1, help="runs trained at the same time (default 1)")
            p.add_argument("--threads", type=int, help="torch threads per trainer (default: torch's)")
            p.add_argument("--launcher", choices=["python", "slurm"], default="python",
                           help="train each run on this machine, or as one SLURM job (submitit; --slurm-* options)")
            launch.add_arguments(p)
    return ap


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        spec = load_spec(args.spec, quick=args.quick, extra_set=args.set)
        if args.out:
            spec = dataclasses.replace(spec, out=args.out)
        if args.command == "plan":
            plan(spec)
            return 0
        if args.command == "status":
            print(experiment_status.status_text(Path(spec.out), RECORD))
            return 0
        if args.command == "run":
            if args.jobs < 1 or (args.threads is not None and args.threads < 1):
                raise RecipeError("--jobs and --threads must be >= 1")
            with launch.use(launch.from_args(args)):
                record = run_experiment(spec, jobs=args.jobs, threads=args.threads,
                                        command=regenerate_command(spec, args))
        else:
            record = with_current_words(read_record(Path(spec.out)), spec, resolve_arms(spec))
        t0 = time.time()
        measurements = measure(record)
        report_dir = Path(args.report or (spec.report if not spec.quick else None) or Path(spec.out) / "report")
        record["measure_wall_s"] = round(time.time() - t0, 1)
        # the command of the run that trained it (`report` keeps its --jobs/--threads)
        command = record.get("command") or regenerate_command(spec, args)
        paths = write_report(record, measurements, report_dir, command=command)
    except Stopped as e:
        print(f"stopped: {e}", file=sys.stderr)
        return 1
    except (RecipeError, RunError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"report: {paths['markdown']}")
    for name in paths["unfinished"]:
        print(f"not finished: {name} (see {spec.out}/sweep*/logs/{name}.log)", file=sys.stderr)
    return 1 if paths["unfinished"] else 0
