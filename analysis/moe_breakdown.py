"""Where an MoE layer's time goes, against the dense FFN it replaces: every feed-forward layer of a
trained run timed phase by phase, forward + backward, on the inputs it sees on validation windows.

The phases of ``archlab.nn.moe.MoELayer.forward`` (the default single-process path; an expert-parallel
dispatcher is not timed):

- ``router``: the gate projection, the scores, the top-k choice and the gate weights
  (``layer.router``), and the enabled balancing losses;
- ``dispatch``: the slots sorted by expert (``dispatch``), the row layout and the gather of the
  tokens into expert-major rows (``GroupedExperts.layout``, ``to_rows``): the permutation;
- ``experts``: the experts' products on those rows (``GroupedExperts.rows_forward``: grouped GEMMs
  or the padded batched GEMM, whichever the layer chooses on this machine);
- ``combine``: the rows gathered back to slot order and each token's K outputs summed with its gate
  weights (``from_rows``);
- ``shared``: the shared experts (DeepSeek), a dense FFN on every token.

A dense model's ``ffn`` is timed whole. Each phase runs on detached copies of its real inputs (the
previous phase's outputs on the same tokens), forward then backward with a fixed output gradient,
so the phases' times add up to about the whole layer's (also timed, as the check). Every callable is
timed in ``rounds`` interleaved rounds of ``repeats`` calls (all phases of all layers of all runs in
turn, so machine load hits them alike); the result per phase is the median over rounds, in
milliseconds per call, summed over the model's layers: the time one training micro-step spends there.

    from analysis.moe_breakdown import breakdown
    breakdown({"dense": "runs/.../dense-seed0", "mixtral": "runs/.../mixtral-seed0"}, rounds=5)

Shape legend: B windows, S positions, N = B*S tokens, D model width, K experts per token,
R expert-major rows.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Optional

import torch
from torch import Tensor, nn

PHASES = ("router", "dispatch", "experts", "combine", "shared")
WHOLE = "whole layer"
DENSE = "dense FFN"


def ffn_inputs(model: nn.Module, x_BS: Tensor) -> list[tuple[nn.Module, Tensor]]:
    """(the block's ffn, the normalised input it received (B, S, D)) for every block, in order, on
    one forward of the model over ``x_BS``."""
    blocks = [m for m in model.modules() if hasattr(m, "ffn") and hasattr(m, "ffn_norm")]
    seen: list[tuple[nn.Module, Tensor]] = []
    hooks = [b.ffn.register_forward_pre_hook(lambda mod, args: seen.append((mod, args[0].detach().clone())))
             for b in blocks]
    try:
        with torch.no_grad():
            model(x_BS)
    finally:
        for h in hooks:
            h.remove()
    return seen


def _leaf(t: Tensor) -> Tensor:
    return t.detach().clone().requires_grad_(t.is_floating_point())


def _timed_call(fn: Callable[..., tuple], inputs: tuple) -> Callable[[], None]:
    """A closure running ``fn`` forward on fresh leaf copies of ``inputs`` and backward from a fixed
    gradient of its floating outputs (the gradient drawn once)."""
    leaves = tuple(_leaf(t) if isinstance(t, Tensor) else t for t in inputs)
    outs = [o for o in fn(*leaves) if isinstance(o, Tensor) and o.requires_grad]
    grads = [torch.randn_like(o) for o in outs]

    def call() -> None:
        xs = tuple(_leaf(t) if isinstance(t, Tensor) else t for t in inputs)
        ys = [o for o in fn(*xs) if isinstance(o, Tensor) and o.requires_grad]
        torch.autograd.backward(ys, grads)

    return call


def chain(layer: nn.Module, x_BSD: Tensor):
    """The layer's forward as its phases, in order: (routing, row layout, expert-major input rows
    (R, D), expert output rows (R, D), the layer's output (N, D)), the output equal to the layer's."""
    from archlab.nn.moe.experts import from_rows, to_rows

    B, S, D = x_BSD.shape
    experts = layer.experts
    x_ND = x_BSD.reshape(B * S, D)
    r = layer.router(x_ND)
    d = layer.router.dispatch(r, B * S)  # the router's own (expert choice fills its slots itself)
    layout = experts.layout(x_ND, d)
    x_RD = to_rows(x_ND, layout, d.top_k)
    y_RD = experts.rows_forward(x_RD, layout.rows_E, layout.capacity)
    y_ND = from_rows(y_RD, layout, d.weights_NK)
    if layer.shared is not None:
        y_ND = y_ND + layer.shared(x_ND)
    return r, layout, x_RD, y_RD, y_ND


def moe_phases(layer: nn.Module, x_BSD: Tensor) -> dict[str, Callable[[], None]]:
    """The timed callables of one MoE layer: each phase on its real inputs, and the whole layer."""
    from archlab.nn.moe.experts import dispatch, from_rows, to_rows
    from archlab.nn.moe.layer import capacity_for

    B, S, D = x_BSD.shape
    moe, experts = layer.moe, layer.experts
    x_ND = x_BSD.reshape(B * S, D)

    def router(x):
        r = layer.router(x)
        terms = [t.loss(r, B, training=True, recomputing=False) for t in layer.balance_terms]
        return (r.weights_NK, *[v for v in terms if v is not None])

    def permute(x, experts_NK, weights_NK):
        d = dispatch(experts_NK, weights_NK, moe.num_experts, capacity_for(B * S, moe))
        return (to_rows(x, experts.layout(x, d), d.top_k),)

    with torch.no_grad():
        r, layout, x_RD, y_RD, _ = chain(layer, x_BSD)

    calls = {
        "router": _timed_call(router, (x_ND,)),
        "dispatch": _timed_call(permute, (x_ND, r.experts_NK, r.weights_NK)),
        "experts": _timed_call(lambda x: (experts.rows_forward(x, layout.rows_E, layout.capacity),), (x_RD,)),
        "combine": _timed_call(lambda y, w: (from_rows(y, layout, w),), (y_RD, r.weights_NK)),
    }
    if layer.shared is not None:
        calls["shared"] = _timed_call(lambda x: (layer.shared(x),), (x_ND,))
    calls[WHOLE] = _timed_call(lambda x: layer(x), (x_BSD,))
    return calls


def layer_calls(model: nn.Module, x_BS: Tensor) -> list[dict[str, Callable[[], None]]]:
    """Per feed-forward layer: the MoE layer's phases and whole, or a dense FFN's call."""
    from archlab.nn.moe.layer import MoELayer

    out = []
    for ffn, x_BSD in ffn_inputs(model, x_BS):
        if isinstance(ffn, MoELayer):
            out.append(moe_phases(ffn, x_BSD))
        else:
            out.append({DENSE: _timed_call(lambda x, f=ffn: (f(x),), (x_BSD,))})
    return out


def breakdown(runs: dict[str, str], windows: Optional[int] = None, rounds: int = 5, repeats: int = 10,
              threads: Optional[int] = None) -> dict[str, dict]:
    """{name: {"ms": {phase: median ms per micro-step, summed over layers}, "layers": {kind: count},
    "tokens": N, "rounds": {phase: [ms of each round]}}} for each run folder (its newest checkpoint, on
    its first ``windows`` validation windows at its training length; default: its micro batch, so the
    times are one micro-step's)."""
    from archlab.data import prepare_data
    from archlab.train.checkpoint import load_model

    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        per_run: dict[str, list[dict[str, Callable[[], None]]]] = {}
        tokens: dict[str, int] = {}
        for name, run_dir in runs.items():
            model, cfg = load_model(run_dir)
            model.train()  # the training step's path (balancing losses, dropout off in these recipes)
            S, B = int(cfg.train.seq_len), int(windows or cfg.train.micro_batch_size)
            val = prepare_data(cfg).val
            x_BS = torch.as_tensor(val[: B * S].astype("int64")).view(B, S)
            per_run[name] = layer_calls(model, x_BS)
            tokens[name] = B * S
        for layers in per_run.values():  # warm-up: allocator, kernels
            for calls in layers:
                for call in calls.values():
                    call()
        times: dict[str, dict[str, list[float]]] = {n: {} for n in per_run}
        for _ in range(rounds):
            for name, layers in per_run.items():
                for phase in sorted({p for calls in layers for p in calls}):
                    total = 0.0
                    for calls in layers:
                        if phase in calls:
                            t0 = time.perf_counter()
                            for _ in range(repeats):
                                calls[phase]()
                            total += (time.perf_counter() - t0) / repeats
                    times[name].setdefault(phase, []).append(1e3 * total)
    finally:
        torch.set_num_threads(previous)
    out = {}
    for name, layers in per_run.items():
        kinds = {"moe": sum(WHOLE in c for c in layers), "dense": sum(DENSE in c for c in layers)}
        out[name] = {"ms": {p: statistics.median(v) for p, v in times[name].items()}, "rounds": times[name],
                     "layers": kinds, "tokens": tokens[name], "repeats": repeats, "threads": threads}
    return out
