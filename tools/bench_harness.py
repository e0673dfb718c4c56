"""The benchmark harness shared by the dense suite (``tools.bench_dense``) and the MoE suite
(``tools.bench_moe``): a model's training step with its peers, timed, and the matmul ceiling.

A training step is forward, loss, backward and AdamW (fused, the same for every model), fp32 on
the CPU, the same weights and batch for every model of a case. archlab runs the trainer's path:
``model(ids, targets=...)`` (LM head and cross-entropy fused in chunks, no (B, S, V) logits) plus
the MoE balancing loss. Its peers, per case (:func:`build_runners`):

- ``archlab, logits loss``: the same model with ``F.cross_entropy`` over its logits (what the
  fused loss saves);
- the ``transformers`` model archlab exports to (``archlab.hf.to_hf_model``; SDPA attention),
  with its own ``labels`` loss (Mixtral: ``output_router_logits=True``, its balancing loss in);
- dense GPT cases: ``tools.nanogpt``, a nanoGPT-style GPT reimplemented after karpathy/nanoGPT
  model.py (no package ships nanoGPT, and the benchmark needs no network), full-logits loss.

``mode="compiled"`` runs a model through ``torch.compile`` (default options).

The ceiling: one eager forward + backward of each model runs under :class:`MatmulRecorder`,
which notes every matrix product (``mm``, ``addmm``, ``bmm``, ``baddbmm``, ``_grouped_mm``, in
place or not) and SDPA kernel (forward and backward) at its shapes and strides. Those products
can then be timed alone (on copies: random values, SDPA's own), each as many times as the step
calls it, on the same threads: their sum is what the step would take if it did nothing but its
matrix products.

FLOPs are counted from the same recording (2 M N K per product; SDPA its two products over the
full S x S square, backward twice the forward: ``FlopCounterMode``'s convention);
:func:`gemm_flops_per_s` measures the machine's fp32 rate on a 2048^3 matmul, the peak both suites
compare with.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode

import archlab
from archlab.hf import to_hf_model
from archlab.objectives.causal_lm import CausalLM
from tools.nanogpt import from_archlab

ROOT = Path(__file__).resolve().parents[1]
MODES = ("eager", "compiled")


@dataclass(frozen=True)
class Case:
    """One benchmark case: a recipe (+ overrides) trained at ``batch`` x ``seq_len`` tokens a step."""

    name: str
    recipe: str
    overrides: tuple[str, ...] = ()
    batch: int = 8
    seq_len: int = 256


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
