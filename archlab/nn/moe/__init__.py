"""Routed mixture-of-experts feed-forward (Mixtral, DeepSeekMoE).

- ``router``: ROUTERS registry (softmax_topk, sigmoid_topk), group-limited routing, selection bias
- ``experts``: stacked expert weights and the sort-by-expert grouped-GEMM dispatch
- ``balance``: BALANCE_TERMS registry (micro-batch and global-batch Switch auxiliary losses,
  sequence-wise auxiliary loss, z-loss, aux-loss-free selection bias)
- ``stats``: per-layer routing statistics
- ``layer``: ``MoELayer``, what the decoder builds

Model-level helpers used by the trainer (they take an ``all_reduce_sum`` callable that sums a
tensor over data-parallel ranks, identity on one process, so this package needs no distributed
library):

- ``moe_layers(model)``, ``start_step(model)`` (before the first micro-batch of every optimizer
  step), ``balance_step(model, all_reduce_sum)`` (after it), ``routing_stats(model, all_reduce_sum)``
"""

from __future__ import annotations

import re
from typing import Callable

from torch import Tensor, nn

from archlab.nn.moe.layer import MoELayer

AllReduce = Callable[[Tensor], Tensor]


def _named_moe_layers(model: nn.Module) -> list[tuple[str, MoELayer]]:
    """("layer<i>", layer) with i the decoder block index (or the position among MoE layers)."""
    out = []
    for j, (path, mod) in enumerate((p, m) for p, m in model.named_modules() if isinstance(m, MoELayer)):
        found = re.search(r"(?:^|\.)(\d+)(?:\.|$)", path)
        out.append((f"layer{found.group(1) if found else j}", mod))
    return out


def moe_layers(model: nn.Module) -> list[MoELayer]:
    """The MoE layers of a model, in module order."""
    return [m for _, m in _named_moe_layers(model)]


def start_step(model: nn.Module) -> None:
    """Before the first micro-batch of an optimizer step: every balancing term starts the step
    (the global-batch auxiliary loss sets its running expert counts to zero). A no-op for a
    model without MoE layers or without such a term."""
    for layer in moe_layers(model):
        for term in layer.balance_terms:
            term.start_step()


def balance_step(model: nn.Module, all_reduce_sum: AllReduce) -> None:
    """After an optimizer step: each enabled term's step update from the step's router choices
    (the aux-loss-free bias, from the counts summed over ranks), then reset the per-step
    counters. Without such a term only resets."""
    for layer in moe_layers(model):
        counts_E = layer.stats.take_step_counts()
        for term in layer.balance_terms:
            term.after_step(layer.router, counts_E, all_reduce_sum)


def routing_stats(model: nn.Module, all_reduce_sum: AllReduce) -> dict[str, float | list]:
    """Per-layer routing statistics of the training forwards since the last call, summed over
    ranks, as flat keys "moe/layer<i>/<stat>" (i = decoder block index), plus the means over
    layers "moe/maxvio" and "moe/cv". Resets the accumulators.

    Per layer: tokens, dropped_slots, top_k, tokens_per_expert (kept slots, list), load_fraction
    (list), maxvio, cv (std/mean of the counts), router_entropy (mean over tokens, nats),
    dropped_fraction (of the tokens*K slots), each enabled balancing term (coefficient-weighted,
    mean over the window's forwards) and, with aux-loss-free balancing, bias (list). Raises
    RuntimeError when the counts do not sum to tokens * top_k - dropped_slots."""
    out: dict[str, float | list] = {}
    maxvio, cv = [], []
    for name, layer in _named_moe_layers(model):
        s = layer.stats.read(all_reduce_sum, layer.enabled_terms())
        if not s:
            continue
        s["top_k"] = layer.moe.top_k
        if layer.router.expert_bias is not None:
            s["bias"] = layer.router.expert_bias.float().tolist()
        maxvio.append(s["maxvio"])
        cv.append(s["cv"])
        out.update({f"moe/{name}/{k}": v for k, v in s.items()})
    if maxvio:
        out["moe/maxvio"] = sum(maxvio) / len(maxvio)
        out["moe/cv"] = sum(cv) / len(cv)
    return out


__all__ = ["MoELayer", "balance_step", "moe_layers", "routing_stats", "start_step"]
