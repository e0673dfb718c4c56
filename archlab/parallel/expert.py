"""Expert parallelism with DeepSpeed's machinery: experts sharded over ``ep_size`` ranks.

Shape legend: N tokens (this rank), D model dim, E experts, El = E / ep local experts,
P = ep_size ranks of an expert-parallel group, R rows this rank sends, Ri rows it receives.

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
- tokens: each MoE layer gets a ``dispatcher`` that exchanges exactly the rows routed to each
  rank, as torchtitan and Megatron-Core's ``MoEAlltoAllTokenDispatcher`` do: an ``all_to_all_single``
  of the per-(rank, local expert) counts, one host copy of them (the split sizes), then the rows,
  packed in expert order, with ``all_to_all_single`` and those split sizes (the autograd-aware one
  of ``torch.distributed._functional_collectives``: its backward is the reverse exchange); the
  local experts run on the rows of all source ranks (``GroupedExperts`` regroups them by expert)
  and the outputs go back the same way. No padding crosses the network (dropless, like
  DeepSpeed's ``drop_tokens=False``; capacity routing sends only the kept slots).

- DeepSpeed: a parameter-free ``deepspeed.moe.layer.MoE`` marker inside each sharded layer lets
  ``deepspeed.initialize`` see MoE layers (``has_moe_layers``), which the ZeRO-1/2 optimizer needs
  in its constructor to partition the expert groups over the expert-data-parallel group;
- checkpoints: ``consolidated_state_dict`` gathers the expert shards over the expert-parallel
  group into the state dict of the unsharded model (loadable at any ep_size);
- clipping: ``ExpertParallelClipping`` clips by the norm of the whole model (expert squared
  norms summed over the expert-parallel group) in the optimizer's pre-step hook.

Routing, balancing losses and routing statistics stay per rank (each rank routes its own
tokens); ``balance_step`` and ``routing_stats`` reduce them over data-parallel ranks as before.
The model code never imports DeepSpeed: this module is the only place that does.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed._functional_collectives import all_to_all_single_autograd

from archlab.nn.moe import MoELayer, moe_layers
from archlab.nn.moe.experts import Dispatch, RowLayout, dispatch, expert_dtype, from_rows, to_rows


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
    """``MoELayer.dispatcher``: send each slot's row to the rank holding its expert, run this rank's
    experts on the rows of every rank, return the outputs to their ranks. Per layer and forward:
    three ``all_to_all_single`` (counts, rows, outputs) and one device-to-host copy (2E counts)."""

    def __init__(self, group, ep_size: int, local_experts: int):
        self.group, self.ep_size, self.local_experts = group, ep_size, local_experts

    def __call__(self, layer: MoELayer, x_ND: Tensor, d: Dispatch) -> Tensor:
        x_ND = x_ND.to(expert_dtype(x_ND))  # as GroupedExperts.forward: under bf16 autocast, bf16 rows cross
        send_PE, recv_PE, recv_counts_PE = self.exchange_counts(d.counts_E)
        sent = [sum(c) for c in send_PE]  # rows to each rank: input split sizes
        received = [sum(c) for c in recv_PE]  # rows from each rank: output split sizes
        layout = _sent_layout(d, sum(sent))  # rows in global expert order: rank-major
        x_RD = to_rows(x_ND, layout, d.top_k)
        x_in = all_to_all_single_autograd(x_RD, received, sent, self.group)  # (Ri, D), (rank, expert) order
        y_in = _run_local_experts(layer, x_in, recv_counts_PE, sum(received))
        y_RD = all_to_all_single_autograd(y_in, sent, received, self.group)  # my rows' outputs, in order
        return from_rows(y_RD, layout, d.weights_NK)

    def exchange_counts(self, counts_E: Tensor) -> tuple[list[list[int]], list[list[int]], Tensor]:
        """send[p][e] (my slots for rank p's local expert e) and recv[p][e] (rank p's slots for my
        local expert e) on the host, and recv as a (P, El) tensor: one ``all_to_all_single`` of E
        counts, one host copy of 2E."""
        send_PE = counts_E.view(self.ep_size, self.local_experts)
        recv_PE = torch.empty_like(send_PE)
        dist.all_to_all_single(recv_PE, send_PE, group=self.group)
        send, recv = torch.stack([send_PE, recv_PE]).tolist()  # the split sizes: the one host sync
        return send, recv, recv_PE


def _sent_layout(d: Dispatch, rows: int) -> RowLayout:
    """The kept slots as packed rows in expert order (``row_layout``'s eager packed layout), with
    their number ``rows`` known on the host already (``row_layout`` would read ``d.dropped``)."""
    n_slots = d.slot_S.numel()
    pos_P = torch.arange(n_slots, device=d.slot_S.device)
    row_S = torch.empty_like(d.slot_S)
    row_S[d.slot_S] = torch.where(pos_P < rows, pos_P, rows)  # a dropped slot: row R (none)
    may_drop = d.capacity is not None
    return RowLayout(d.slot_S[:rows], row_S, None, None, may_drop=may_drop, has_padding=may_drop)


def _run_local_experts(layer: MoELayer, x_in: Tensor, recv_PE: Tensor, rows: int) -> Tensor:
    """The local experts on the received rows (grouped by source rank, then local expert), as
    ``rows`` tokens with one slot each (gate weight 1): ``GroupedExperts`` regroups them by expert
    and back. With no row received, one zero row runs (its output cut off), so that this rank's
    backward still reaches the exchanges (every rank must take part) and its expert gradients
    are zeros, as at ep_size=1."""
    P, El = recv_PE.shape
    empty = rows == 0
    if empty:
        x_in = torch.cat([x_in, x_in.new_zeros(1, x_in.shape[-1])])
        recv_PE = torch.zeros_like(recv_PE)
        recv_PE[0, 0] = 1
    expert_R = torch.arange(El, device=x_in.device).repeat(P)  # rows arrive by source rank, then expert
    expert_R = expert_R.repeat_interleave(recv_PE.flatten(), output_size=x_in.shape[0])  # no host read
    ones = torch.ones(x_in.shape[0], 1, dtype=torch.float32, device=x_in.device)
    y_in = layer.experts(x_in, dispatch(expert_R.view(-1, 1), ones, El, None))
    return y_in[:0] if empty else y_in


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


def _marker_class():
    """``DeepSpeedMoEMarker``: a ``deepspeed.moe.layer.MoE`` without experts (built on first use:
    importing DeepSpeed is slow)."""
    global _MARKER
    if _MARKER is None:
        from deepspeed.moe.layer import MoE

        class DeepSpeedMoEMarker(MoE):
            """Tells ``deepspeed.initialize`` that the model has expert-parallel layers.

            DeepSpeed recognises MoE only by ``isinstance(module, deepspeed.moe.layer.MoE)``, in the
            engine's constructor: that sets ``has_moe_layers``, which the ZeRO-1/2 optimizer reads in
            its own constructor to partition the ``moe=True`` param groups over the expert-data-parallel
            group. This module carries only the attributes those read; it holds no parameters, is never
            called, and its process groups already exist (:func:`create_groups`)."""

            def __init__(self, num_experts: int, ep_size: int):
                nn.Module.__init__(self)  # not MoE.__init__: no experts, no gate
                self.num_experts, self.ep_size = num_experts, ep_size
                self.num_local_experts = num_experts // ep_size
                self.expert_group_name = expert_group_name(ep_size)
                self.enable_expert_tensor_parallelism = False

            def set_deepspeed_parallelism(self, use_data_before_expert_parallel_: bool = False) -> None:
                pass  # the groups were created by create_groups; there is no DeepSpeed layer to wire

            def forward(self, *args, **kwargs):
                raise RuntimeError("DeepSpeedMoEMarker is a marker for deepspeed.initialize, not a layer")

        _MARKER = DeepSpeedMoEMarker
    return _MARKER


_MARKER = None


def attach_to_deepspeed_engine(engine, model: nn.Module) -> None:
    """Check (and, for ZeRO stage 0, complete) a DeepSpeed engine's view of ``model``'s
    expert-parallel layers, after ``deepspeed.initialize`` / ``accelerate.prepare``.

    The engine found the ``DeepSpeedMoEMarker`` submodules that :func:`enable_expert_parallel`
    attached, so it reduces expert gradients over the expert-data-parallel group (stage 0:
    all-reduce divided by the data-parallel world size; stages 1-2: the ZeRO optimizer partitions
    the ``moe=True`` groups over that group), as for its own MoE layers.
    """
    layers = moe_layers(model)
    if not layers or layers[0].dispatcher is None:
        raise ValueError("call enable_expert_parallel(model) before attach_to_deepspeed_engine")
    if engine.zero_optimization_stage() > 2:
        raise ValueError(f"ZeRO stage {engine.zero_optimization_stage()}: archlab's expert parallelism runs "
                         "with ZeRO stages 0-2 (DeepSpeed's MoE support ends there)")
    if engine.zero_optimization_stage() > 0 and not engine.has_moe_layers:
        raise ValueError("the DeepSpeed engine found no MoE layer: shard the experts with "
                         "enable_expert_parallel(model) before accelerate.prepare / deepspeed.initialize")
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
        # a submodule without parameters or buffers: the state dict is unchanged
        layer.deepspeed_moe_marker = _marker_class()(layer.moe.num_experts, ep_size)
    return len(layers)


def expert_parallel_active(model: nn.Module) -> bool:
    """True when ``enable_expert_parallel`` sharded this model's experts."""
    layers = moe_layers(model)
    return bool(layers) and isinstance(layers[0].dispatcher, ExpertParallelDispatcher)


@torch.no_grad()
def consolidated_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """The model's state dict with every expert tensor gathered over its expert-parallel group:
    the weights an unsharded model (ep_size=1) loads. Collective: every rank must call it."""
    state = dict(model.state_dict())
    for path, mod in model.named_modules():
        if not isinstance(mod, MoELayer) or not isinstance(mod.dispatcher, ExpertParallelDispatcher):
            continue
        group, P = mod.dispatcher.group, mod.dispatcher.ep_size
        for name in ("w_up", "w_down"):
            local = getattr(mod.experts, name).detach().contiguous()  # (El, ...)
            parts = [torch.empty_like(local) for _ in range(P)]
            dist.all_gather(parts, local, group=group)
            state[f"{path}.experts.{name}" if path else f"experts.{name}"] = torch.cat(parts)  # (E, ...)
    return state


@torch.no_grad()
def global_grad_norm(optimizer: torch.optim.Optimizer) -> Tensor:
    """2-norm of the gradient of the whole (unsharded) model, on every rank, after the engine's
    gradient reduction: the dense groups' gradients are identical on all ranks; the expert groups
    (``moe=True``, named after their group) hold disjoint experts on the ranks of an
    expert-parallel group, so their squared norms are summed over that group."""
    from deepspeed.utils import groups

    dense = torch.zeros((), dtype=torch.float64)
    experts: dict[str, Tensor] = {}
    for g in optimizer.param_groups:
        sq = sum((p.grad.double().square().sum().cpu() for p in g["params"] if p.grad is not None),
                 torch.zeros((), dtype=torch.float64))
        if g.get("moe"):
            experts[g["name"]] = experts.get(g["name"], torch.zeros((), dtype=torch.float64)) + sq
        else:
            dense += sq
    total = dense
    for name, sq in sorted(experts.items()):
        group = groups._get_expert_parallel_group(name)
        buf = sq.float().to(_comm_device(group))
        dist.all_reduce(buf, group=group)
        total = total + buf.double().cpu()
    return total.sqrt()


def _comm_device(group) -> torch.device:
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class ExpertParallelClipping:
    """Gradient clipping by the true global norm under expert parallelism, as a pre-step hook of
    the optimizer (the DeepSpeed engine reduces gradients, then calls ``optimizer.step()``).

    Used at ZeRO stage 0 only (stages 1-2 sum the squared norms of every rank's partitions, the
    global norm already, and step each param group separately, which a pre-step hook cannot see).
    DeepSpeed's ZeRO-0 clipping averages each rank's local norm over ranks, which is not the norm
    of the unsharded model when ranks hold different experts; this hook computes that norm
    (:func:`global_grad_norm`), records it in ``last_norm`` and scales the gradients by
    ``min(1, max_norm / (norm + 1e-6))`` (as ``torch.nn.utils.clip_grad_norm_``). The engine's own
    clipping must be off (``gradient_clipping: 0``). ``max_norm <= 0``: measure only."""

    def __init__(self, optimizer: torch.optim.Optimizer, max_norm: float):
        self.max_norm, self.last_norm = float(max_norm), None
        self.handle = optimizer.register_step_pre_hook(self)

    @torch.no_grad()
    def __call__(self, optimizer, args, kwargs) -> None:
        norm = global_grad_norm(optimizer)
        self.last_norm = float(norm)
        if self.max_norm <= 0 or not torch.isfinite(norm):
            return
        coef = min(1.0, self.max_norm / (self.last_norm + 1e-6))
        if coef < 1.0:
            for g in optimizer.param_groups:
                for p in g["params"]:
                    if p.grad is not None:
                        p.grad.mul_(coef)
