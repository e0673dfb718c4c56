"""Training-step throughput of archlab against what a user would pick instead.

    python -m tools.bench                       # the d=256 cases, eager, 2 threads, wall clock
    python -m tools.bench --mode both --rounds 7   # eager and torch.compile'd (every model compiled)
    python -m tools.bench --cases llama-small --rounds 7 --steps 4
    python -m tools.bench --threads 1 --clock cpu --rounds 3 --steps 1   # steadier on a busy machine
    python -m tools.bench --suite moe --routing uniform   # MoE suite + learned / uniform routing step time

The command over the two suites: ``--suite dense`` (the default) runs ``tools.bench_dense`` (each
case's archlab training step against the HF model it exports to, archlab with a logits loss and, for
a dense GPT, a nanoGPT-style GPT; with the matmul ceiling and the fraction of peak), ``--suite moe``
runs ``tools.bench_moe`` (MoE layers against HF and DeepSpeed, a Mixtral-tiny step against HF) with
the options of this run it takes, ``--suite all`` both. Both suites time their models with the
harness of ``tools.bench_harness``; their docstrings say what is measured and how.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Optional, Sequence

import torch

from archlab.config import RecipeError
from tools import bench_moe
from tools.bench_dense import CASES, DEFAULT_CASES, format_table, run
from tools.bench_harness import MODES, Case


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tools.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", choices=["dense", "moe", "all"], default="dense",
                   help="dense: these training-step cases (Mixtral's included); moe: tools.bench_moe (MoE layers "
                        "against HF and DeepSpeed, Mixtral-tiny step against HF); all: both, in this one run")
    p.add_argument("--cases", nargs="+", default=DEFAULT_CASES, help=f"any of: {', '.join(CASES)}")
    p.add_argument("--mode", choices=["eager", "compiled", "both"], default="eager",
                   help="eager models, torch.compile'd ones, or both in the same rounds")
    p.add_argument("--moe-cases", nargs="+", default=None, help="MoE cases (default all): see tools.bench_moe")
    p.add_argument("--routing", choices=["learned", "uniform"], default="learned",
                   help="MoE suite: uniform also times archlab with its routers forced to uniform round-robin "
                        "routing (every expert N*K/E slots) and reports learned / uniform step time")
    p.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    p.add_argument("--steps", type=int, default=None,
                   help="training steps timed per model per round (default 3; MoE suite: its own default, 2)")
    p.add_argument("--batch", type=int, default=None, help="override every case's batch size (both suites)")
    p.add_argument("--seq-len", type=int, default=None, help="override every case's sequence length (both suites)")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="wall: elapsed time; cpu: this process's CPU time (steadier on a shared machine; "
                        "use with --threads 1, as idle-spinning threads count as CPU time)")
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.routing != "learned" and args.suite == "dense":
        print(f"error: --routing {args.routing} applies to the MoE suite: add --suite moe or --suite all",
              file=sys.stderr)
        return 2
    status = run_dense(args) if args.suite in ("dense", "all") else 0
    if status == 0 and args.suite in ("moe", "all"):
        status = bench_moe.main(moe_argv(args))
    return status


def moe_argv(args: argparse.Namespace) -> list[str]:
    """The options of this run that tools.bench_moe takes (shape options only when given)."""
    argv = ["--rounds", str(args.rounds), "--threads", str(args.threads), "--routing", args.routing]
    for flag, value in (("--steps", args.steps), ("--batch", args.batch), ("--seq-len", args.seq_len)):
        if value is not None:
            argv += [flag, str(value)]
    return argv + (["--cases", *args.moe_cases] if args.moe_cases else [])


def run_dense(args: argparse.Namespace) -> int:
    try:
        unknown = [c for c in args.cases if c not in CASES]
        if unknown:
            raise ValueError(f"unknown case(s) {unknown}; valid: {', '.join(CASES)}")
        steps = 3 if args.steps is None else args.steps
        if args.rounds < 1 or steps < 1:
            raise ValueError("--rounds and --steps must be >= 1")
        cases = [CASES[c] for c in args.cases]
        cases = [Case(c.name, c.recipe, c.overrides, args.batch or c.batch, args.seq_len or c.seq_len) for c in cases]
        modes = MODES if args.mode == "both" else (args.mode,)
        torch.set_num_threads(args.threads)
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, fp32, "
              f"{args.rounds} rounds x {steps} steps, {args.clock} clock, {' + '.join(modes)}")
        clock = time.process_time if args.clock == "cpu" else time.perf_counter
        rows = run(cases, args.rounds, steps, modes, clock=clock)
    except (RecipeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
