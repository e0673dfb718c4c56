"""One-GPU check of archlab's bf16 training step: throughput, MFU, attention and expert kernels,
memory against the cost model; one markdown table.

    python -m tools.gpu_check                                  # dense-125m, llama-125m, mixtral-s
    python -m tools.gpu_check recipes/deepseek/s.yaml --batch 8 --seq-len 1024 --steps 20
    python -m tools.gpu_check --peak-flops 989e12              # or ARCHLAB_PEAK_FLOPS=989e12

Each recipe trains a few steps on random token ids with its model held in bf16 and AdamW (fused)
over fp32 master weights: 2 + 2 + 12 bytes per parameter, the split ``archlab.costs`` models as
precision ``bf16`` (DeepSpeed's bf16 mode; the trainer's accelerate autocast over fp32 weights
keeps more, see ``archlab/costs/memory.py``). The loss is the trainer's: ``model(ids,
targets=...)`` (LM head and cross-entropy fused in chunks) plus the MoE balancing terms.
Shapes: each recipe's ``train.micro_batch_size`` x ``train.seq_len``, except mixtral-s at
16 x 1024 (its 16 x 128 is too few tokens to load a GPU); ``--batch`` / ``--seq-len`` set all.

Columns:

- step ms, tokens/s: median over ``--steps`` timed steps after ``--warmup`` steps, synchronised;
- MFU: tokens/s x ``archlab.costs.training_flops_per_token`` / the device's peak bf16 FLOP/s:
  ``--peak-flops``, else ``$ARCHLAB_PEAK_FLOPS``, else the trainer's table by device name
  (``archlab.costs.peak.PEAK_FLOPS``, vendor dense tensor-core figures);
- SDPA: the attention kernel one step dispatched to (flash / efficient / cudnn / math, from the
  profiler's op names), and which of flash and efficient run a whole step when SDPA is
  restricted to that backend alone (``torch.nn.attention.sdpa_kernel``); reasons below the table;
- grouped_mm: MoE recipes, whether the routed experts ran ``torch.nn.functional.grouped_mm``
  (``aten::_grouped_mm`` in the profile) or fell back to the padded ``bmm``;
- states: bytes allocated between steps (bf16 weights, fp32 masters and moments; no gradients)
  against the predicted weights + optimizer states;
- peak: ``torch.cuda.max_memory_allocated`` over one step with the fused loss that was timed,
  against ``archlab.costs.training_memory(precision="bf16", device="cuda")`` for the same batch,
  and over one step with the reference loss on (B, S, V) logits (``archlab.nn.loss.lm_loss``:
  fp32 cross-entropy) against ``training_memory(..., loss="logits")``, whose ``loss`` term holds
  the N x V fp32 log-probabilities. The cost model counts bytes kept for backward; the peak adds
  the transients of the moment it is reached.

Exit status: 0 every recipe ran; 1 some recipe failed (its row says why, the others still run);
2 no CUDA device, or bad input.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

import torch
from torch import Tensor, nn

import archlab
from archlab.config import RecipeError
from archlab.costs import activation_memory, param_counts, training_flops_per_token, training_memory
from archlab.costs.measure import training_loss
from archlab.costs.peak import PEAK_FLOPS
from archlab.nn.loss import lm_loss
from archlab.objectives.causal_lm import CausalLM

ROOT = Path(__file__).resolve().parents[1]
GIB = 2.0**30
PEAK_ENV = "ARCHLAB_PEAK_FLOPS"
DEFAULT_RECIPES = ("recipes/dense/125m.yaml", "recipes/llama/125m.yaml", "recipes/mixtral/s.yaml")
# (batch, seq_len) where a recipe's own training shape is too small for a GPU check
DEFAULT_SHAPES = {"mixtral-s": (16, 1024)}
# SDPA op (profiler name) -> kernel; longest names first so that a prefix never shadows a variant
SDPA_OPS = {
    "_scaled_dot_product_flash_attention_for_cpu": "flash",
    "_scaled_dot_product_flash_attention": "flash",
    "_scaled_dot_product_efficient_attention": "efficient",
    "_scaled_dot_product_cudnn_attention": "cudnn",
    "_scaled_dot_product_fused_attention_overrideable": "overrideable",
    "_scaled_dot_product_attention_math": "math",
}
GROUPED_MM_OP = "aten::_grouped_mm"


# ----------------------------------------------------------------------------- pure helpers


def lookup_peak_flops(device_name: str, override: Optional[float] = None,
                      env: Optional[Mapping[str, str]] = None) -> tuple[Optional[float], str]:
    """(peak bf16 FLOP/s, where it comes from): ``override`` (the CLI), else ``$ARCHLAB_PEAK_FLOPS``,
    else the trainer's per-device table (first key contained in the device name). None for a
    device the table does not know: MFU is then not reported."""
    env = os.environ if env is None else env
    if override is not None:
        return _positive_flops(override, "--peak-flops"), "--peak-flops"
    if env.get(PEAK_ENV):
        try:
            value = float(env[PEAK_ENV])
        except ValueError:
            raise ValueError(f"{PEAK_ENV}={env[PEAK_ENV]!r}: not a number of FLOP/s (e.g. 989e12)") from None
        return _positive_flops(value, PEAK_ENV), f"${PEAK_ENV}"
    for key, value in PEAK_FLOPS.items():
        if key in device_name:
            return value, f"archlab.costs.peak.PEAK_FLOPS[{key!r}] (bf16 dense)"
    return None, f"no peak known for {device_name!r}: pass --peak-flops or set {PEAK_ENV}"


def _positive_flops(value: float, name: str) -> float:
    if not value > 0:
        raise ValueError(f"{name}={value!r}: the peak must be a positive number of FLOP/s")
    return float(value)


def mfu(tokens_per_s: float, flops_per_token: float, peak: Optional[float]) -> Optional[float]:
    """Model FLOPs utilisation, as the trainer defines it: tokens/s * FLOPs per token / peak."""
    return None if peak is None else tokens_per_s * flops_per_token / peak


def sdpa_kernels(op_names: Sequence[str]) -> list[str]:
    """The SDPA kernels named among profiler op names (forward or backward), in SDPA_OPS order."""
    found = []
    for name in op_names:
        op = name.removeprefix("aten::")
        for prefix, kernel in SDPA_OPS.items():
            if op.startswith(prefix):
                if kernel not in found:
                    found.append(kernel)
                break
    return sorted(found, key=list(dict.fromkeys(SDPA_OPS.values())).index)


@dataclass(frozen=True)
class MemoryCheck:
    """Measured bytes against the cost model's prediction."""

    measured: float
    predicted: float
    tolerance: float  # |measured / predicted - 1| allowed

    @property
    def ratio(self) -> float:
        return self.measured / self.predicted

    @property
    def within(self) -> bool:
        return abs(self.ratio - 1.0) <= self.tolerance

    def cell(self) -> str:
        mark = "ok" if self.within else f"off by more than {self.tolerance:.0%}"
        return f"{self.measured / GIB:.2f} / {self.predicted / GIB:.2f} ({self.ratio:.2f}x, {mark})"


def compare_memory(measured: Optional[float], predicted: float, tolerance: float) -> Optional[MemoryCheck]:
    """A MemoryCheck, or None when nothing was measured (no CUDA allocator)."""
    if predicted <= 0:
        raise ValueError(f"predicted={predicted!r}: must be positive")
    return None if measured is None else MemoryCheck(float(measured), float(predicted), tolerance)


COLUMNS = ("recipe", "params", "B x S", "step ms", "tokens/s", "MFU", "SDPA kernel", "flash / efficient alone",
           "grouped_mm", "states GiB (meas / pred)", "peak GiB, logits loss (meas / pred)",
           "peak GiB, fused loss (meas / pred)")


def format_table(rows: Sequence[dict], title: str, notes: Sequence[str] = ()) -> str:
    """One markdown table, a row per recipe (a failed recipe: its name and the error), with a title
    line above and notes below."""
    lines = [title, "", "| " + " | ".join(COLUMNS) + " |", "|" + "|".join("---" for _ in COLUMNS) + "|"]
    for r in rows:
        if "error" in r:
            cells = [r["recipe"], f"failed: {r['error']}"] + [""] * (len(COLUMNS) - 2)
        else:
            cells = [
                r["recipe"], f"{r['params'] / 1e6:.1f}M", f"{r['batch']} x {r['seq_len']}", f"{r['step_ms']:.1f}",
                f"{r['tokens_per_s']:,.0f}", "n/a" if r["mfu"] is None else f"{r['mfu']:.1%}",
                " + ".join(r["sdpa"]) or "none seen",
                " / ".join("yes" if r["sdpa_alone"][k] is None else "no" for k in ("flash", "efficient")),
                r["grouped_mm"],
                _mem_cell(r["states"]), _mem_cell(r["peak_logits"]), _mem_cell(r["peak_fused"]),
            ]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    return "\n".join(lines)


def _mem_cell(check: Optional[MemoryCheck]) -> str:
    return "n/a" if check is None else check.cell()


# ----------------------------------------------------------------------------- the training step


class MasterWeightsAdamW:
    """AdamW (fused) over fp32 master copies of a bf16 model's parameters: the bf16 gradients are
    upcast into the masters, stepped, and rounded back into the weights (2 + 2 + 12 bytes per
    parameter, with 4 more for one parameter's fp32 gradient at a time beyond the bf16 ones)."""

    def __init__(self, params, lr: float = 1e-4):
        self.params = [p for p in params if p.requires_grad]
        self.masters = [p.detach().float().clone() for p in self.params]
        self.opt = torch.optim.AdamW(self.masters, lr=lr, fused=self.params[0].device.type == "cuda")

    def step(self) -> None:
        for p, m in zip(self.params, self.masters):
            m.grad = None if p.grad is None else p.grad.float()
            p.grad = None
        self.opt.step()
        with torch.no_grad():
            for p, m in zip(self.params, self.masters):
                p.copy_(m)
                m.grad = None

    def zero_grad(self) -> None:
        for p, m in zip(self.params, self.masters):
            p.grad = m.grad = None


def fused_loss(model: nn.Module, ids_BS1: Tensor) -> Tensor:
    """The trainer's loss: fused LM head + cross-entropy, plus the MoE balancing terms."""
    return training_loss(model, ids_BS1)


def logits_loss(model: nn.Module, ids_BS1: Tensor) -> Tensor:
    """The reference cross-entropy over fp32 (B, S, V) logits (``archlab.nn.loss.lm_loss``)."""
    inputs_BS, targets_BS = CausalLM.split(ids_BS1, 1)
    out = model(inputs_BS)
    return lm_loss(out.logits, targets_BS) + out.aux_loss.float()


@dataclass
class Case:
    """One recipe, built: the bf16 model, its optimizer, a fixed batch."""

    name: str
    cfg: object  # the validated recipe (DictConfig)
    model: nn.Module
    opt: MasterWeightsAdamW
    ids_BS1: Tensor
    device: torch.device

    def step(self, loss_of: Callable[[nn.Module, Tensor], Tensor] = fused_loss) -> None:
        loss_of(self.model, self.ids_BS1).backward()
        self.opt.step()

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def build_case(recipe: str, batch: Optional[int], seq_len: Optional[int], device: torch.device) -> Case:
    path = Path(recipe) if Path(recipe).is_absolute() else ROOT / recipe
    cfg = archlab.load_recipe(path)
    b, s = DEFAULT_SHAPES.get(cfg.name, (cfg.train.micro_batch_size, cfg.train.seq_len))
    b, s = batch or b, seq_len or s
    cfg = archlab.load_recipe(path, [f"train.micro_batch_size={b}", f"train.seq_len={s}"])
    torch.manual_seed(0)
    model = archlab.build_model(cfg).to(device=device, dtype=torch.bfloat16).train()
    ids = torch.randint(0, cfg.model.vocab_size, (b, s + 1), device=device)
    return Case(cfg.name, cfg, model, MasterWeightsAdamW(model.parameters()), ids, device)


def _memory(device: torch.device) -> tuple[Optional[float], Callable[[], Optional[float]]]:
    """(bytes allocated now, a callable giving the peak since now); None off CUDA."""
    if device.type != "cuda":
        return None, lambda: None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    return float(torch.cuda.memory_allocated(device)), lambda: float(torch.cuda.max_memory_allocated(device))


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:200]


def try_sdpa_alone(case: Case, backend) -> Optional[str]:
    """None when a whole training step runs with SDPA restricted to ``backend``, else why not
    (the error, and the first reason SDPA warned about)."""
    from torch.nn.attention import sdpa_kernel

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with sdpa_kernel(backend):
                case.step()
            case.sync()
            return None
        except RuntimeError as e:
            case.opt.zero_grad()
            reasons = "; ".join(dict.fromkeys(str(w.message).splitlines()[0] for w in caught))
            return _first_line(e) + (f" (SDPA warned: {reasons[:300]})" if reasons else "")


def profiled_ops(case: Case) -> dict[str, int]:
    """Op name -> calls during one training step (CPU-side profiler: aten op names)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        case.step()
        case.sync()
    return {e.key: e.count for e in prof.key_averages()}


def check_case(recipe: str, args: argparse.Namespace, device: torch.device, peak: Optional[float]) -> tuple[dict, list]:
    """Everything the table says about one recipe, and its notes."""
    from torch.nn.attention import SDPBackend

    case = build_case(recipe, args.batch, args.seq_len, device)
    b, s = case.ids_BS1.shape[0], case.ids_BS1.shape[1] - 1
    model_cfg = archlab.model_config(case.cfg)
    notes = []
    for _ in range(args.warmup):  # allocator, kernels, optimizer states
        case.step()
    times = []
    for _ in range(args.steps):
        case.sync()
        t0 = time.perf_counter()
        case.step()
        case.sync()
        times.append(time.perf_counter() - t0)
    states_now, fused_peak = _memory(device)  # between steps: weights, masters, moments (AdamW state exists now)
    case.step()
    peak_fused = fused_peak()
    _, logits_peak = _memory(device)
    case.step(logits_loss)
    peak_logits = logits_peak()
    ops = profiled_ops(case)
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION}
    alone = {name: try_sdpa_alone(case, backend) for name, backend in backends.items()}
    for name, why in alone.items():
        if why is not None:
            notes.append(f"{case.name}: SDPA restricted to {name} fails: {why}")
    predicted = training_memory(model_cfg, b, s, precision="bf16", device="cuda")
    predicted_logits = training_memory(model_cfg, b, s, precision="bf16", device="cuda", loss="logits")
    acts = activation_memory(model_cfg, b, s, dtype="bf16", device="cuda", loss="logits")
    notes.append(f"{case.name}: {acts.model['loss'] / GIB:.3g} GiB of the logits loss's prediction is its loss "
                 "term (LM-head input, N x V fp32 log-probabilities), which the fused loss never holds")
    step_s = statistics.median(times)
    tokens_per_s = b * s / step_s
    flops = training_flops_per_token(model_cfg, s)
    if model_cfg.moe is None:
        grouped = "-"
    else:
        calls = ops.get(GROUPED_MM_OP, 0)
        grouped = f"yes ({calls} calls)" if calls else "no: padded bmm"
    row = {
        "recipe": case.name, "params": param_counts(model_cfg).total, "batch": b, "seq_len": s,
        "step_ms": 1e3 * step_s, "tokens_per_s": tokens_per_s, "mfu": mfu(tokens_per_s, flops, peak),
        "flops_per_token": flops, "sdpa": sdpa_kernels(list(ops)), "sdpa_alone": alone, "grouped_mm": grouped,
        "states": compare_memory(states_now, predicted["weights"] + predicted["optimizer"], args.mem_tolerance),
        "peak_logits": compare_memory(peak_logits, predicted_logits["total"], args.mem_tolerance),
        "peak_fused": compare_memory(peak_fused, predicted["total"], args.mem_tolerance),
    }
    return row, notes


def release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- CLI


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tools.gpu_check", description=__doc__.split("\n\n")[0])
    p.add_argument("recipes", nargs="*", default=list(DEFAULT_RECIPES), help="recipe files (default: %(default)s)")
    p.add_argument("--batch", type=int, default=None, help="micro-batch for every recipe (default: see above)")
    p.add_argument("--seq-len", type=int, default=None, help="sequence length for every recipe")
    p.add_argument("--steps", type=int, default=10, help="timed steps per recipe")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--peak-flops", type=float, default=None,
                   help=f"peak bf16 FLOP/s of the device for MFU, e.g. 989e12 (else ${PEAK_ENV}, else by device name)")
    p.add_argument("--mem-tolerance", type=float, default=0.25, help="memory: |measured / predicted - 1| called ok")
    p.add_argument("--time-budget-s", type=float, default=270.0,
                   help="start no further recipe after this many seconds (the whole check is meant for < 5 min)")
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # tests: the same code on CPU
    return p.parse_args(argv)


def run(args: argparse.Namespace, log: Callable[[str], None] = print) -> int:
    """Check every recipe on ``args.device``; print the table; 0 if all ran, 1 otherwise."""
    if args.steps < 1 or args.warmup < 0:
        raise ValueError("--steps must be >= 1 and --warmup >= 0")
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    peak, peak_source = lookup_peak_flops(name, args.peak_flops)
    t_start = time.perf_counter()
    rows, notes = [], []
    for recipe in args.recipes:
        if time.perf_counter() - t_start > args.time_budget_s:
            rows.append({"recipe": recipe, "error": f"skipped: over the --time-budget-s of {args.time_budget_s:.0f} s"})
            continue
        try:
            row, case_notes = check_case(recipe, args, device, peak)
        except Exception as e:  # one broken recipe must not hide the others' numbers
            row, case_notes = {"recipe": recipe, "error": _first_line(e)}, []
        rows.append(row)
        notes += case_notes
        release(device)
    cuda = f", CUDA {torch.version.cuda}" if device.type == "cuda" else ""
    peak_text = "MFU not reported" if peak is None else f"{peak / 1e12:.0f} TFLOP/s"
    title = (f"**archlab GPU check**: {name}, torch {torch.__version__}{cuda}; bf16 weights + fp32 master AdamW; "
             f"peak {peak_text} ({peak_source}); {time.perf_counter() - t_start:.0f} s")
    notes = [
        "MFU = tokens/s x archlab.costs.training_flops_per_token (matmuls, full attention square) / peak.",
        "memory: predicted = archlab.costs.training_memory(precision='bf16', device='cuda'), bytes kept for "
        "backward plus model states; the measured peak also holds the transients of its moment.",
    ] + notes
    log(format_table(rows, title, notes))
    return 1 if any("error" in r for r in rows) else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        print(f"error: tools.gpu_check needs a CUDA GPU; torch {torch.__version__} sees none "
              "(torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    try:
        for recipe in args.recipes:
            if not (Path(recipe) if Path(recipe).is_absolute() else ROOT / recipe).is_file():
                raise ValueError(f"recipe {recipe!r} not found")
        return run(args)
    except (RecipeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
