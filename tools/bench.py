"""Training-step throughput of archlab against what a user would pick instead.

    python -m tools.bench                       # the d=256 cases, eager, 2 threads, wall clock
    python -m tools.bench --mode both --rounds 7   # eager and torch.compile'd (every model compiled)
    python -m tools.bench --cases llama-small --rounds 7 --steps 4
    python -m tools.bench --threads 1 --clock cpu --rounds 3 --steps 1   # steadier on a busy machine
    python -m tools.bench --suite moe --routing uniform   # MoE suite + learned / uniform routing step time

A training step is forward, loss, backward and AdamW (fused, the same for every model), fp32 on
the CPU, the same weights and batch for every model of a case. archlab runs the trainer's path:
``model(ids, targets=...)`` (LM head and cross-entropy fused in chunks, no (B, S, V) logits) plus
the MoE balancing loss. Its peers, per case:

- ``archlab, logits loss``: the same model with ``F.cross_entropy`` over its logits (what the
  fused loss saves);
- the ``transformers`` model archlab exports to (``archlab.export.to_hf_model``; SDPA attention),
  with its own ``labels`` loss (Mixtral: ``output_router_logits=True``, its balancing loss in);
- dense GPT cases: ``tools.nanogpt``, a nanoGPT-style GPT reimplemented after karpathy/nanoGPT
  model.py (no package ships nanoGPT, and the benchmark needs no network), full-logits loss.

``--mode compiled`` runs every model through ``torch.compile`` (default options), ``both`` runs
eager and compiled copies in the same rounds; ratios compare models in the same mode.

Timings are interleaved round by round (order rotating), because a shared machine is noisy: the
figure that matters is the per-round ratio peer step time / archlab step time, reported as the
median over rounds with its range (min-max).

The ceiling: one eager forward + backward of each model runs under :class:`MatmulRecorder`,
which notes every matrix product (``mm``, ``addmm``, ``bmm``, ``baddbmm``, ``_grouped_mm``, in
place or not) and SDPA kernel (forward and backward) at its shapes and strides. Each round,
those products are timed alone (on copies: random values, SDPA's own), each as many times as the
step calls it, on the same threads: their sum is what the step would take if it did nothing but
its matrix products. ``ceiling ratio`` = step time / that sum, median of the per-round ratios
(1.00: nothing but matmuls; AdamW, norms, activations, copies and allocation are the rest). A
compiled model is held to its eager model's products.

FLOPs are counted from the same recording (2 M N K per product; SDPA its two products over the
full S x S square, backward twice the forward: ``FlopCounterMode``'s convention). ``of peak``
divides the useful FLOPs of a case (the least any of its models computes: padded expert rows do
not count) per second by the machine's fp32 rate on a 2048^3 matmul, best of the rounds,
measured between them.
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode

import archlab
from archlab.config import RecipeError
from archlab.export import to_hf_model
from archlab.objectives.causal_lm import CausalLM

ROOT = Path(__file__).resolve().parents[1]
MODES = ("eager", "compiled")


@dataclass(frozen=True)
class Case:
    name: str
    recipe: str
    overrides: tuple[str, ...] = ()
    batch: int = 8
    seq_len: int = 256


CASES = {c.name: c for c in [
    Case("gpt-small", "recipes/dense/xs.yaml", ("model.n_layers=4",)),  # d256, 8 heads, vocab 8192
    Case("llama-small", "recipes/llama/xs.yaml", ("model.n_layers=4",)),  # d256, 8 heads, 4 KV heads
    # d256, 8 heads, 4 KV heads, 8 SwiGLU experts of f=512, top-2, dropless
    Case("mixtral-small", "recipes/mixtral/xs.yaml", ("model.n_layers=4", "model.moe.expert_hidden=512")),
    Case("gpt-tiny", "recipes/dense/tiny.yaml"),
    Case("llama-tiny", "recipes/llama/tiny.yaml"),
]}
DEFAULT_CASES = ["gpt-small", "llama-small", "mixtral-small"]
ARCHLAB = "archlab"  # the trainer's path; every ratio is a peer's step time over this one's
LOGITS = "archlab, logits loss"
NANOGPT = "nanoGPT-style GPT"


# ----------------------------------------------------------------------------- the matmul ceiling

_aten = torch.ops.aten
_SDPA_FORWARD = {_aten._scaled_dot_product_flash_attention_for_cpu, _aten._scaled_dot_product_flash_attention,
                 _aten._scaled_dot_product_efficient_attention}
_SDPA_BACKWARD = {_aten._scaled_dot_product_flash_attention_for_cpu_backward,
                  _aten._scaled_dot_product_flash_attention_backward,
                  _aten._scaled_dot_product_efficient_attention_backward}
MATMUL_OPS = {_aten.mm, _aten.addmm, _aten.addmm_, _aten.bmm, _aten.baddbmm, _aten.baddbmm_, _aten._grouped_mm,
              *_SDPA_FORWARD, *_SDPA_BACKWARD}


def matmul_flops(func, args: tuple) -> int:
    """FLOPs of one recorded product: 2 M N K (batched: times the batch); grouped_mm its rows;
    SDPA 2 products over the full S x T square (4 B H S T Dh), its backward twice that."""
    packet = func._overloadpacket
    if packet in (_aten.mm, _aten.bmm):
        a, b = args[0], args[1]
    elif packet in (_aten.addmm, _aten.addmm_, _aten.baddbmm, _aten.baddbmm_):
        a, b = args[1], args[2]
    elif packet is _aten._grouped_mm:
        a, b = args[0], args[1]
        if a.dim() == 2 and b.dim() == 2:  # (X, R) x (R, Y) -> (E, X, Y): the weight gradient
            return 2 * a.shape[0] * a.shape[1] * b.shape[1]
        return 2 * math.prod(a.shape) * b.shape[-1]  # (R, X) x (E, X, Y) or batched (E, M, X) x (E, X, Y)
    else:
        q, k, v = args[1:4] if packet in _SDPA_BACKWARD else args[0:3]
        B, H, S, Dh = q.shape
        forward = 2 * B * H * S * k.shape[-2] * (Dh + v.shape[-1])
        return 2 * forward if packet in _SDPA_BACKWARD else forward
    return 2 * math.prod(a.shape) * b.shape[-1]


def _snapshot(x: Any, keep_values: bool) -> Any:
    """A private tensor of the same sizes, strides and dtype as a tensor argument (other
    arguments as they are): random normal values, or with ``keep_values`` (SDPA, whose speed can
    depend on them; integer arguments such as grouped_mm's offsets) a copy of its storage."""
    if not isinstance(x, Tensor):
        return x
    if keep_values or not x.is_floating_point():
        return torch.empty(0, dtype=x.dtype, device=x.device).set_(
            x.untyped_storage().clone(), x.storage_offset(), x.size(), x.stride())
    span = 1 + sum((n - 1) * s for n, s in zip(x.shape, x.stride())) if x.numel() else 0
    return torch.randn(span, dtype=x.dtype, device=x.device).as_strided(x.size(), x.stride())


def _key(x: Any) -> Any:
    if isinstance(x, Tensor):
        return ("tensor", tuple(x.shape), x.stride(), x.dtype)
    if isinstance(x, (list, tuple)):
        return tuple(_key(v) for v in x)
    return repr(x)


@dataclass
class MatmulCall:
    """One distinct product of a step: the op, a private copy of its arguments, how often the step calls it."""

    func: Any
    args: tuple
    kwargs: dict
    count: int = 0

    @property
    def flops(self) -> int:
        return self.count * matmul_flops(self.func, self.args)

    def label(self) -> str:
        shapes = " x ".join(str(tuple(a.shape)) for a in self.args if isinstance(a, Tensor))
        return f"{self.func._overloadpacket.__name__}{'' if self.count == 1 else f' x{self.count}'} {shapes}"


class MatmulRecorder(TorchDispatchMode):
    """Notes the matrix products and SDPA kernels run inside it (forward and backward), one
    :class:`MatmulCall` per distinct (op, shapes, strides, dtype, other arguments)."""

    def __init__(self):
        super().__init__()
        self.calls: dict[Any, MatmulCall] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func._overloadpacket in MATMUL_OPS:
            key = (func, _key(args), _key(sorted(kwargs.items())))
            if key not in self.calls:  # copied before the op runs: in-place ops write to their first argument
                sdpa = func._overloadpacket in _SDPA_FORWARD | _SDPA_BACKWARD
                self.calls[key] = MatmulCall(func, tuple(_snapshot(a, sdpa) for a in args),
                                             {k: _snapshot(v, sdpa) for k, v in kwargs.items()})
            self.calls[key].count += 1
        return func(*args, **kwargs)


@dataclass
class MatmulSet:
    """The products of one training step, to be timed alone."""

    calls: list[MatmulCall]

    @property
    def flops(self) -> int:
        return sum(c.flops for c in self.calls)

    def time(self, clock: Callable[[], float] = time.perf_counter) -> float:
        """Seconds to run every product as often as the step does, one after the other."""
        total = 0.0
        with torch.no_grad():
            for c in self.calls:
                t0 = clock()
                for _ in range(c.count):
                    c.func(*c.args, **c.kwargs)
                total += clock() - t0
        return total


def record_matmuls(fwd_bwd: Callable[[], None]) -> MatmulSet:
    """The products of one call of ``fwd_bwd`` (a forward + backward)."""
    with MatmulRecorder() as recorder:
        fwd_bwd()
    return MatmulSet(list(recorder.calls.values()))


# ----------------------------------------------------------------------------- runners


@dataclass
class Runner:
    """One model with its optimizer, a fixed batch and a way to compute the loss; ``step()`` is
    one training step. ``mode="compiled"`` runs the model through ``torch.compile``."""

    label: str
    model: nn.Module
    loss_of: Callable[[nn.Module, Tensor, Tensor], Tensor]  # (model, inputs_BS, targets_BS) -> loss
    ids_BS: Tensor  # (B, S + 1): inputs ids[:, :-1], targets ids[:, 1:]
    mode: str = "eager"
    opt: torch.optim.Optimizer = field(init=False)
    times: list[float] = field(default_factory=list)  # seconds per step, one entry per round
    matmul_times: list[float] = field(default_factory=list)  # seconds of the step's products alone, per round
    matmuls: Optional[MatmulSet] = None
    clock: Callable[[], float] = time.perf_counter

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r} unknown; valid: {', '.join(MODES)}")
        self.model.train()
        self.module = torch.compile(self.model) if self.mode == "compiled" else self.model
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, fused=True)  # one kernel per step
        inputs, targets = CausalLM.split(self.ids_BS, 1)  # the trainer's shift (archlab.objectives)
        self.inputs, self.targets = inputs.contiguous(), targets.contiguous()

    def loss(self) -> Tensor:
        return self.loss_of(self.module, self.inputs, self.targets)

    def step(self) -> None:
        self.loss().backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def time_steps(self, n: int) -> None:
        t0 = self.clock()
        for _ in range(n):
            self.step()
        self.times.append((self.clock() - t0) / n)

    def time_matmuls(self) -> None:
        self.matmul_times.append(self.matmuls.time(self.clock))

    def record_matmuls(self) -> MatmulSet:
        """The products of one eager forward + backward of this model (gradients then cleared)."""
        def fwd_bwd() -> None:
            self.loss_of(self.model, self.inputs, self.targets).backward()

        self.matmuls = record_matmuls(fwd_bwd)
        self.opt.zero_grad(set_to_none=True)
        return self.matmuls


def archlab_loss(model: nn.Module, inputs_BS: Tensor, targets_BS: Tensor) -> Tensor:
    """The trainer's loss: LM head and cross-entropy fused in chunks (no logits), plus the MoE
    balancing loss (0 for dense models)."""
    out = model(inputs_BS, targets=targets_BS)
    return out.loss + out.aux_loss


def logits_loss(model: nn.Module, inputs_BS: Tensor, targets_BS: Tensor) -> Tensor:
    """cross_entropy over archlab's (B, S, V) logits (what HF and nanoGPT do), plus the balancing loss."""
    out = model(inputs_BS)
    return F.cross_entropy(out.logits.flatten(0, 1), targets_BS.flatten()) + out.aux_loss


def hf_loss(model: nn.Module, inputs_BS: Tensor, targets_BS: Tensor) -> Tensor:
    """transformers' own training loss (labels already shifted, so no shift inside)."""
    return model(input_ids=inputs_BS, labels=targets_BS, shift_labels=targets_BS).loss


def nanogpt_loss(model: nn.Module, inputs_BS: Tensor, targets_BS: Tensor) -> Tensor:
    return model(inputs_BS, targets_BS)[1]


def gemm_flops_per_s(n: int = 2048, reps: int = 3, clock: Callable[[], float] = time.perf_counter) -> float:
    """Measured fp32 matmul throughput (FLOP/s) of an n x n x n product."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # warm-up
    t0 = clock()
    for _ in range(reps):
        a @ b
    return 2 * n**3 * reps / (clock() - t0)


def build_runners(case: Case, modes: Sequence[str] = ("eager",)) -> list[Runner]:
    """Per mode: archlab (fused loss) first, archlab with the logits loss, the HF model it exports
    to, and for a dense GPT the nanoGPT-style GPT; same weights, same batch, each its own copy."""
    from tools.nanogpt import from_archlab

    cfg = archlab.load_recipe(ROOT / case.recipe, list(case.overrides) + [f"train.seq_len={case.seq_len}"])
    torch.manual_seed(0)
    ours = archlab.build_model(cfg)
    hf = to_hf_model(ours)
    assert hf.config._attn_implementation == "sdpa", hf.config._attn_implementation
    if cfg.model.moe is not None:
        hf.config.output_router_logits = True  # its balancing loss is part of its training loss
    models = [(ARCHLAB, ours, archlab_loss), (LOGITS, ours, logits_loss), (type(hf).__name__, hf, hf_loss)]
    if cfg.family == "dense":
        models.append((NANOGPT, from_archlab(ours), nanogpt_loss))
    ids = torch.randint(0, cfg.model.vocab_size, (case.batch, case.seq_len + 1))
    return [Runner(label, copy.deepcopy(model), loss_of, ids, mode) for mode in modes
            for label, model, loss_of in models]


# ----------------------------------------------------------------------------- the run


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
