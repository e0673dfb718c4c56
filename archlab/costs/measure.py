"""Measured counterparts of the cost model, taken on a built model: the reference it is tested
against.

- :func:`measured_flops`: ``torch.utils.flop_counter.FlopCounterMode`` over forward (+ backward).
  CPU SDPA (``_scaled_dot_product_flash_attention_for_cpu``) has no registered FLOP formula and
  would count zero, so attention runs on SDPA's math backend, whose bmm ops count the full S x S
  square (the convention of :mod:`archlab.costs.flops`).
  ``aten._grouped_mm`` (MoE experts' grouped GEMM) has no formula in torch either; importing
  this module registers one (:func:`grouped_mm_flop`), so the count covers exactly the rows the
  router sent to each expert.
- :func:`saved_activation_bytes`: the bytes autograd keeps for backward, seen through
  ``torch.autograd.graph.saved_tensors_hooks``. Tensors that share a storage count once (q, k, v
  are views of one fused projection), parameters and buffers count zero (they are weights, not
  activations).

Shape legend: B batch, S sequence, V vocabulary.
"""

from __future__ import annotations

from collections import defaultdict
from contextlib import contextmanager
from typing import Callable, Iterator, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode, flop_registry, register_flop_formula


def grouped_mm_flop(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    """2 x multiply-accumulates of ``torch._grouped_mm``, whatever the operand ranks:

    - (M, K) x (G, K, N) -> (M, N): each row times its group's matrix, 2*M*K*N;
    - (K, M) x (M, N) -> (G, K, N), M split into groups (weight gradient): 2*K*M*N;
    - (G, M, K) x (G, K, N) -> (G, M, N): 2*G*M*K*N.
    """
    if len(a_shape) == 2 and len(b_shape) == 2:
        return 2 * a_shape[0] * a_shape[1] * b_shape[1]
    n_out = 1
    for size in out_shape:
        n_out *= size
    return 2 * n_out * a_shape[-1]


if hasattr(torch.ops.aten, "_grouped_mm") and torch.ops.aten._grouped_mm not in flop_registry:
    register_flop_formula(torch.ops.aten._grouped_mm)(grouped_mm_flop)


def lm_loss(logits_BSV: Tensor, targets_BS: Tensor) -> Tensor:
    """Next-token cross-entropy as archlab.train computes it: on fp32 logits, mean over B*S."""
    return F.cross_entropy(logits_BSV.float().flatten(0, 1), targets_BS.flatten())


def _forward_loss(model: nn.Module, ids_BS: Tensor) -> Tensor:
    """Model + loss on next-token targets (a separate tensor, as a data loader yields)."""
    out = model(ids_BS)
    return lm_loss(out.logits, ids_BS.roll(-1, dims=1)) + out.aux_loss


@contextmanager
def real_routed_rows(model: nn.Module) -> Iterator[None]:
    """Run MoE experts on exactly the routed rows (grouped GEMM), never on a padded grid.

    On CPU the experts may multiply a zero-padded (E, C) grid when that is faster; its padding
    rows are real work for the machine but not for the model. The cost model counts routed
    tokens, so measurements are taken in the experts' ``grouped`` mode (where the widths allow
    grouped_mm; otherwise the experts fall back to the padded grid).
    """
    experts = [m for m in model.modules() if hasattr(m, "mode") and hasattr(m, "w_up")]
    saved = [m.mode for m in experts]
    for m in experts:
        m.mode = "grouped"
    try:
        yield
    finally:
        for m, mode in zip(experts, saved):
            m.mode = mode


def measured_flops(model: nn.Module, ids_BS: Tensor, backward: bool = True) -> dict[str, float]:
    """FLOPs counted by FlopCounterMode for one forward (and backward) on ``ids_BS``.

    Returns ``{"total": ..., <module path>: ...}`` with the counter's own per-module table
    (every module, parents included, e.g. ``Decoder.blocks.0.attn.wqkv``).
    """
    with real_routed_rows(model), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        loss = _forward_loss(model, ids_BS)
        if backward:
            loss.backward()
    out = {"total": float(counter.get_total_flops())}
    for name, per_op in counter.get_flop_counts().items():
        if name != "Global":
            out[name] = float(sum(per_op.values()))
    return out


def flops_by_component(per_module: dict[str, float]) -> dict[str, float]:
    """Regroup a forward-only :func:`measured_flops` table into the components of
    :class:`archlab.costs.flops.FlopsBreakdown` (``attention`` = scores + weighted sum).

    Only leaf modules are summed (the counter also reports every parent); the attention core is
    what ``attn`` counts beyond its two projections. Module attribution is reliable for the
    forward only: the counter attributes backward ops to the modules still on its stack.
    """
    out = dict.fromkeys(["qkv_proj", "out_proj", "attention", "mlp", "experts", "router", "lm_head"], 0.0)
    for name, flops in per_module.items():
        parts = name.split(".")
        if parts[-1] == "wqkv":
            out["qkv_proj"] += flops
        elif parts[-1] == "wo":
            out["out_proj"] += flops
        elif parts[-1] == "attn":
            out["attention"] += flops - per_module.get(name + ".wqkv", 0.0) - per_module.get(name + ".wo", 0.0)
        elif parts[-1] == "router":
            out["router"] += flops
        elif parts[-1] in ("experts", "shared") and parts[-2] == "ffn":
            out["experts"] += flops
        elif parts[-1] == "ffn" and name + ".router" not in per_module:
            out["mlp"] += flops
        elif parts[-1] == "lm_head":
            out["lm_head"] += flops
    return out


def _storage_key(t: Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.nbytes()


@contextmanager
def _attribute_to_modules(model: nn.Module) -> Iterator[Callable[[], str]]:
    """While active, ``current()`` names the innermost module whose forward is running."""
    stack: list[str] = []
    handles = []

    def enter(name: str) -> Callable:
        return lambda module, args: stack.append(name) and None

    def leave(module, args, output) -> None:
        stack.pop()

    for name, mod in model.named_modules():
        handles.append(mod.register_forward_pre_hook(enter(name)))
        handles.append(mod.register_forward_hook(leave))
    try:
        yield lambda: stack[-1] if stack else ""
    finally:
        for h in handles:
            h.remove()


def saved_activation_bytes(
    model: nn.Module,
    ids_BS: Tensor,
    loss_fn: Optional[Callable[[nn.Module, Tensor], Tensor]] = None,
) -> dict[str, int]:
    """Bytes saved for backward by one training forward (model + loss) on ``ids_BS``.

    Returns ``{"total": ..., <module path>: ...}``: each distinct storage is counted once, under
    the module that saved it first ("" = outside any module, e.g. the loss).
    """
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    weights |= {b.untyped_storage().data_ptr() for b in model.buffers()}
    seen: set[tuple[int, int]] = set()
    per_module: dict[str, int] = defaultdict(int)
    loss_fn = loss_fn or _forward_loss
    with _attribute_to_modules(model) as current, real_routed_rows(model):

        def pack(t: Tensor) -> Tensor:
            key = _storage_key(t)
            if key[0] not in weights and key not in seen:
                seen.add(key)
                per_module[current()] += key[1]
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = loss_fn(model, ids_BS)
    del loss
    return {"total": sum(per_module.values()), **dict(per_module)}
