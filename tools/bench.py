"""Training-step throughput of archlab against the equivalent ``transformers`` model.

    python -m tools.bench                       # all cases, 2 threads
    python -m tools.bench --cases llama-small --rounds 7 --steps 4

For each case, archlab's decoder and the HF model it exports to (same weights, same shapes; HF
with its SDPA attention) run the same training step: forward, cross-entropy, backward, AdamW.
Timings of the two are interleaved round by round (order alternating), because a shared machine
is noisy: the figure that matters is the per-round ratio archlab / HF, reported as a median.

The machine's fp32 GEMM throughput (a 2048^3 matmul, best of the rounds, measured between them)
is the peak each model's achieved FLOP/s is compared to. A step's FLOPs are counted once per
model by ``torch.utils.flop_counter.FlopCounterMode`` with SDPA on its math backend (the CPU
flash kernel has no FLOP formula): matmuls only, attention's full S x S square.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import archlab
from archlab.config import RecipeError
from archlab.export import to_hf_model

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Case:
    name: str
    recipe: str
    overrides: tuple[str, ...] = ()
    batch: int = 8
    seq_len: int = 256


CASES = {c.name: c for c in [
    Case("llama-tiny", "recipes/llama/tiny.yaml"),
    Case("llama-small", "recipes/llama/xs.yaml", ("model.n_layers=4",)),  # d256, 8 heads, 4 KV heads
    Case("gpt-tiny", "recipes/dense/tiny.yaml"),
    Case("gpt-small", "recipes/dense/xs.yaml", ("model.n_layers=4",)),  # d256, 8 heads
]}


@dataclass
class Runner:
    """One model with its optimizer and a fixed batch; ``step()`` is one training step."""

    label: str
    model: nn.Module
    ids_BS: Tensor
    opt: torch.optim.Optimizer = field(init=False)
    times: list[float] = field(default_factory=list)  # seconds per step, one entry per round

    def __post_init__(self):
        self.model.train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, fused=True)  # one kernel per step

    def loss(self) -> Tensor:
        logits_BSV = self.model(self.ids_BS[:, :-1]).logits
        return F.cross_entropy(logits_BSV.flatten(0, 1), self.ids_BS[:, 1:].flatten())

    def step(self) -> None:
        self.loss().backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def time_steps(self, n: int) -> None:
        t0 = time.perf_counter()
        for _ in range(n):
            self.step()
        self.times.append((time.perf_counter() - t0) / n)

    def flops_per_step(self) -> float:
        """Matmul FLOPs of forward + backward (AdamW is elementwise), counted on a copy-free pass."""
        with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
            self.loss().backward()
        self.opt.zero_grad(set_to_none=True)
        return float(counter.get_total_flops())


def gemm_flops_per_s(n: int = 2048, reps: int = 3) -> float:
    """Measured fp32 matmul throughput (FLOP/s) of an n x n x n product."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # warm-up
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * n**3 * reps / (time.perf_counter() - t0)


def build_pair(case: Case) -> tuple[Runner, Runner]:
    cfg = archlab.load_recipe(ROOT / case.recipe, list(case.overrides) + [f"train.seq_len={case.seq_len}"])
    torch.manual_seed(0)
    ours = archlab.build_model(cfg)
    hf = to_hf_model(ours)
    assert hf.config._attn_implementation == "sdpa", hf.config._attn_implementation
    ids = torch.randint(0, cfg.model.vocab_size, (case.batch, case.seq_len + 1))
    return Runner("archlab", ours, ids), Runner(type(hf).__name__, hf, ids)


def run(cases: Sequence[Case], rounds: int, steps: int, log: Callable[[str], None] = print) -> list[dict]:
    pairs = [(case, *build_pair(case)) for case in cases]
    for _, ours, theirs in pairs:  # warm-up: allocator, kernels, AdamW state
        ours.step(), theirs.step()
    gemm = []
    for r in range(rounds):
        gemm.append(gemm_flops_per_s())
        for _, ours, theirs in pairs:
            order = (ours, theirs) if r % 2 == 0 else (theirs, ours)
            for runner in order:
                runner.time_steps(steps)
        log(f"round {r + 1}/{rounds}: GEMM {gemm[-1] / 1e9:.1f} GFLOP/s")
    peak = max(gemm)
    results = []
    for case, ours, theirs in pairs:
        tokens = case.batch * case.seq_len
        ratios = [t_hf / t_ours for t_ours, t_hf in zip(ours.times, theirs.times)]
        row = {"case": case.name, "hf_class": theirs.label, "tokens_per_step": tokens,
               "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
               "gemm_peak_gflops": peak / 1e9}
        for tag, runner in (("archlab", ours), ("hf", theirs)):
            t = statistics.median(runner.times)
            flops = runner.flops_per_step()
            row[f"{tag}_tokens_per_s"] = tokens / t
            row[f"{tag}_gflops"] = flops / t / 1e9
            row[f"{tag}_peak_fraction"] = flops / t / peak
        results.append(row)
    return results


def format_table(results: list[dict]) -> str:
    head = (f"{'case':<12} {'archlab tok/s':>13} {'HF tok/s':>9} {'ratio (min-max)':>20} "
            f"{'archlab/peak':>12} {'HF/peak':>8}")
    lines = [head, "-" * len(head)]
    for r in results:
        lines.append(
            f"{r['case']:<12} {r['archlab_tokens_per_s']:>13.0f} {r['hf_tokens_per_s']:>9.0f} "
            f"{r['ratio_median']:>7.2f}x ({r['ratio_min']:.2f}-{r['ratio_max']:.2f}) "
            f"{r['archlab_peak_fraction']:>12.2f} {r['hf_peak_fraction']:>8.2f}")
    lines.append(f"fp32 GEMM peak (2048^3, best round): {results[0]['gemm_peak_gflops']:.1f} GFLOP/s; "
                 "ratio = archlab tokens/s / HF tokens/s, median of paired rounds")
    return "\n".join(lines)


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tools.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", nargs="+", default=list(CASES), help=f"any of: {', '.join(CASES)}")
    p.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    p.add_argument("--steps", type=int, default=3, help="training steps timed per model per round")
    p.add_argument("--batch", type=int, default=None, help="override every case's batch size")
    p.add_argument("--seq-len", type=int, default=None, help="override every case's sequence length")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    try:
        unknown = [c for c in args.cases if c not in CASES]
        if unknown:
            raise ValueError(f"unknown case(s) {unknown}; valid: {', '.join(CASES)}")
        if args.rounds < 1 or args.steps < 1:
            raise ValueError("--rounds and --steps must be >= 1")
        cases = [CASES[c] for c in args.cases]
        cases = [Case(c.name, c.recipe, c.overrides, args.batch or c.batch, args.seq_len or c.seq_len) for c in cases]
        torch.set_num_threads(args.threads)
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, fp32, "
              f"{args.rounds} rounds x {args.steps} steps")
        results = run(cases, args.rounds, args.steps)
    except (RecipeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
