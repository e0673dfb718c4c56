"""Routed mixture-of-experts feed-forward (Mixtral, DeepSeekMoE).

- ``router``: ROUTERS registry (softmax_topk, sigmoid_topk), group-limited routing, selection bias
- ``experts``: stacked expert weights and the sort-by-expert grouped-GEMM dispatch
- ``balance``: BALANCE_TERMS registry (micro-batch and global-batch Switch auxiliary losses,
  sequence-wise auxiliary loss, z-loss, aux-loss-free selection bias)
- ``stats``: per-layer routing statistics
- ``trace``: the router trace of sampled tokens (``start_trace`` / ``take_trace`` below)
- ``layer``: ``MoELayer``, what the decoder builds

Model-level helpers used by the trainer (they take an ``all_reduce_sum`` callable that sums a
tensor over data-parallel ranks, identity on one process, so this package needs no distributed
library):

- ``moe_layers(model)``, ``start_step(model)`` (before the first micro-batch of every optimizer
  step), ``balance_step(model, all_reduce_sum)`` (after it), ``routing_stats(model, all_reduce_sum)``,
  ``start_trace(model, index_T)`` / ``stop_trace(model)`` / ``take_trace(model)`` (router trace)
"""

from __future__ import annotations

import re
from typing import Callable, Optional

import torch
from torch import Tensor, nn

from archlab.nn.moe import expert_choice  # noqa: F401  (registers moe.router.type expert_choice)
from archlab.nn.moe.layer import MoELayer
from archlab.nn.moe.stats import layer_percentiles
from archlab.nn.moe.trace import TraceBuffer

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
    ranks, as flat keys "moe/layer<i>/<stat>" (i = decoder block index), plus across layers:
    the means "moe/maxvio" and "moe/cv", the percentiles of the per-layer MaxVio
    "moe/maxvio_p50", "_p90", "_p95", "_max" (:func:`archlab.nn.moe.stats.layer_percentiles`)
    and the sums "moe/dead_experts", "moe/starved_experts" and "moe/dropped_tokens". Resets the accumulators.

    Per layer: tokens, dropped_slots, top_k, tokens_per_expert (kept slots, list) and its min,
    max and std (``tokens_per_expert_min`` ...), dead_experts (zero tokens in the window) and
    dead_expert_ids, starved_experts and starved_expert_ids (under ``STARVED_FRACTION`` of the mean),
    load_fraction (list), maxvio, cv (std/mean of the counts), router_entropy (mean over tokens,
    nats), dropped_fraction (of the tokens*K slots), dropped_tokens (tokens that lost all K
    slots), each enabled balancing term (coefficient-weighted, mean over the window's forwards)
    and, with aux-loss-free balancing, bias (list). Counts are over the window since the last
    call (``RoutingStats.read``). Raises RuntimeError when the counts do not sum to tokens *
    top_k - dropped_slots."""
    out: dict[str, float | list] = {}
    maxvio, cv, dead, starved, lost = [], [], 0, 0, 0
    for name, layer in _named_moe_layers(model):
        s = layer.stats.read(all_reduce_sum, layer.enabled_terms())
        if not s:
            continue
        s["top_k"] = layer.slots
        if layer.router.expert_bias is not None:
            s["bias"] = layer.router.expert_bias.float().tolist()
        maxvio.append(s["maxvio"])
        cv.append(s["cv"])
        dead += s["dead_experts"]
        starved += s["starved_experts"]
        lost += s["dropped_tokens"]
        out.update({f"moe/{name}/{k}": v for k, v in s.items()})
    if maxvio:
        out["moe/maxvio"] = sum(maxvio) / len(maxvio)
        out["moe/cv"] = sum(cv) / len(cv)
        out.update({f"moe/{k}": v for k, v in layer_percentiles(maxvio).items()})
        out["moe/dead_experts"] = dead
        out["moe/starved_experts"] = starved
        out["moe/dropped_tokens"] = lost
    return out


def start_trace(model: nn.Module, index_T: Tensor) -> None:
    """Trace the routing of tokens ``index_T`` (rows of the flattened (B*S) micro-batch) in the
    next training forward of every MoE layer; :func:`stop_trace` after that forward. Each layer
    keeps its :class:`TraceBuffer` between calls (reallocated only when T or the device change)."""
    for layer in moe_layers(model):
        m = layer.moe
        if layer.trace is None or not layer.trace.fits(index_T, m.num_experts, layer.slots):
            layer.trace = TraceBuffer(index_T, m.num_experts, layer.slots)
        layer.trace.reset(index_T)
        layer.tracing = True


def stop_trace(model: nn.Module) -> None:
    """No layer traces the forwards that follow (the buffers keep what the traced forward left)."""
    for layer in moe_layers(model):
        layer.tracing = False


def take_trace(model: nn.Module) -> Optional[dict]:
    """The trace of the last traced forward, on the CPU, stacked over the L MoE layers: ``layers``
    (names "layer<i>"), ``experts`` int64 (T, L, K), ``weights`` fp32 (T, L, K), ``dropped`` bool
    (T, L, K), ``logits`` fp32 (T, L, E), ``token_index`` int64 (T,) and, with aux-loss-free
    balancing, ``expert_bias`` fp32 (L, E). None when some layer captured nothing (no training
    forward ran while tracing). Stops tracing."""
    named = []
    for n, layer in _named_moe_layers(model):
        layer.tracing = False
        if layer.trace is not None:
            named.append((n, layer))
    if not named or not all(bool(layer.trace.captured) for _, layer in named):
        return None

    def stack(attr: str) -> Tensor:
        return torch.stack([getattr(layer.trace, attr) for _, layer in named], dim=1).cpu()

    out = {"layers": [n for n, _ in named], "experts": stack("experts_TK"), "weights": stack("weights_TK"),
           "dropped": stack("dropped_TK"), "logits": stack("logits_TE"),
           "token_index": named[0][1].trace.index_T.cpu()}
    if named[0][1].router.expert_bias is not None:  # one recipe: every MoE layer has it or none
        out["expert_bias"] = torch.stack([layer.router.expert_bias.float() for _, layer in named]).cpu()
    return out


__all__ = ["MoELayer", "TraceBuffer", "balance_step", "moe_layers", "routing_stats", "start_step", "start_trace",
           "stop_trace", "take_trace"]
