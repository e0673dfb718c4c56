"""Measured counterparts of the cost model, taken on a built model: the reference it is tested
against.

- :func:`measured_flops`: ``torch.utils.flop_counter.FlopCounterMode`` over forward (+ backward).
  CPU SDPA (``_scaled_dot_product_flash_attention_for_cpu``) has no registered FLOP formula and
  would count zero, so attention runs on SDPA's math backend, whose bmm ops count the full S x S
  square (the convention of :mod:`archlab.costs.flops`).
  ``aten._grouped_mm`` (MoE experts' grouped GEMM) has no formula in torch either; importing
  this module registers one (:func:`grouped_mm_flop`), so the count covers exactly the rows the
  router sent to each expert; nor does the in-place ``aten.addmm_`` of the fused loss
  (:func:`addmm_inplace_flop`).
- :func:`saved_activation_bytes`: the bytes autograd keeps for backward, seen through
  ``torch.autograd.graph.saved_tensors_hooks``. Tensors that share a storage count once (q, k, v
  are views of one fused projection), parameters and buffers count zero (they are weights, not
  activations). Under activation checkpointing the hooks see what a checkpointed block keeps
  (its input) but not the op outputs selective checkpointing caches itself: those are read from
  its cache.

Both run :func:`training_loss`, the trainer's forward + loss on a token window (the objective's,
``archlab.objectives``): by default the fused LM-head cross-entropy, or (``loss="logits"``) the
reference :func:`archlab.nn.loss.lm_loss` on the model's logits.

Shape legend: B batch, S sequence, V vocabulary.
"""

from __future__ import annotations

import weakref
from collections import defaultdict
from contextlib import contextmanager
from typing import Callable, Iterator, Optional

import torch
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode, flop_registry, register_flop_formula

from archlab.config.schema import TrainConfig
from archlab.model import checkpointing
from archlab.objectives import objective_class, objective_name

LOSSES = ("fused", "logits")


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


def addmm_inplace_flop(self_shape, a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    """``c.addmm_(a, b)``, (M, K) x (K, N): 2*M*K*N, as addmm. The fused loss accumulates the LM
    head's weight gradient so; torch's counter has no formula for the in-place op."""
    return 2 * a_shape[0] * a_shape[1] * b_shape[1]


if torch.ops.aten.addmm_ not in flop_registry:
    register_flop_formula(torch.ops.aten.addmm_)(addmm_inplace_flop)


def training_loss(model: nn.Module, x_BW: Tensor, loss: str = "fused") -> Tensor:
    """What back-propagates for one training window, as the trainer computes it: the objective the model
    implies (``archlab.objectives``: causal LM on a (B, S+1) window; MTP on (B, S+1+K) for a model with K
    MTP modules; masked LM on (B, S) for an encoder, the masks of step 0) through its ``loss``
    (``Trainer._forward_loss``: the fused LM head, no logits).
    ``loss="logits"``: the reference cross-entropy on the (B, S, V) logits (causal LM; masked LM with the
    same masks)."""
    if loss not in LOSSES:
        raise ValueError(f"loss={loss!r}: must be one of {', '.join(LOSSES)}")
    name = objective_name(model.cfg)
    objective = objective_class(name)(_MeasureRecipe(model.cfg, name))
    return objective.loss(model, x_BW).total if loss == "fused" else objective.logits_loss(model, x_BW)


class _MeasureRecipe:
    """The recipe an objective is built from when only a model is at hand: its config, default training
    settings and the objective's default options (the loss weights scale gradients, not what is computed or
    kept)."""

    def __init__(self, model_cfg, objective: str):
        from omegaconf import OmegaConf

        options = objective_class(objective).Config(type=objective)
        self.model, self.train = model_cfg, OmegaConf.structured(TrainConfig(objective=options))


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


def measured_flops(model: nn.Module, x_BS1: Tensor, backward: bool = True, loss: str = "fused") -> dict[str, float]:
    """FLOPs counted by FlopCounterMode for one forward (and backward) on the window ``x_BS1``.

    Returns ``{"total": ..., <module path>: ...}`` with the counter's own per-module table
    (every module, parents included, e.g. ``Decoder.blocks.0.attn.wqkv``). The fused loss runs
    the LM head's backward matmuls in the forward, outside the ``lm_head`` module: a forward-only
    table by component wants ``loss="logits"``; totals with backward are the same for both.
    """
    with real_routed_rows(model), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        loss = training_loss(model, x_BS1, loss)
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
    what ``attn`` counts beyond its projections. Module attribution is reliable for the
    forward only: the counter attributes backward ops to the modules still on its stack.
    """
    out = dict.fromkeys(["qkv_proj", "out_proj", "attention", "mlp", "experts", "router", "lm_head",
                         "cross_attention"], 0.0)
    for name, flops in per_module.items():
        parts = name.split(".")
        if "cross" in parts[:-1]:
            continue  # counted whole by the cross-attention module itself
        if parts[-1] == "cross":
            out["cross_attention"] += flops
        elif parts[-1] in ("wqkv", "wgate"):  # the input projections (wgate: mha's output gate)
            out["qkv_proj"] += flops
        elif parts[-1] == "wo":
            out["out_proj"] += flops
        elif parts[-1] == "attn":
            out["attention"] += flops - sum(per_module.get(f"{name}.{p}", 0.0) for p in ("wqkv", "wgate", "wo"))
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


@contextmanager
def _selective_caches() -> Iterator[list[dict]]:
    """While active, collects the cache of every selective checkpoint region opened
    (``archlab.model.checkpointing.selective_contexts``): the op outputs it keeps for backward."""
    caches: list[dict] = []
    original = checkpointing.selective_contexts

    def observed():
        forward_mode, recompute_mode = original()
        caches.append(forward_mode.storage)  # {op: {call index: kept outputs, or a recompute marker}}
        return forward_mode, recompute_mode

    checkpointing.selective_contexts = observed
    try:
        yield caches
    finally:
        checkpointing.selective_contexts = original


def _cached_tensors(cache: dict) -> Iterator[Tensor]:
    from torch.utils._pytree import tree_leaves

    for calls in cache.values():
        for entry in calls.values():
            for leaf in tree_leaves(entry):
                if isinstance(getattr(leaf, "val", None), Tensor):  # a _VersionWrapper around a kept output
                    yield leaf.val


class _Saved:
    """A tensor as a saved-tensors pack hook hands it to autograd: alive while its node is.
    Detached (same storage): an op's own output held with its grad_fn would make a reference
    cycle with that node, which would then outlive its branch of the graph."""

    __slots__ = ("t", "__weakref__")

    def __init__(self, t: Tensor):
        self.t = t.detach()

    def unpack(self) -> Tensor:
        return self.t


def saved_activation_bytes(
    model: nn.Module,
    x_BS1: Tensor,
    loss_fn: Optional[Callable[[nn.Module, Tensor], Tensor]] = None,
    loss: str = "fused",
) -> dict[str, int]:
    """Bytes saved for backward by one training forward (model + loss) on the window ``x_BS1``
    (B, S+1): :func:`training_loss` with ``loss``, or ``loss_fn(model, x_BS1)``.

    Returns ``{"total": ..., <module path>: ...}``: each distinct storage is counted once, under
    the module that saved it first ("" = outside any module, e.g. the loss or the checkpointed
    blocks' inputs; "<selective checkpoint>" = the op outputs selective checkpointing keeps).
    """
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    weights |= {b.untyped_storage().data_ptr() for b in model.buffers()}
    packed: list[tuple[weakref.ref, str]] = []  # every saved tensor, as the autograd node holds it
    with _attribute_to_modules(model) as current, real_routed_rows(model), _selective_caches() as caches:

        def pack(t: Tensor) -> _Saved:
            saved = _Saved(t)
            packed.append((weakref.ref(saved), current()))
            return saved

        with torch.autograd.graph.saved_tensors_hooks(pack, _Saved.unpack):
            out = loss_fn(model, x_BS1) if loss_fn is not None else training_loss(model, x_BS1, loss)
    # what backward will find: tensors of nodes still in the graph (a branch whose output died,
    # e.g. a top-k only its indices were taken from, freed its saved tensors already), then the
    # outputs selective checkpointing cached
    kept = [(ref().t, where) for ref, where in packed if ref() is not None]
    kept += [(t, "<selective checkpoint>") for cache in caches for t in _cached_tensors(cache)]
    seen: set[tuple[int, int]] = set()
    per_module: dict[str, int] = defaultdict(int)
    for t, where in kept:
        key = _storage_key(t)
        if key[0] not in weights and key not in seen:
            seen.add(key)
            per_module[where] += key[1]
    del out, kept
    return {"total": sum(per_module.values()), **dict(per_module)}
