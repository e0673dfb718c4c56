"""Activation checkpointing of the decoder's blocks, by ``train.activation_checkpointing``.

Shape legend: B batch, S sequence, D model dim.

- ``none``: every block keeps what its ops save for backward.
- ``full``: a block keeps only its input (B, S, D); backward runs its forward again, then
  differentiates it (``torch.utils.checkpoint``, non-reentrant, RNG state restored so dropout
  and router jitter repeat). One more forward of the blocks, about +1/3 of the step's FLOPs
  (torch stops it after the last op whose saved tensors backward needs: a dense block's FFN
  down projection is not run again).
- ``selective``: the same second forward, but the outputs of the expensive ops are kept from
  the first: matmuls (projections, the router's gate, the experts' grouped GEMMs) and attention
  (SDPA's output and log-sum-exp), chosen by :func:`save_matmuls` through
  ``create_selective_checkpoint_contexts``. Backward then recomputes only the cheap ops between
  them (norms, activations, RoPE, residual adds, dropout, the router's softmax, top-k and
  gathers) and no matmul runs twice; a layer keeps its input and those outputs, 50-60% of what
  it keeps without checkpointing (LLaMA-125M, Mixtral-s at 1024 tokens; ``archlab.costs.memory``
  models each mode).

A second forward must not repeat side effects: an MoE layer records routing statistics once per
training forward, so while a block recomputes, the ``record_stats`` flag of its MoE layers is
off. (The ops skipped that way include no saved op, so the selective cache stays aligned.)
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from archlab.nn.flags import flag_set

MODES = ("none", "full", "selective")

_aten = torch.ops.aten
# ops whose outputs selective checkpointing keeps: every GEMM and the fused attention kernels
# (the math attention of CPU with a mask decomposes into bmm, which is kept too)
SAVED_OPS = {
    _aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten.baddbmm.default,
    _aten._grouped_mm.default,
    _aten._scaled_dot_product_flash_attention_for_cpu.default,
    _aten._scaled_dot_product_flash_attention.default,
    _aten._scaled_dot_product_efficient_attention.default,
    _aten._scaled_dot_product_cudnn_attention.default,
}
# by name: archlab::grouped_mm (the compiled MoE experts' GEMM) is registered when the MoE code is
# first imported, which dense models never do
SAVED_CUSTOM_OPS = {"archlab::grouped_mm"}


def allow_compiled_recomputation() -> None:
    """Before ``torch.compile`` of a checkpointed decoder: let the blocks' forward mutate state
    outside the region (MoE routing statistics) once, not replayed in backward, which is what eager
    does (``record_stats``); dynamo otherwise refuses a checkpointed region with side effects."""
    torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint = True


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"activation checkpointing {mode!r}: must be one of {', '.join(MODES)}")
    return mode


def save_matmuls(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    """Selective checkpointing's policy: keep matmul and attention outputs, recompute the rest."""
    saved = op in SAVED_OPS or (getattr(op, "namespace", None) == "archlab" and op.name() in SAVED_CUSTOM_OPS)
    return CheckpointPolicy.MUST_SAVE if saved else CheckpointPolicy.PREFER_RECOMPUTE


def selective_contexts():
    """The (forward, recompute) dispatch modes of one selective checkpoint region."""
    return create_selective_checkpoint_contexts(save_matmuls)


def _recomputing(block: nn.Module):
    """While a block is recomputed, its MoE layers do not record routing statistics again."""
    return flag_set((m for m in block.modules() if hasattr(m, "record_stats")), "record_stats", False)


def checkpointed_block(block: nn.Module, mode: str, x_BSD: Tensor, ctx,
                       memory: Optional[Tensor] = None) -> tuple[Tensor, Optional[Tensor]]:
    """``block(x_BSD, ctx)`` under ``mode`` (``full`` or ``selective``): the same outputs, what is
    kept for backward as the module docstring says. ``memory``: an encoder-decoder's encoder output, which
    its decoder blocks' cross-attention reads (``block(x, ctx, None, memory)``)."""
    kwargs = {"context_fn": selective_contexts} if check_mode(mode) == "selective" else {}
    inputs = (x_BSD,) if memory is None else (x_BSD, memory)

    def call(x: Tensor, *mem: Tensor):
        return block(x, ctx) if not mem else block(x, ctx, None, *mem)

    if torch.compiler.is_compiling():  # the compiled backward recomputes graph ops, never Python code
        return checkpoint(call, *inputs, use_reentrant=False, **kwargs)
    calls = 0

    def run(x: Tensor, *mem: Tensor):
        nonlocal calls
        calls += 1
        if calls == 1:
            return call(x, *mem)
        with _recomputing(block):  # backward's second forward
            return call(x, *mem)

    return checkpoint(run, *inputs, use_reentrant=False, **kwargs)
