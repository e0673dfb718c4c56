"""What the router trace (``train.router_trace_every``) costs: training steps with tracing on
against off, interleaved in one process.

    python -m tools.bench_router_trace                                  # mixtral-tiny, 20 pairs
    python -m tools.bench_router_trace --recipe recipes/deepseek/tiny.yaml --pairs 30 --set train.micro_batch_size=8

One :class:`archlab.train.Trainer` of the recipe, built with ``train.router_trace_every=1``; its
steps alternate between traced and untraced (the tracer's ``every`` set to 1 or 0), in pairs whose
order is swapped from one pair to the next (on-off, off-on, ...), after ``--warmup`` pairs that
are not counted. A timed step is the trainer's whole optimizer step (``Trainer.run_step``:
forward, backward, update, routing bookkeeping and, traced, the capture in the forward, the copy
to the host and the file write; no metrics row is due, and the progress bar is left out).
Reported: the median over pairs of (traced step time / untraced step time), the ratio of the
summed times, and the host seconds the trainer itself records per traced step in
``router_trace/steps.jsonl``. At ``router_trace_every = n`` a run pays about (ratio - 1) / n on
top of its steps. Printed; nothing is asserted (the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional, Sequence

import torch

import archlab
from archlab.io import read_jsonl
from archlab.train import Trainer
from archlab.train.callbacks import MetricsLogger, RouterTracing
from archlab.train.router_trace import INDEX, STEPS, TRACE_DIR


def measure(recipe: str, overrides: Sequence[str] = (), pairs: int = 20, warmup: int = 2,
            out_dir: Optional[str] = None) -> dict:
    """Time ``pairs`` traced/untraced step pairs of ``recipe`` (+ ``overrides``) in one process;
    returns the per-step times, the median ratio, the ratio of sums and the trace's own seconds."""
    out_dir = out_dir or tempfile.mkdtemp(prefix="bench-router-trace-")
    steps = 2 * (pairs + warmup)
    cfg = archlab.load_recipe(recipe, [*overrides, f"train.max_steps={steps + 1}", "train.router_trace_every=1",
                                       f"train.log_every={steps + 1}", f"train.eval_every={steps + 1}",
                                       f"train.ckpt_every={steps + 1}", f"train.out_dir={out_dir}",
                                       "train.run_name=bench-router-trace"])
    trainer = Trainer(cfg)
    try:
        tracing = trainer.callback(RouterTracing)
        if tracing is None:
            raise SystemExit("the recipe has no MoE layer: nothing to trace")
        trainer.callbacks = [cb for cb in trainer.callbacks if not isinstance(cb, MetricsLogger)]  # no bar

        def step(on: bool) -> float:
            tracing.tracer.every = 1 if on else 0
            t0 = time.perf_counter()
            trainer.run_step()
            return time.perf_counter() - t0

        times: dict[bool, list[float]] = {True: [], False: []}
        for i in range(warmup + pairs):
            order = (True, False) if i % 2 == 0 else (False, True)
            got = {on: step(on) for on in order}
            if i >= warmup:
                for on, dt in got.items():
                    times[on].append(dt)
        folder = Path(trainer.run_dir) / TRACE_DIR
        index = json.loads((folder / INDEX).read_text())
        lines = read_jsonl(folder / STEPS)
    finally:
        trainer.close()
    ratios = [a / b for a, b in zip(times[True], times[False])]
    trace_s = [e["seconds"] for e in lines]
    return {"recipe": recipe, "overrides": list(overrides), "pairs": pairs, "warmup": warmup,
            "on_s": times[True], "off_s": times[False],
            "median_on_s": statistics.median(times[True]), "median_off_s": statistics.median(times[False]),
            "median_ratio": statistics.median(ratios), "min_ratio": min(ratios), "max_ratio": max(ratios),
            "sum_ratio": sum(times[True]) / sum(times[False]),
            "trace_host_s_median": statistics.median(trace_s), "traced_steps_written": len(trace_s),
            "tokens_per_traced_step": index["tokens_per_step"], "layers": len(index["layers"]),
            "num_experts": index["num_experts"], "top_k": index["top_k"], "run_dir": str(trainer.run_dir),
            "threads": torch.get_num_threads()}


def report(r: dict) -> str:
    return "\n".join([
        f"router trace cost: {r['recipe']} {' '.join(r['overrides'])}".rstrip() + f" ({r['threads']} torch threads)",
        f"  {r['pairs']} interleaved pairs (after {r['warmup']} warm-up pairs), every step a full optimizer step",
        f"  traced {r['tokens_per_traced_step']} tokens x {r['layers']} MoE layers (E={r['num_experts']}, "
        f"K={r['top_k']}) per traced step",
        f"  step time: traced {r['median_on_s'] * 1e3:.1f} ms, untraced {r['median_off_s'] * 1e3:.1f} ms (medians)",
        f"  traced / untraced: median over pairs {r['median_ratio']:.3f} (range {r['min_ratio']:.3f} - "
        f"{r['max_ratio']:.3f}), ratio of sums {r['sum_ratio']:.3f}",
        f"  trainer-recorded host time per traced step (collect + write): {r['trace_host_s_median'] * 1e3:.2f} ms",
    ])


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench_router_trace", description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default="recipes/mixtral/tiny.yaml", help="an MoE recipe (default mixtral-tiny)")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="recipe overrides")
    ap.add_argument("--pairs", type=int, default=20, help="timed traced/untraced pairs (default 20)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed pairs first (default 2)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1: on a shared CPU fewer threads time more steadily)")
    ap.add_argument("--out-dir", help="where the benchmark's run folder goes (default: a temporary folder)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args(argv)
    if args.pairs < 1 or args.warmup < 0:
        print("error: --pairs must be >= 1 and --warmup >= 0", file=sys.stderr)
        return 2
    torch.set_num_threads(max(1, args.threads))
    r = measure(args.recipe, args.set, args.pairs, args.warmup, args.out_dir)
    print(json.dumps(r, indent=2) if args.json else report(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
