"""GPU check of the trainer itself: ``archlab.train`` runs each recipe eager and compiled, and the check
reads the run folders; one markdown table (stdout, and ``--out``), the one docs/benchmarks.md takes.

    python -m tools.gpu_check --out gpu_check.md             # one GPU: 3 recipes x eager/compiled, < 5 min
    python -m tools.gpu_check --peak-flops 989e12            # or ARCHLAB_PEAK_FLOPS=989e12; else the trainer's table
    python -m tools.gpu_check --dry-run                      # the same code path on CPU, tiny recipes, few steps

Every run is the trainer's (``python -m tools.gpu_check.probe``: ``archlab.train``'s Trainer as
``python -m archlab.train`` builds it, accelerate, the recipe's precision and optimizer, ``train.compile``,
plus one profiled step; no checkpoint written) on ``data.tokenizer=byte`` text (throughput does not
depend on the text; no BPE to train). Recipes (``CASES``): dense-125m (recipes/dense/125m.yaml), a
Mixtral-style (8 experts, top-2) and a fine-grained DeepSeek-style MoE (64 routed top-6 + 2 shared) of
about 320M parameters, recipes/{mixtral,deepseek}/s.yaml widened to d_model 768 with GPT-2's vocabulary;
each at 8 x 2048 tokens a step (``--batch``, ``--seq-len``). A run takes ``--warmup`` steps (compilation
included), ``--steps`` timed steps, then the profiled step; rows every ``--log-every`` steps. Every eager
run goes first; none starts past ``--time-budget-s`` (its row says so). The run folders, and each run's
output as ``<run>.log``, stay under ``--runs-dir`` (default runs/gpu_check/<date>-<time>/).

Columns:

- tokens/s: the trainer's metrics.jsonl rows over the timed steps (tokens / seconds, evaluation and
  checkpoints left out: its own definition); MFU the trainer's, tokens/s x flops_per_token / (peak_flops
  x world_size), the peak from env.json (``train.peak_flops``, else its per-device table);
- peak GiB: ``max_memory_allocated`` of the trainer's last row (``torch.cuda.max_memory_allocated`` over
  the whole run) against the cost model's plan of the run's peak (``archlab.costs.plan.memory_plan`` for its
  launch and precision, :func:`planned_memory`); n/a off CUDA;
- SDPA: the attention kernel of the profiled step (aten op names; on CUDA also the kernels' names);
- grouped GEMM: MoE recipes, whether the routed experts ran ``grouped_mm`` (``aten::_grouped_mm`` or
  ``archlab::grouped_mm`` ops, or a CUDA kernel named grouped) or the padded ``bmm``.

With several GPUs: expert-parallel scaling of the DeepSeek-style recipe, ep = 1, 2, 4, 8 (up to the GPUs
seen), one process per GPU under ``accelerate launch --config_file recipes/launch/zero0.yaml`` with
``model.moe.ep_size`` = processes (weak scaling: the micro batch per GPU fixed). Skipped, saying why, on
one GPU, and in the dry run unless ``--ep-sizes`` is given (processes over gloo).

Exit status: 0 every run completed; 1 some run failed (its row says why, the others still run);
2 no CUDA device (without ``--dry-run``), or bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

import torch

import archlab
from archlab.config import RecipeError
from archlab.costs import param_counts
from archlab.costs.plan import Launch, MemoryPlan, memory_plan, read_launch
from tools.gpu_check.probe import PROBE

ROOT = Path(__file__).resolve().parents[2]
GIB = 2.0**30
PEAK_ENV = "ARCHLAB_PEAK_FLOPS"
MODES = ("eager", "compiled")
EP_SIZES = (1, 2, 4, 8)
EP_LAUNCH = "recipes/launch/zero0.yaml"
# SDPA op (profiler name) -> kernel; longest names first so that a prefix never shadows a variant
SDPA_OPS = {
    "_scaled_dot_product_flash_attention_for_cpu": "flash",
    "_scaled_dot_product_flash_attention": "flash",
    "_scaled_dot_product_efficient_attention": "efficient",
    "_scaled_dot_product_cudnn_attention": "cudnn",
    "_scaled_dot_product_fused_attention_overrideable": "overrideable",
    "_scaled_dot_product_attention_math": "math",
}
GROUPED_OPS = ("aten::_grouped_mm", "archlab::grouped_mm")


@dataclass(frozen=True)
class Case:
    """One row group of the table: a recipe and its overrides."""

    label: str
    recipe: str
    overrides: tuple[str, ...] = ()


# the MoE recipes of size step 's' widened to GPT-3 Small's width and vocabulary: ~320M parameters, ~130-150M active
_WIDE = ("model.d_model=768", "model.n_heads=12", "model.n_kv_heads=4", "model.vocab_size=50304",
         "model.max_seq_len=2048")
CASES = (
    Case("dense-125m", "recipes/dense/125m.yaml"),
    Case("mixtral-320m", "recipes/mixtral/s.yaml", _WIDE + ("model.moe.expert_hidden=1024",)),
    Case("deepseek-320m", "recipes/deepseek/s.yaml", _WIDE + ("model.moe.expert_hidden=128",)),
)
DRY_CASES = (
    Case("dense-tiny", "recipes/dense/tiny.yaml"),
    Case("mixtral-tiny", "recipes/mixtral/tiny.yaml"),
    Case("deepseek-tiny", "recipes/deepseek/tiny.yaml"),
)
EP_CASE = 2  # the fine-grained DeepSeek-style case: the expert-parallel scaling's
GPU_SHAPE, DRY_SHAPE = (8, 2048), (4, 64)


# ----------------------------------------------------------------------------- pure helpers


def peak_override(cli: Optional[float], env: Optional[Mapping[str, str]] = None) -> Optional[float]:
    """The peak FLOP/s to give the trainer (``train.peak_flops``): ``--peak-flops``, else
    ``$ARCHLAB_PEAK_FLOPS``, else None (the trainer's own per-device table)."""
    env = os.environ if env is None else env
    value, name = (cli, "--peak-flops") if cli is not None else (env.get(PEAK_ENV) or None, PEAK_ENV)
    if value is None:
        return None
    try:
        value = float(value)
    except ValueError:
        raise ValueError(f"{name}={value!r}: not a number of FLOP/s (e.g. 989e12)") from None
    if not value > 0:
        raise ValueError(f"{name}={value!r}: the peak must be a positive number of FLOP/s")
    return value


def sdpa_kernels(op_names: Sequence[str]) -> list[str]:
    """The SDPA kernels named among profiler op names (forward or backward), in SDPA_OPS order."""
    found = set()
    for name in op_names:
        op = name.removeprefix("aten::")
        for prefix, kernel in SDPA_OPS.items():
            if op.startswith(prefix):
                found.add(kernel)
                break
    return [k for k in dict.fromkeys(SDPA_OPS.values()) if k in found]


def cuda_attention_kernels(kernel_names: Sequence[str]) -> list[str]:
    """Attention kernels among CUDA kernel names: flash (``flash_fwd``...), efficient (xformers'
    ``fmha_cutlass``), cudnn (cuDNN's fused attention)."""
    found = []
    for name in kernel_names:
        low = name.lower()
        kind = ("flash" if "flash" in low else "efficient" if "fmha_cutlass" in low or "mem_eff" in low
                else "cudnn" if "cudnn" in low and ("sdpa" in low or "fmha" in low or "attention" in low) else None)
        if kind is not None and kind not in found:
            found.append(kind)
    return found


def grouped_gemm(moe: bool, ops: Mapping[str, int], kernels: Mapping[str, int]) -> str:
    """The grouped-GEMM cell: ``-`` for a dense model, else which expert GEMM the probed step ran."""
    if not moe:
        return "-"
    calls = max(ops.get(op, 0) for op in GROUPED_OPS)  # archlab::grouped_mm wraps aten::_grouped_mm
    grouped_kernels = sum(n for k, n in kernels.items() if "grouped" in k.lower())
    if calls or grouped_kernels:
        return f"yes ({calls} calls" + (f", {grouped_kernels} grouped kernels)" if kernels else ")")
    return f"no: padded bmm ({ops.get('aten::bmm', 0)} calls)"


def timed_rows(rows: Sequence[dict], warmup: int, steps: int) -> list[dict]:
    """The trainer's ``train`` rows whose windows lie in the timed steps (warmup + 1 ... warmup + steps)."""
    return [r for r in rows if r.get("kind") == "train" and warmup < r["step"] <= warmup + steps]


def throughput(rows: Sequence[dict], log_every: int) -> float:
    """Tokens/s over rows of ``log_every`` steps each (equal tokens): total tokens / total seconds."""
    if not rows:
        raise ValueError("no timed rows: --steps must be a multiple of --log-every")
    return len(rows) / sum(1.0 / r["tokens_per_s"] for r in rows)


def planned_memory(cfg, batch: int, seq_len: int, mixed: bool, device: str, ep: Optional[int] = None) -> MemoryPlan:
    """The cost model's plan of one rank of the run (``archlab.costs.plan.memory_plan``): one process, or
    (``ep``) ``ep`` processes under the expert-parallel launch (DeepSpeed stage 0) at ``ep_size`` = ep;
    ``mixed``: the run's bf16 (autocast, or DeepSpeed's bf16 engine), else fp32."""
    launch = Launch() if ep is None else read_launch(ROOT / EP_LAUNCH, gpus=ep)
    return memory_plan(cfg, launch, precision="bf16" if mixed else "fp32", batch=batch, seq_len=seq_len,
                       ep=ep or 1, device=device)


def memory_cell(measured: Optional[float], planned: float) -> str:
    return f"n/a / {planned / GIB:.2f}" if measured is None else \
        f"{measured / GIB:.2f} / {planned / GIB:.2f} ({measured / planned:.2f}x)"


COLUMNS = ("recipe", "mode", "params (total / active)", "B x S", "steps", "tokens/s", "MFU",
           "peak GiB (meas / plan)", "SDPA", "grouped GEMM")
EP_COLUMNS = ("recipe", "GPUs = ep", "backend", "B x S per GPU", "tokens/s", "tokens/s per GPU", "scaling",
              "all-to-all calls", "peak GiB (meas / plan)", "grouped GEMM")
ALL_TO_ALL_OP = "_c10d_functional::all_to_all_single"  # the expert-parallel token exchange, forward


def _table(columns: Sequence[str], cells: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for row in cells:
        row = list(row) + [""] * (len(columns) - len(row))
        lines.append("| " + " | ".join(c.replace("|", "/") for c in row) + " |")
    return lines


def row_cells(r: dict) -> list[str]:
    """One run's cells (a failed or skipped run: its name, mode and why)."""
    if "error" in r:
        return [r["recipe"], r["mode"], f"failed: {r['error']}"]
    return [r["recipe"], r["mode"], f"{r['params'] / 1e6:.1f}M / {r['active'] / 1e6:.1f}M",
            f"{r['batch']} x {r['seq_len']}", f"{r['timed_steps']} of {r['max_steps']}", f"{r['tokens_per_s']:,.0f}",
            f"{r['mfu']:.1%}", memory_cell(r["peak_mem"], r["plan_mem"]), r["sdpa"], r["grouped"]]


def ep_cells(r: dict, base: Optional[float]) -> list[str]:
    if "error" in r:
        return [r["recipe"], str(r["ep"]), f"failed: {r['error']}"]
    per_gpu = r["tokens_per_s"] / r["ep"]
    scaling = "n/a" if base is None else f"{per_gpu / base:.2f}"
    return [r["recipe"], str(r["ep"]), r["backend"], f"{r['batch']} x {r['seq_len']}", f"{r['tokens_per_s']:,.0f}",
            f"{per_gpu:,.0f}", scaling, str(r["ops"].get(ALL_TO_ALL_OP, 0)), memory_cell(r["peak_mem"], r["plan_mem"]),
            r["grouped"]]


def format_report(title: str, rows: Sequence[dict], ep_rows: Sequence[dict], ep_skipped: Optional[str],
                  notes: Sequence[str] = ()) -> str:
    """The markdown the check prints: title, the eager/compiled table, its notes, the expert-parallel
    table (or why it was skipped)."""
    lines = [title, ""] + _table(COLUMNS, [row_cells(r) for r in rows])
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    lines += ["", "**Expert-parallel scaling**" + (f": skipped: {ep_skipped}" if ep_skipped else "")]
    if not ep_skipped:
        ok = [r for r in ep_rows if "error" not in r and r["ep"] == 1]
        base = ok[0]["tokens_per_s"] if ok else None
        lines += ["", *_table(EP_COLUMNS, [ep_cells(r, base) for r in ep_rows]),
                  "", "- scaling: tokens/s per GPU over ep=1's (1.00: linear weak scaling); all-to-all calls: rank 0's "
                  "token exchanges in the profiled step."]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- runs


@dataclass(frozen=True)
class Plan:
    """What every run of the check shares."""

    runs_dir: Path
    batch: int
    seq_len: int
    warmup: int
    steps: int
    log_every: int
    peak: Optional[float]
    device: str  # cuda | cpu (the dry run)
    timeout_s: float

    @property
    def max_steps(self) -> int:
        return self.warmup + self.steps + 1  # the last step is the profiled one

    def overrides(self, case: Case, name: str, compiled: bool) -> list[str]:
        """The trainer's overrides for one run: the case's, then the check's shape, steps and run folder."""
        never = 10**9
        return [*case.overrides, f"train.micro_batch_size={self.batch}", f"train.seq_len={self.seq_len}",
                "data.tokenizer=byte", f"data.cache_dir={self.runs_dir / 'data-cache'}",
                f"train.out_dir={self.runs_dir}", f"train.run_name={name}", f"train.max_steps={self.max_steps}",
                f"train.log_every={self.log_every}", f"train.eval_every={never}", f"train.ckpt_every={never}",
                "train.eval_batches=1", "train.eval_context_multipliers=[1]", f"train.compile={str(compiled).lower()}",
                *([f"train.peak_flops={self.peak}"] if self.peak is not None else [])]


def trainer_command(case: Case, overrides: Sequence[str], processes: Optional[int] = None) -> list[str]:
    """The command of one run: the trainer (with its probe) in one process, or under ``accelerate launch``
    with ``processes`` processes (DeepSpeed stage 0, the expert-parallel backend's launch)."""
    probe = ["-m", "tools.gpu_check.probe", case.recipe, *overrides, "--no-checkpoint"]
    if processes is None:
        return [sys.executable, *probe]
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", EP_LAUNCH,
            "--num_processes", str(processes), *probe]


def run_command(cmd: Sequence[str], timeout_s: float) -> tuple[Optional[int], str]:
    """(exit status, stdout + stderr) of ``cmd`` run from the repository root; (None, output) past
    ``timeout_s``, its whole process group killed (a launcher's worker processes included)."""
    with subprocess.Popen(list(cmd), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True) as p:
        try:
            output = p.communicate(timeout=timeout_s)[0]
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            return None, p.communicate()[0]
    return p.returncode, output


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return (lines[-1] if lines else "no output")[:200]


def read_run(run: Path, plan: Plan) -> dict:
    """What the table says about one finished run, from its folder: the trainer's metrics.jsonl rows,
    env.json, summary.json and the probe's op names."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    env = json.loads((run / "env.json").read_text())
    summary = json.loads((run / "summary.json").read_text())
    probe = json.loads((run / PROBE).read_text())
    if summary["status"] != "completed" or summary["step"] != plan.max_steps:
        raise RuntimeError(f"{run}: {summary['status']} at step {summary['step']} of {plan.max_steps}")
    timed = timed_rows(rows, plan.warmup, plan.steps)
    tokens_per_s = throughput(timed, plan.log_every)
    train = [r for r in rows if r.get("kind") == "train"]
    sdpa = " + ".join(sdpa_kernels(list(probe["ops"]))) or "none seen"
    if probe["kernels"]:
        sdpa += f" (kernels: {' + '.join(cuda_attention_kernels(list(probe['kernels']))) or 'none seen'})"
    return {"run": str(run), "rows": len(train), "last_step": train[-1]["step"], "timed_steps": plan.steps,
            "max_steps": plan.max_steps, "tokens_per_s": tokens_per_s, "world_size": env["world_size"],
            "mfu": tokens_per_s * env["flops_per_token"] / (env["peak_flops"] * env["world_size"]),
            "mixed_precision": env["mixed_precision"], "device_name": env["device_name"], "backend": env.get("backend"),
            "peak_mem": train[-1].get("max_memory_allocated"), "sdpa": sdpa, "ops": probe["ops"],
            "kernels": probe["kernels"]}


def run_case(case: Case, plan: Plan, mode: str, ep: Optional[int] = None, log: Callable[[str], None] = print) -> dict:
    """Train one case in one mode in one process, or (``ep``) under ``accelerate launch`` on ``ep`` GPUs
    at ``model.moe.ep_size=ep``; read its folder: a row."""
    compiled = mode == "compiled"
    name = f"{case.label}-{mode}" if ep is None else f"{case.label}-ep{ep}"
    overrides = plan.overrides(case, name, compiled) + ([f"model.moe.ep_size={ep}"] if ep is not None else [])
    processes = ep or 1
    row = {"recipe": case.label, "mode": mode, "ep": processes}
    cfg = archlab.load_recipe(ROOT / case.recipe, overrides)
    cmd = trainer_command(case, overrides, ep)
    log(f"[gpu_check] {name}: {' '.join(cmd[1:])}")
    t0 = time.perf_counter()
    status, output = run_command(cmd, plan.timeout_s)
    (plan.runs_dir / f"{name}.log").write_text(output)
    if status is None:
        return {**row, "error": f"over the {plan.timeout_s:.0f} s limit of a run"}
    if status != 0:
        return {**row, "error": f"exit {status}: {_last_line(output)}"}
    out = read_run(plan.runs_dir / name, plan)
    counts = param_counts(archlab.model_config(cfg))
    moe = cfg.model.moe is not None
    mem = planned_memory(cfg, plan.batch, plan.seq_len, out["mixed_precision"] == "bf16", plan.device, ep)
    log(f"[gpu_check] {name}: {out['tokens_per_s']:,.0f} tokens/s in {time.perf_counter() - t0:.0f} s")
    return {**row, **out, "params": counts.total, "active": counts.active, "batch": plan.batch,
            "seq_len": plan.seq_len, "plan_mem": mem.peak, "plan_regime": mem.regime,
            "grouped": grouped_gemm(moe, out["ops"], out["kernels"])}


def ep_skip_reason(dry_run: bool, gpus: int, asked: Sequence[int]) -> Optional[str]:
    """Why the expert-parallel scaling does not run, or None when it does (a dry run: over gloo processes,
    when ``--ep-sizes`` names them)."""
    if not asked:
        return "CPU dry run (--ep-sizes 1 2 runs it in processes over gloo)" if dry_run else "--ep-sizes is empty"
    if not dry_run and gpus < 2:
        return f"{gpus} GPU visible; ep 2/4/8 needs as many GPUs"
    return None


def run(args: argparse.Namespace, log: Callable[[str], None] = print) -> tuple[int, str, list[dict]]:
    """Every case eager and compiled (then expert-parallel scaling): (exit status, report, rows)."""
    dry = args.dry_run
    runs_dir = Path(args.runs_dir) / time.strftime("%Y%m%d-%H%M%S")
    runs_dir.mkdir(parents=True, exist_ok=False)
    batch, seq_len = DRY_SHAPE if dry else GPU_SHAPE
    plan = Plan(runs_dir.resolve(), args.batch or batch, args.seq_len or seq_len, args.warmup, args.steps,
                args.log_every, peak_override(args.peak_flops), "cpu" if dry else "cuda", args.run_timeout_s)
    cases = [c for c in (DRY_CASES if dry else CASES) if not args.only or c.label in args.only]
    t_start = time.perf_counter()

    def attempt(row: dict, case: Case, ep: Optional[int] = None, since: float = t_start) -> dict:
        """The run's row; skipped past the time budget; a failure's row says why (the others still run)."""
        if time.perf_counter() - since > args.time_budget_s:
            return {**row, "error": f"skipped: over the --time-budget-s of {args.time_budget_s:.0f} s"}
        try:
            return run_case(case, plan, row["mode"], ep=ep, log=log)
        except Exception as e:
            return {**row, "error": f"{type(e).__name__}: {e}"[:200]}

    # every eager run first: past the time budget the compiled runs are the ones skipped
    done = {(c.label, m): attempt({"recipe": c.label, "mode": m}, c) for m in args.modes for c in cases}
    rows = [done[c.label, m] for c in cases for m in args.modes]
    gpus = 0 if dry else torch.cuda.device_count()
    skipped = ep_skip_reason(dry, gpus, args.ep_sizes)
    ep_start = time.perf_counter()  # the scaling runs have a time budget of their own
    ep_case = (DRY_CASES if dry else CASES)[EP_CASE]
    ep_rows = [] if skipped else [attempt({"recipe": ep_case.label, "mode": "eager", "ep": ep}, ep_case, ep, ep_start)
                                  for ep in args.ep_sizes if dry or ep <= gpus]
    ok = [r for r in rows + ep_rows if "error" not in r]
    device = ok[0]["device_name"] if ok else ("cpu" if dry else "cuda")
    cuda = f", CUDA {torch.version.cuda}" if not dry else ""
    precision = {"no": "fp32", "bf16": "bf16 autocast"}.get(ok[0]["mixed_precision"], ok[0]["mixed_precision"]) \
        if ok else "?"
    title = (f"**archlab GPU check{' (CPU dry run)' if dry else ''}**: {device}, torch {torch.__version__}{cuda}; "
             f"the trainer's runs (precision {precision}); warmup {plan.warmup}, "
             f"{plan.steps} timed steps, 1 profiled; {time.perf_counter() - t_start:.0f} s")
    notes = ["tokens/s, MFU: the trainer's own metrics.jsonl rows over the timed steps (MFU = tokens/s x "
             "archlab.costs.training_flops_per_token / the trainer's peak_flops).",
             "peak: the trainer's max_memory_allocated (whole run) / the plan's peak: archlab.costs.plan.memory_plan "
             "for the run's launch and precision (regime " + ", ".join(sorted({r["plan_regime"] for r in ok})) + ").",
             f"run folders: {plan.runs_dir}"]
    report = format_report(title, rows, ep_rows, skipped, notes)
    status = 1 if any("error" in r for r in rows + ep_rows) else 0
    return status, report, rows + ep_rows


# ----------------------------------------------------------------------------- CLI


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tools.gpu_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="on CPU, tiny recipes, few steps; n/a where CUDA-only")
    p.add_argument("--out", default=None, help="also write the markdown report to this file")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES), help="default: %(default)s")
    p.add_argument("--only", nargs="+", default=None,
                   help="only these cases (labels, e.g. dense-125m; none: the expert-parallel scaling alone)")
    p.add_argument("--batch", type=int, default=None, help=f"micro batch (default {GPU_SHAPE[0]}; dry {DRY_SHAPE[0]})")
    p.add_argument("--seq-len", type=int, default=None, help=f"default {GPU_SHAPE[1]}; dry {DRY_SHAPE[1]}")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first, compilation included (5; dry 1)")
    p.add_argument("--steps", type=int, default=None, help="timed steps (20; dry 2)")
    p.add_argument("--log-every", type=int, default=None, help="the trainer's row interval (5; dry 1)")
    p.add_argument("--ep-sizes", type=int, nargs="*", default=None,
                   help="expert-parallel sizes timed, up to the GPUs seen (default 1 2 4 8; dry run: none)")
    p.add_argument("--peak-flops", type=float, default=None,
                   help=f"peak bf16 FLOP/s for MFU, e.g. 989e12 (else ${PEAK_ENV}, else the trainer's table)")
    p.add_argument("--runs-dir", default=str(ROOT / "runs" / "gpu_check"), help="run folders go in a dated folder here")
    p.add_argument("--time-budget-s", type=float, default=None,
                   help="start no further run after this many seconds (280; dry 1800)")
    p.add_argument("--run-timeout-s", type=float, default=None, help="limit of one run (240; dry 900)")
    args = p.parse_args(argv)
    dry = args.dry_run
    args.warmup = args.warmup if args.warmup is not None else (1 if dry else 5)
    args.steps = args.steps if args.steps is not None else (2 if dry else 20)
    args.log_every = args.log_every if args.log_every is not None else (1 if dry else 5)
    args.ep_sizes = args.ep_sizes if args.ep_sizes is not None else ([] if dry else list(EP_SIZES))
    args.time_budget_s = args.time_budget_s if args.time_budget_s is not None else (1800.0 if dry else 280.0)
    args.run_timeout_s = args.run_timeout_s if args.run_timeout_s is not None else (900.0 if dry else 240.0)
    unknown = set(args.only or ()) - {c.label for c in CASES + DRY_CASES} - {"none"}
    if unknown:
        raise ValueError(f"--only {' '.join(sorted(unknown))}: no such case; cases: "
                         f"{', '.join(c.label for c in CASES + DRY_CASES)}")
    if args.steps < 1 or args.warmup < 1 or args.log_every < 1:
        raise ValueError("--steps, --warmup and --log-every must be >= 1")
    if args.steps % args.log_every or args.warmup % args.log_every:
        raise ValueError(f"--warmup {args.warmup} and --steps {args.steps} must be multiples of --log-every "
                         f"{args.log_every} (the trainer's rows must not straddle warmup and timed steps)")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        args = parse_args(argv)
        if not args.dry_run and not torch.cuda.is_available():
            print(f"error: tools.gpu_check needs a CUDA GPU; torch {torch.__version__} sees none "
                  "(torch.cuda.is_available() is False; --dry-run runs it on CPU)", file=sys.stderr)
            return 2
        peak_override(args.peak_flops)
        for case in CASES + DRY_CASES:
            if not (ROOT / case.recipe).is_file():
                raise ValueError(f"recipe {case.recipe!r} not found")
        status, report, _ = run(args, log=lambda m: print(m, file=sys.stderr, flush=True))
    except (RecipeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(report)
    if args.out:
        Path(args.out).write_text(report + "\n")
    return status
