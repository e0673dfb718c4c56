"""Training-step throughput of archlab against the equivalent ``transformers`` model.

    python -m tools.bench                       # all cases, 2 threads, wall clock
    python -m tools.bench --cases llama-small --rounds 7 --steps 4
    python -m tools.bench --threads 1 --clock cpu --rounds 3 --steps 1   # steadier on a busy machine
    python -m tools.bench --suite moe --routing uniform   # MoE suite + learned / uniform routing step time

For each case, archlab's decoder and the HF model it exports to (same weights, same shapes; HF
with its SDPA attention) run a training step: forward, cross-entropy, backward, AdamW (fused,
the same for all). archlab runs twice: with cross-entropy over its logits (the loss code HF runs
inside), and with its own fused loss (``model(ids, targets=...)``: LM head and cross-entropy in
chunks, no (B, S, V) logits). HF computes its own loss from ``labels``. Timings are interleaved
round by round (order rotating), because a shared machine is noisy: the figure that matters is
the per-round ratio HF step time / archlab step time, reported as a median.

The machine's fp32 GEMM throughput (a 2048^3 matmul, best of the rounds, measured between them)
is the peak each model's achieved FLOP/s is compared to. A step's FLOPs are counted once per
model by ``torch.utils.flop_counter.FlopCounterMode`` with SDPA on its math backend (the CPU
flash kernel has no FLOP formula): matmuls only, attention's full S x S square.
"""

from __future__ import annotations

import argparse
import copy
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
    """One model with its optimizer, a fixed batch and a way to compute the loss;
    ``step()`` is one training step."""

    label: str
    model: nn.Module
    loss_of: Callable[[nn.Module, Tensor, Tensor], Tensor]  # (model, inputs_BS, targets_BS) -> loss
    ids_BS: Tensor  # (B, S + 1): inputs ids[:, :-1], targets ids[:, 1:]
    opt: torch.optim.Optimizer = field(init=False)
    times: list[float] = field(default_factory=list)  # seconds per step, one entry per round
    clock: Callable[[], float] = time.perf_counter

    def __post_init__(self):
        self.model.train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, fused=True)  # one kernel per step
        self.inputs = self.ids_BS[:, :-1].contiguous()
        self.targets = self.ids_BS[:, 1:].contiguous()

    def loss(self) -> Tensor:
        return self.loss_of(self.model, self.inputs, self.targets)

    def step(self) -> None:
        self.loss().backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def time_steps(self, n: int) -> None:
        t0 = self.clock()
        for _ in range(n):
            self.step()
        self.times.append((self.clock() - t0) / n)

    def flops_per_step(self) -> float:
        """Matmul FLOPs of forward + backward (AdamW is elementwise)."""
        with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
            self.loss().backward()
        self.opt.zero_grad(set_to_none=True)
        return float(counter.get_total_flops())


def logits_loss(model: nn.Module, inputs_BS: Tensor, targets_BS: Tensor) -> Tensor:
    """cross_entropy over the model's (B, S, V) logits: the same code for archlab and HF."""
    return F.cross_entropy(model(inputs_BS).logits.flatten(0, 1), targets_BS.flatten())


def archlab_fused_loss(model: nn.Module, inputs_BS: Tensor, targets_BS: Tensor) -> Tensor:
    """archlab's own training loss: LM head and cross-entropy fused in chunks (no logits)."""
    return model(inputs_BS, targets=targets_BS).loss


def hf_loss(model: nn.Module, inputs_BS: Tensor, targets_BS: Tensor) -> Tensor:
    """transformers' own training loss (labels already shifted, so no shift inside)."""
    return model(input_ids=inputs_BS, labels=targets_BS, shift_labels=targets_BS).loss


def gemm_flops_per_s(n: int = 2048, reps: int = 3, clock: Callable[[], float] = time.perf_counter) -> float:
    """Measured fp32 matmul throughput (FLOP/s) of an n x n x n product."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # warm-up
    t0 = clock()
    for _ in range(reps):
        a @ b
    return 2 * n**3 * reps / (clock() - t0)


def build_runners(case: Case) -> list[Runner]:
    """archlab with the shared logits loss, archlab with its fused loss, HF with its own loss:
    same weights, same batch."""
    cfg = archlab.load_recipe(ROOT / case.recipe, list(case.overrides) + [f"train.seq_len={case.seq_len}"])
    torch.manual_seed(0)
    ours = archlab.build_model(cfg)
    ours_fused = copy.deepcopy(ours)
    hf = to_hf_model(ours)
    assert hf.config._attn_implementation == "sdpa", hf.config._attn_implementation
    ids = torch.randint(0, cfg.model.vocab_size, (case.batch, case.seq_len + 1))
    return [Runner("archlab", ours, logits_loss, ids), Runner("archlab-fused", ours_fused, archlab_fused_loss, ids),
            Runner(type(hf).__name__, hf, hf_loss, ids)]


def run(cases: Sequence[Case], rounds: int, steps: int, log: Callable[[str], None] = print,
        clock: Callable[[], float] = time.perf_counter) -> list[dict]:
    """Time every runner of every case, interleaved round by round (order rotating each round)."""
    groups = [(case, build_runners(case)) for case in cases]
    for _, runners in groups:  # warm-up: allocator, kernels, AdamW state
        for runner in runners:
            runner.clock = clock
            runner.step()
    gemm = []
    for r in range(rounds):
        gemm.append(gemm_flops_per_s(clock=clock))
        for _, runners in groups:
            for i in range(len(runners)):
                runners[(i + r) % len(runners)].time_steps(steps)
        log(f"round {r + 1}/{rounds}: GEMM {gemm[-1] / 1e9:.1f} GFLOP/s")
    peak = max(gemm)
    results = []
    for case, (ours, fused, hf) in groups:
        tokens = case.batch * case.seq_len
        row = {"case": case.name, "hf_class": hf.label, "tokens_per_step": tokens, "gemm_peak_gflops": peak / 1e9}
        # the fused loss does the same matmuls as the logits path, but accumulates the LM-head
        # weight gradient with an in-place addmm_, which FlopCounterMode does not count
        flops_of = {"archlab": ours.flops_per_step(), "hf": hf.flops_per_step()}
        flops_of["fused"] = flops_of["archlab"]
        for tag, runner in (("archlab", ours), ("fused", fused), ("hf", hf)):
            ratios = [t_hf / t for t, t_hf in zip(runner.times, hf.times)]
            t = statistics.median(runner.times)
            flops = flops_of[tag]
            row.update({f"{tag}_tokens_per_s": tokens / t, f"{tag}_gflops": flops / t / 1e9,
                        f"{tag}_peak_fraction": flops / t / peak, f"{tag}_ratio": statistics.median(ratios),
                        f"{tag}_ratio_range": (min(ratios), max(ratios))})
        results.append(row)
    return results


def format_table(results: list[dict]) -> str:
    head = (f"{'case':<12} {'HF tok/s':>9} {'archlab tok/s (x HF)':>27} {'archlab-fused tok/s (x HF)':>27}"
            f" {'fraction of GEMM peak: HF / archlab / fused':>45}")
    lines = [head, "-" * len(head)]
    for r in results:
        cells = []
        for tag in ("archlab", "fused"):
            lo, hi = r[f"{tag}_ratio_range"]
            cells.append(f"{r[f'{tag}_tokens_per_s']:>7.0f} ({r[f'{tag}_ratio']:.2f}x, {lo:.2f}-{hi:.2f})")
        lines.append(f"{r['case']:<12} {r['hf_tokens_per_s']:>9.0f} {cells[0]:>27} {cells[1]:>27} "
                     f"{r['hf_peak_fraction']:>22.2f} / {r['archlab_peak_fraction']:.2f} "
                     f"/ {r['fused_peak_fraction']:.2f}")
    lines.append(f"fp32 GEMM peak (2048^3, best round): {results[0]['gemm_peak_gflops']:.1f} GFLOP/s. "
                 "x HF = median over rounds of HF step time / archlab step time (min-max).")
    lines.append("archlab: logits + cross_entropy (as HF does inside); archlab-fused: model(ids, targets=...) "
                 "(chunked LM head + loss); HF: model(ids, labels=...).")
    return "\n".join(lines)


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tools.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", choices=["dense", "moe", "all"], default="dense",
                   help="dense: these training-step cases; moe: tools.bench_moe (MoE layers against HF and "
                        "DeepSpeed, Mixtral-tiny step against HF); all: both, in this one run")
    p.add_argument("--cases", nargs="+", default=list(CASES), help=f"dense cases, any of: {', '.join(CASES)}")
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
        from tools import bench_moe

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
        torch.set_num_threads(args.threads)
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, fp32, "
              f"{args.rounds} rounds x {steps} steps, {args.clock} clock")
        clock = time.process_time if args.clock == "cpu" else time.perf_counter
        results = run(cases, args.rounds, steps, clock=clock)
    except (RecipeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
