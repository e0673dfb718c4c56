"""The dense suite of ``python -m tools.bench``: the training step of each case's archlab model
against its peers (``tools.bench_harness``), with the matmul ceiling and the fraction of peak.

Cases: the d=256 GPT, LLaMA and Mixtral recipes (4 layers) and the tiny GPT and LLaMA ones
(:data:`CASES`). ``modes=("eager", "compiled")`` runs eager and compiled copies in the same rounds;
ratios compare models in the same mode.

Timings are interleaved round by round (order rotating), because a shared machine is noisy: the
figure that matters is the per-round ratio peer step time / archlab step time, reported as the
median over rounds with its range (min-max). Each round, every model's products are also timed
alone (the harness's ceiling): ``ceiling ratio`` = step time / that sum, median of the per-round
ratios (1.00: nothing but matmuls; AdamW, norms, activations, copies and allocation are the rest).
A compiled model is held to its eager model's products.

``of peak`` divides the useful FLOPs of a case (the least any of its models computes: padded expert
rows do not count) per second by the machine's fp32 rate on a 2048^3 matmul, best of the rounds,
measured between them.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Sequence

from tools.bench_harness import ARCHLAB, Case, build_runners, gemm_flops_per_s

CASES = {c.name: c for c in [
    Case("gpt-small", "recipes/dense/xs.yaml", ("model.n_layers=4",)),  # d256, 8 heads, vocab 8192
    Case("llama-small", "recipes/llama/xs.yaml", ("model.n_layers=4",)),  # d256, 8 heads, 4 KV heads
    # d256, 8 heads, 4 KV heads, 8 SwiGLU experts of f=512, top-2, dropless
    Case("mixtral-small", "recipes/mixtral/xs.yaml", ("model.n_layers=4", "model.moe.expert_hidden=512")),
    Case("gpt-tiny", "recipes/dense/tiny.yaml"),
    Case("llama-tiny", "recipes/llama/tiny.yaml"),
]}
DEFAULT_CASES = ["gpt-small", "llama-small", "mixtral-small"]


def _ratios(num: Sequence[float], den: Sequence[float]) -> tuple[float, float, float]:
    r = [a / b for a, b in zip(num, den)]
    return statistics.median(r), min(r), max(r)


def run(cases: Sequence[Case], rounds: int, steps: int, modes: Sequence[str] = ("eager",),
        log: Callable[[str], None] = print, clock: Callable[[], float] = time.perf_counter) -> list[dict]:
    """Time every runner of every case, interleaved round by round (order rotating each round),
    each followed by its products alone; one row per (case, mode, runner)."""
    groups = []
    for case in cases:
        runners = build_runners(case, modes)
        eager = {}
        for runner in runners:  # warm-up (and compilation): allocator, kernels, AdamW state
            runner.clock = clock
            runner.step()
            runner.step()
            if runner.mode == "eager":
                eager[runner.label] = runner.record_matmuls()
        for runner in runners:  # a compiled model is held to its eager model's products
            runner.matmuls = eager.get(runner.label) or runner.record_matmuls()
        groups.append((case, runners))
        log(f"built {case.name}: {', '.join(sorted({r.label for r in runners}))} ({', '.join(modes)})")
    gemm = []
    for r in range(rounds):
        gemm.append(gemm_flops_per_s(clock=clock))
        for _, runners in groups:
            for i in range(len(runners)):
                runner = runners[(i + r) % len(runners)]
                runner.time_steps(steps)
                runner.time_matmuls()
        log(f"round {r + 1}/{rounds}: GEMM {gemm[-1] / 1e9:.1f} GFLOP/s")
    peak = max(gemm)
    rows = []
    for case, runners in groups:
        tokens = case.batch * case.seq_len
        useful = min(r.matmuls.flops for r in runners)
        for runner in runners:
            ours = next(r for r in runners if r.label == ARCHLAB and r.mode == runner.mode)
            t, t_mm = statistics.median(runner.times), statistics.median(runner.matmul_times)
            ceiling = _ratios(runner.times, runner.matmul_times)
            speedup = _ratios(runner.times, ours.times)
            rows.append({"case": case.name, "mode": runner.mode, "runner": runner.label, "step_ms": 1e3 * t,
                         "tokens_per_s": tokens / t, "flops_per_step": runner.matmuls.flops, "useful_flops": useful,
                         "peak_fraction": useful / t / peak, "matmul_ms": 1e3 * t_mm,
                         "ceiling_ratio": ceiling[0], "ceiling_range": ceiling[1:],
                         "archlab_speedup": speedup[0], "archlab_speedup_range": speedup[1:],
                         "gemm_peak_gflops": peak / 1e9})
    return rows


def format_table(rows: list[dict]) -> str:
    head = (f"{'case':<13} {'mode':<8} {'model':<24} {'ms/step':>8} {'tok/s':>6} {'of peak':>7} "
            f"{'matmuls ms':>10} {'ceiling ratio':>19} {'archlab speedup':>19}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lo, hi = r["ceiling_range"]
        speed = "-" if r["runner"] == ARCHLAB else "{:.2f}x ({:.2f}-{:.2f})".format(
            r["archlab_speedup"], *r["archlab_speedup_range"])
        lines.append(f"{r['case']:<13} {r['mode']:<8} {r['runner']:<24} {r['step_ms']:>8.1f} "
                     f"{r['tokens_per_s']:>6.0f} {r['peak_fraction']:>7.2f} {r['matmul_ms']:>10.1f} "
                     f"{r['ceiling_ratio']:>6.2f} ({lo:.2f}-{hi:.2f}) {speed:>19}")
    lines += [
        f"of peak: useful matmul FLOP/s over the fp32 GEMM rate (2048^3, best round: "
        f"{rows[0]['gemm_peak_gflops']:.1f} GFLOP/s).",
        "matmuls ms: the step's own matrix products and SDPA kernels timed alone; ceiling ratio = step time / that "
        "(1.00 = nothing but matmuls), median over rounds (min-max).",
        f"archlab speedup = that model's step time / {ARCHLAB}'s (model(ids, targets=...), fused LM-head loss) in the "
        "same round and mode, median over rounds (min-max); > 1: archlab is faster.",
    ]
    return "\n".join(lines)
