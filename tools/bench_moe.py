"""MoE throughput: archlab's MoE layer against HF's MixtralSparseMoeBlock and DeepSpeed's
``deepspeed.moe.layer.MoE`` (ep_size=1), and a Mixtral-tiny training step against
MixtralForCausalLM.

    python -m tools.bench_moe                      # all cases, 2 threads
    python -m tools.bench_moe --cases mixtral-layer --rounds 7
    python -m tools.bench_moe --routing uniform    # + archlab with forced uniform routing

Layer cases time forward + backward (a fixed output gradient; gradients of input and weights) of
one MoE layer on B x S tokens of width D: archlab, HF's block with its default (eager: a loop over
experts) and with its ``grouped_mm`` experts implementation (the default inside HF models), and
DeepSpeed; all paths with SwiGLU experts of the same shape and
dropless routing (DeepSpeed with ``drop_tokens=False``, which pads every expert to the largest
expert's load), so the useful FLOPs are the same. The step case is the training step of
``tools.bench_harness`` (forward, loss, backward, AdamW) on the Mixtral-tiny recipe and its HF
export: archlab with a logits cross-entropy against HF with its own ``labels`` loss, both with
their balancing loss; archlab with its fused LM-head loss is timed too (``tools.bench_dense``'s
mixtral-small case is the same comparison at d=256).

Timings are interleaved round by round with alternating order (the machine is shared and noisy);
the reported ratio is the median over rounds of (other path's time / archlab's time), so > 1
means archlab is faster. GFLOP/s use the useful matmul FLOPs of ``archlab.costs.flops`` (the
same numerator for every path) and are compared with the fp32 GEMM peak measured between rounds.

``--routing uniform`` adds to every case a copy of archlab's path (same weights, same batch)
whose routers are forced to a round-robin assignment (``archlab.nn.moe.router.uniform_routing``:
every expert gets exactly N*K/E slots, within one when E does not divide N*K; gate weights still
the router's scores), timed in the same interleaved rounds. A second table gives learned /
uniform step time (median of paired rounds, min-max), the cost of the learned router's imbalance
on top of the dispatch itself, with the MaxVio of both (max expert load / mean load - 1, over
every timed forward). HF and DeepSpeed keep their own (learned) routing.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor, nn

import archlab.hf  # noqa: F401  registers the adapters (Mixtral's for the step case)
from archlab.config.schema import FFNConfig, ModelConfig, MoEConfig
from archlab.costs.flops import moe_layer_flops, training_flops_per_token
from archlab.nn.ffn import SwiGLU
from archlab.nn.moe import MoELayer, routing_stats
from archlab.nn.moe.router import uniform_routing
from tools.bench_harness import ARCHLAB, LOGITS, Case, Runner, build_runners, gemm_flops_per_s


@dataclass(frozen=True)
class LayerCase:
    name: str
    num_experts: int
    hidden: int
    top_k: int


LAYER_CASES = {c.name: c for c in [
    LayerCase("mixtral-layer", 8, 512, 2),  # Mixtral shape: 8 experts, f=512, top-2
    LayerCase("deepseek-layer", 64, 128, 6),  # fine-grained: 64 experts, f=128, top-6
]}
STEP_CASES = ["mixtral-tiny-step"]
ALL_CASES = list(LAYER_CASES) + STEP_CASES
ROUTINGS = ("learned", "uniform")
UNIFORM = "archlab, uniform routing"  # the label of the forced-uniform path


@dataclass
class Timed:
    """One implementation: ``step()`` runs once and the times of each round are kept."""

    label: str
    step: Callable[[], None]
    times: list[float] = field(default_factory=list)
    moe: Optional[nn.Module] = None  # archlab paths: the module whose routing statistics are read

    def time_steps(self, n: int) -> None:
        t0 = time.perf_counter()
        for _ in range(n):
            self.step()
        self.times.append((time.perf_counter() - t0) / n)


def _layer_step(module: nn.Module, x_BSD: Tensor, g_BSD: Tensor, unpack: Callable) -> Callable[[], None]:
    def step() -> None:
        x = x_BSD.detach().requires_grad_(True)
        unpack(module(x)).backward(g_BSD)
        module.zero_grad(set_to_none=True)

    return step


def _forced_uniform(step: Callable[[], None], module: nn.Module) -> Callable[[], None]:
    """``step`` with every router of ``module`` forced to uniform round-robin routing."""
    def forced() -> None:
        with uniform_routing(module):
            step()

    return forced


def _maxvio(module: nn.Module) -> float:
    """MaxVio of the training forwards since the last read (mean over MoE layers); resets them."""
    return float(routing_stats(module, lambda t: t).get("moe/maxvio", float("nan")))


def _ensure_single_process_group() -> None:
    """DeepSpeed's MoE builds its expert groups through torch.distributed: one gloo process."""
    import torch.distributed as dist

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        dist.init_process_group("gloo", rank=0, world_size=1)


def build_layer_paths(case: LayerCase, batch: int, seq_len: int, d_model: int,
                      routing: str = "learned") -> tuple[list[Timed], float]:
    """archlab, HF and DeepSpeed layers of one shape (+ archlab under forced uniform routing with
    ``routing="uniform"``), and the useful FLOPs of one step."""
    from deepspeed.moe.layer import MoE as DeepSpeedMoE
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    def hf_block(experts_implementation: str) -> nn.Module:
        config = MixtralConfig(hidden_size=d_model, intermediate_size=case.hidden, num_local_experts=case.num_experts,
                               num_experts_per_tok=case.top_k)
        config._experts_implementation = experts_implementation
        block = MixtralSparseMoeBlock(config).train()
        with torch.no_grad():  # same weights: same routing, same work
            block.gate.weight.copy_(ours.router.gate.weight)
            block.experts.gate_up_proj.copy_(ours.experts.w_up.transpose(1, 2))
            block.experts.down_proj.copy_(ours.experts.w_down.transpose(1, 2))
        return block

    torch.manual_seed(0)
    cfg = ModelConfig(d_model=d_model, ffn=FFNConfig(type="swiglu", bias=False),
                      moe=MoEConfig(num_experts=case.num_experts, top_k=case.top_k, expert_hidden=case.hidden))
    ours = MoELayer(cfg).train()
    _ensure_single_process_group()
    ds = DeepSpeedMoE(hidden_size=d_model, expert=SwiGLU(cfg.ffn, d_model=d_model, hidden=case.hidden, expert=True),
                      num_experts=case.num_experts, ep_size=1, k=case.top_k, drop_tokens=False).train()
    x = torch.randn(batch, seq_len, d_model)
    g = torch.randn(batch, seq_len, d_model)
    paths = [
        Timed("archlab", _layer_step(ours, x, g, lambda out: out[0]), moe=ours),
        Timed("HF MixtralSparseMoeBlock", _layer_step(hf_block("eager"), x, g, lambda out: out)),
        Timed("HF block, grouped_mm", _layer_step(hf_block("grouped_mm"), x, g, lambda out: out)),
        Timed("DeepSpeed MoE", _layer_step(ds, x, g, lambda out: out[0])),
    ]
    if routing == "uniform":
        forced = copy.deepcopy(ours)
        paths.append(Timed(UNIFORM, _forced_uniform(_layer_step(forced, x, g, lambda out: out[0]), forced), moe=forced))
    experts, router = moe_layer_flops(cfg)
    return paths, 3.0 * (experts + router) * batch * seq_len


def build_step_paths(batch: int, seq_len: int, routing: str = "learned") -> tuple[list[Timed], float]:
    """The harness's runners on Mixtral-tiny: archlab with a logits cross-entropy first, then HF
    with its own ``labels`` loss and archlab with its fused LM-head loss (+ the first under forced
    uniform routing with ``routing="uniform"``)."""
    runners = {r.label: r for r in build_runners(Case("mixtral-tiny", "recipes/mixtral/tiny.yaml", (), batch, seq_len))}
    ours = runners.pop(LOGITS)
    fused = runners.pop(ARCHLAB)
    (hf,) = runners.values()
    flops = training_flops_per_token(ours.model.cfg, seq_len) * batch * seq_len
    paths = [Timed("archlab", ours.step, moe=ours.model), Timed(hf.label, hf.step),
             Timed("archlab, fused loss", fused.step)]
    if routing == "uniform":
        forced = Runner(UNIFORM, copy.deepcopy(ours.model), ours.loss_of, ours.ids_BS)
        paths.append(Timed(UNIFORM, _forced_uniform(forced.step, forced.model), moe=forced.model))
    return paths, flops


def run(args: argparse.Namespace, log: Callable[[str], None] = print) -> list[dict]:
    """Time the chosen cases; returns one row per (case, other path) (``kind: compare``) and, with
    ``routing="uniform"``, one per case for learned against uniform routing (``kind: routing``).
    ``args`` needs moe_cases, rounds, steps, batch, seq_len, d_model, threads, routing (missing
    ones take the defaults)."""
    defaults = vars(parse_args([]))
    opt = argparse.Namespace(**{**defaults, **{k: v for k, v in vars(args).items() if v is not None}})
    cases = [c for c in (opt.moe_cases or ALL_CASES)]
    unknown = [c for c in cases if c not in ALL_CASES]
    if unknown:
        raise ValueError(f"unknown MoE case(s) {unknown}; valid: {', '.join(ALL_CASES)}")
    if opt.routing not in ROUTINGS:
        raise ValueError(f"routing {opt.routing!r} unknown; valid: {', '.join(ROUTINGS)}")
    torch.set_num_threads(opt.threads)
    built = []
    for name in cases:
        if name in LAYER_CASES:
            paths, flops = build_layer_paths(LAYER_CASES[name], opt.batch, opt.seq_len, opt.d_model, opt.routing)
        else:
            paths, flops = build_step_paths(opt.batch, opt.seq_len, opt.routing)
        for p in paths:  # warm-up
            p.step()
        built.append((name, paths, flops))
    gemm = []
    for r in range(opt.rounds):
        gemm.append(gemm_flops_per_s())
        for _, paths, _ in built:
            for p in (paths if r % 2 == 0 else paths[::-1]):
                p.time_steps(opt.steps)
        log(f"round {r + 1}/{opt.rounds}: GEMM {gemm[-1] / 1e9:.1f} GFLOP/s")
    peak = max(gemm)
    rows = []
    for name, paths, flops in built:
        ours = paths[0]
        t_ours = statistics.median(ours.times)
        for other in paths[1:]:
            if other.label == UNIFORM:
                rows.append(_routing_row(name, ours, other))
                continue
            ratios = [b / a for a, b in zip(ours.times, other.times)]
            t_other = statistics.median(other.times)
            rows.append({
                "kind": "compare", "case": name, "other": other.label, "ratio_median": statistics.median(ratios),
                "ratio_min": min(ratios), "ratio_max": max(ratios),
                "archlab_ms": 1e3 * t_ours, "other_ms": 1e3 * t_other,
                "archlab_gflops": flops / t_ours / 1e9, "other_gflops": flops / t_other / 1e9,
                "archlab_peak_fraction": flops / t_ours / peak, "other_peak_fraction": flops / t_other / peak,
                "gemm_peak_gflops": peak / 1e9,
            })
    log(format_table(rows, opt))
    return rows


def _routing_row(case: str, learned: Timed, uniform: Timed) -> dict:
    """Learned against forced uniform routing of the same archlab path: step times, their paired
    ratio learned / uniform over rounds, and both MaxVio."""
    ratios = [a / b for a, b in zip(learned.times, uniform.times)]
    return {"kind": "routing", "case": case, "learned_ms": 1e3 * statistics.median(learned.times),
            "uniform_ms": 1e3 * statistics.median(uniform.times), "ratio_median": statistics.median(ratios),
            "ratio_min": min(ratios), "ratio_max": max(ratios),
            "learned_maxvio": _maxvio(learned.moe), "uniform_maxvio": _maxvio(uniform.moe)}


def format_table(rows: list[dict], opt: argparse.Namespace) -> str:
    routing = [r for r in rows if r["kind"] == "routing"]
    rows = [r for r in rows if r["kind"] == "compare"]
    head = (f"{'case':<18} {'vs':<26} {'archlab ms':>10} {'other ms':>9} {'speedup (min-max)':>20} "
            f"{'archlab GF/s':>12} {'other GF/s':>10}")
    lines = [f"MoE suite: batch {opt.batch}, seq {opt.seq_len}, d_model {opt.d_model} (layer cases), "
             f"{opt.rounds} rounds x {opt.steps} steps, {torch.get_num_threads()} threads, fp32", head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['case']:<18} {r['other']:<26} {r['archlab_ms']:>10.1f} {r['other_ms']:>9.1f} "
                     f"{r['ratio_median']:>8.2f}x ({r['ratio_min']:.2f}-{r['ratio_max']:.2f}) "
                     f"{r['archlab_gflops']:>12.1f} {r['other_gflops']:>10.1f}")
    if rows:
        lines.append(f"fp32 GEMM peak (2048^3, best round): {rows[0]['gemm_peak_gflops']:.1f} GFLOP/s; "
                     "speedup = other time / archlab time, median of paired rounds")
    if routing:
        lines.append(format_routing_table(routing))
    return "\n".join(lines)


def format_routing_table(rows: list[dict]) -> str:
    head = (f"{'case':<18} {'learned ms':>10} {'uniform ms':>10} {'learned/uniform (min-max)':>26} "
            f"{'MaxVio learned / uniform':>25}")
    lines = ["", "archlab routing: learned (the router's top-k) against forced uniform (round-robin, N*K/E "
             "slots per expert)", head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['case']:<18} {r['learned_ms']:>10.1f} {r['uniform_ms']:>10.1f} "
                     f"{r['ratio_median']:>13.2f}x ({r['ratio_min']:.2f}-{r['ratio_max']:.2f}) "
                     f"{r['learned_maxvio']:>17.2f} / {r['uniform_maxvio']:.2f}")
    lines.append("learned/uniform = median of paired rounds of learned step time / uniform step time: "
                 "> 1 is what the learned routing's imbalance costs beyond the dispatch itself")
    return "\n".join(lines)


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tools.bench_moe", description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", dest="moe_cases", nargs="+", default=None, help=f"any of: {', '.join(ALL_CASES)}")
    p.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    p.add_argument("--steps", type=int, default=2, help="steps timed per path per round")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--d-model", type=int, default=256, help="layer cases' model width")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    p.add_argument("--routing", choices=ROUTINGS, default="learned",
                   help="learned: every path routes with its own router; uniform: also time archlab with its "
                        "routers forced to uniform round-robin routing and report learned / uniform step time")
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    try:
        if args.rounds < 1 or args.steps < 1:
            raise ValueError("--rounds and --steps must be >= 1")
        run(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
