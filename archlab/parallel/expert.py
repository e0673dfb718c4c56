"""Expert parallelism with DeepSpeed's machinery: experts sharded over ``ep_size`` ranks.

Shape legend: N tokens (this rank), D model dim, E experts, El = E / ep local experts,
P = ep_size ranks of an expert-parallel group, C rows per (rank, expert) in the exchange.

    enable_expert_parallel(model, ep_size)   # after torch.distributed is initialised

- groups: ``deepspeed.utils.groups._create_expert_and_data_parallel(ep_size)`` builds the
  expert-parallel groups (ranks that exchange tokens: [0..P-1], [P..2P-1], ...) and the
  expert-data-parallel groups (ranks holding the same experts, whose expert gradients are
  averaged), both named ``ep_size_<P>`` as DeepSpeed's own MoE layer names them;
- weights: rank r of its group keeps experts r*El ... (r+1)*El - 1 of every MoE layer; those
  parameters are tagged ``allreduce = False`` and ``group_name = "ep_size_<P>"``, so that
  ``deepspeed.moe.utils.split_params_into_different_moe_groups_for_optimizer`` puts them in
  their own optimizer groups and the DeepSpeed engine reduces their gradients over the
  expert-data-parallel group only;
- tokens: each MoE layer gets a ``dispatcher`` that lays this rank's slots out as a
  (P, El, C, D) grid, C = the largest (rank, expert) load in the group (dropless, like DeepSpeed's
  ``drop_tokens=False``), exchanges it with DeepSpeed's ``_AllToAll`` (an autograd function: the
  backward is the reverse exchange), runs the local experts as one bmm over all source ranks'
  rows, and sends the results back.

Routing, balancing losses and routing statistics stay per rank (each rank routes its own
tokens); ``balance_step`` and ``routing_stats`` reduce them over data-parallel ranks as before.
The model code never imports DeepSpeed: this module is the only place that does.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from torch import Tensor, nn

from archlab.nn.moe import MoELayer, moe_layers
from archlab.nn.moe.experts import Dispatch, from_rows, row_layout, to_rows


def expert_group_name(ep_size: int) -> str:
    return f"ep_size_{ep_size}"


def create_groups(ep_size: int):
    """The (expert-parallel, expert-data-parallel) groups of this rank, created once."""
    import deepspeed
    from deepspeed.utils import groups

    if not dist.is_initialized():
        raise RuntimeError("expert parallelism needs torch.distributed initialised first "
                           "(launch with accelerate, deepspeed or torchrun)")
    world = dist.get_world_size()
    if ep_size < 1 or world % ep_size:
        raise ValueError(f"moe.ep_size={ep_size} must divide the number of processes ({world})")
    deepspeed.init_distributed(dist_backend=dist.get_backend())  # wraps the existing process group
    name = expert_group_name(ep_size)
    if name not in groups._get_expert_parallel_group_dict():
        groups._create_expert_and_data_parallel(ep_size)
    return groups._get_expert_parallel_group(name), groups._get_expert_data_parallel_group(name)


class ExpertParallelDispatcher:
    """``MoELayer.dispatcher``: exchange slots with the other ranks of the expert-parallel group,
    run this rank's experts on all of them, return the outputs to their ranks."""

    def __init__(self, group, ep_size: int, local_experts: int):
        self.group, self.ep_size, self.local_experts = group, ep_size, local_experts

    def __call__(self, layer: MoELayer, x_ND: Tensor, d: Dispatch) -> Tensor:
        from deepspeed.moe.sharded_moe import _AllToAll

        P, El = self.ep_size, self.local_experts
        C = self._group_capacity(d.counts_E)
        layout = row_layout(d, padded=True, capacity=C)
        x_PECD = to_rows(x_ND, layout, d.top_k).view(P, El, C, -1)  # experts are rank-major
        recv_PECD = _AllToAll.apply(self.group, x_PECD)  # [p] = rank p's rows for my experts
        x_rows = recv_PECD.transpose(0, 1).reshape(El * P * C, -1)  # (El, P*C) grid per local expert
        y_rows = layer.experts.rows_forward(x_rows, None, P * C)  # one bmm per projection
        y_PECD = y_rows.view(El, P, C, -1).transpose(0, 1).contiguous()
        back_PECD = _AllToAll.apply(self.group, y_PECD)  # my slots' outputs, global expert order
        return from_rows(back_PECD.view(-1, x_ND.shape[-1]), layout, d.weights_NK)

    def _group_capacity(self, counts_E: Tensor) -> int:
        """The largest expert load of any rank in the group: every rank pads to the same C."""
        c = counts_E.max().reshape(1).clone()
        dist.all_reduce(c, op=dist.ReduceOp.MAX, group=self.group)
        return max(int(c.item()), 1)


def shard_experts(layer: MoELayer, ep_rank: int, ep_size: int) -> int:
    """Keep experts ep_rank*El ... (ep_rank+1)*El - 1 of ``layer`` and tag them; returns El."""
    E = layer.moe.num_experts
    if E % ep_size:
        raise ValueError(f"moe.num_experts={E} must be divisible by moe.ep_size={ep_size}")
    El = E // ep_size
    ex = layer.experts
    for name in ("w_up", "w_down"):
        full = getattr(ex, name)
        local = nn.Parameter(full.detach()[ep_rank * El:(ep_rank + 1) * El].clone())
        local.allreduce = False  # DeepSpeed: not reduced over the whole data-parallel group...
        local.group_name = expert_group_name(ep_size)  # ...but over this expert-data-parallel group
        setattr(ex, name, local)
    ex.num_experts = El
    return El


def attach_to_deepspeed_engine(engine, model: nn.Module) -> None:
    """Tell a DeepSpeed engine (ZeRO stage 0) that ``model`` has expert-parallel layers.

    DeepSpeed recognises MoE only by its own ``deepspeed.moe.layer.MoE`` class; without this the
    engine's gradient reduction finds parameters tagged ``allreduce=False`` and no expert groups.
    Afterwards it all-reduces expert gradients over the expert-data-parallel group and divides
    them by the data-parallel world size, as for its own MoE layers. ZeRO stages 1-2 build their
    optimizer partitions inside ``deepspeed.initialize``, before this call, and are not covered.
    """
    layers = moe_layers(model)
    if not layers or layers[0].dispatcher is None:
        raise ValueError("call enable_expert_parallel(model) before attach_to_deepspeed_engine")
    if engine.zero_optimization_stage() > 0:
        raise ValueError(f"ZeRO stage {engine.zero_optimization_stage()}: archlab's expert parallelism is "
                         "wired for ZeRO stage 0 only (set zero_optimization.stage=0)")
    engine.has_moe_layers = True
    engine.num_experts = [layer.moe.num_experts for layer in layers]


def enable_expert_parallel(model: nn.Module, ep_size: Optional[int] = None) -> int:
    """Shard every MoE layer's experts over ``ep_size`` ranks (default: the recipe's
    ``moe.ep_size``) and route tokens between them. Call before building the optimizer.
    Returns the number of MoE layers wired."""
    layers = moe_layers(model)
    if not layers:
        return 0
    ep_size = ep_size if ep_size is not None else layers[0].moe.ep_size
    ep_group, _ = create_groups(ep_size)
    ep_rank = dist.get_rank(group=ep_group)
    for layer in layers:
        El = shard_experts(layer, ep_rank, ep_size)
        layer.dispatcher = ExpertParallelDispatcher(ep_group, ep_size, El)
    return len(layers)
