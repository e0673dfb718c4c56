"""``moe_breakdown: {rounds, repeats, windows}``: where an MoE training step's time goes against the
dense model's (:func:`breakdown`): for each arm's first-seed run (its trained weights, on its
first validation micro batch), every feed-forward layer timed forward + backward phase by phase
(router, dispatch, expert products, combine, shared experts; a dense FFN whole), interleaved across
the arms; cached as ``<out>/measurements/moe_breakdown.json``. The report sets the feed-forward time
of each arm beside the whole training step of the ``throughput`` measurement (when the spec has it),
so that it says how much of a MoE's per-second loss is its dispatch and how much the extra work.

Where an MoE layer's time goes, against the dense FFN it replaces: every feed-forward layer of a
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

    from analysis.measurements.moe_breakdown import breakdown
    breakdown({"dense": "runs/.../dense-seed0", "mixtral": "runs/.../mixtral-seed0"}, rounds=5)

Shape legend: B windows, S positions, N = B*S tokens, D model width, K experts per token,
R expert-major rows.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Callable, Optional

import torch
from torch import Tensor, nn

from analysis.experiments import Context, Section, figure_md, table
from analysis.measurements.base import Measurement, cached, check_int, measurement_folder, record_arms, register
from analysis.plotting import COLORS, pyplot, save_figure
from archlab.data import prepare_data
from archlab.nn.moe.experts import dispatch, from_rows, to_rows
from archlab.nn.moe.layer import MoELayer, capacity_for
from archlab.train.checkpoint import load_model

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


PARTS = (("router", "router (gate, top-k, balancing loss)"), ("dispatch", "dispatch (sort, gather to rows)"),
         ("experts", "expert products"), ("combine", "combine (gather back, gate-weighted sum)"),
         ("shared", "shared experts"), ("dense FFN", "dense FFN layers"), ("other", "rest of the MoE layer"))


@register
class MoEBreakdown(Measurement):
    """Each feed-forward layer's time per phase, MoE against dense, with the whole step beside it."""

    name = "moe_breakdown"
    title = "Where the time goes: the MoE layer phase by phase against the dense FFN"
    keys = ("rounds", "repeats", "windows")
    quick = {"rounds": 2, "repeats": 2}

    def check(self, settings, where: str) -> dict:
        s = super().check(settings, where)
        for key in self.keys:
            check_int(s, key, where)
        return s

    loads_checkpoints = True

    @staticmethod
    def _first_runs(record: dict) -> dict[str, str]:
        """arm -> run folder of its first seed (side arms train a model already timed)."""
        first: dict[str, str] = {}
        side = {a.name for a in record_arms(record) if a.side}
        for run in sorted(record["runs"], key=lambda r: r["seed"]):
            if run["arm"] not in side and run["arm"] not in first and run.get("role", "seeded") == "seeded":
                first[run["arm"]] = run["run_dir"]
        return first

    def checkpoints(self, record: dict) -> dict[str, Path]:
        path = measurement_folder(record) / "moe_breakdown.json"
        return {run_dir: path for run_dir in self._first_runs(record).values()}

    def run(self, record: dict, log=print) -> dict:
        m = self.settings(record)
        rounds, repeats, windows = int(m.get("rounds", 5)), int(m.get("repeats", 10)), m.get("windows")
        first = self._first_runs(record)
        settings = {"rounds": rounds, "repeats": repeats, "windows": windows, "threads": record.get("threads"),
                    "runs": first}
        path = measurement_folder(record) / "moe_breakdown.json"
        if not path.is_file():
            log(f"moe_breakdown: {len(first)} runs, {rounds} interleaved rounds of {repeats} calls per phase")
        return cached(path, settings, lambda: breakdown(first, windows=windows, rounds=rounds, repeats=repeats,
                                                        threads=record.get("threads")))

    def section(self, ctx: Context) -> Section:
        timed = ctx.measures.get("moe_breakdown") or {}
        bench = ctx.measures.get("throughput") or {}
        ref = ctx.reference
        data = [breakdown_row(name, t, bench.get(name)) for name, t in timed.items()]
        ref_row = next((d for d in data if d["arm"] == ref), None)
        rows = []
        for d in data:
            cells = [f"{d['parts'].get(p, 0.0):.1f}" if p in d["parts"] else "-" for p, _ in PARTS]
            ffn = d["ffn_ms"]
            step = d["step_ms"]
            vs = ""
            if ref_row and d is not ref_row:
                d["ffn_minus_reference_ms"] = ffn - ref_row["ffn_ms"]
                if step is not None and ref_row["step_ms"] is not None:
                    d["step_minus_reference_ms"] = step - ref_row["step_ms"]
                    vs = (f"{d['step_minus_reference_ms']:+.1f} ms step, of which {d['ffn_minus_reference_ms']:+.1f} "
                          "in the FFN layers")
            rows.append([f"{ctx.arms[d['arm']].label} (`{d['arm']}`)", *cells, f"{ffn:.1f}",
                         f"{d['whole_ms']:.1f}" if d["whole_ms"] is not None else "-",
                         f"{step:.1f}" if step is not None else "-", vs or ("reference" if d is ref_row else "-")])
        any_t = next(iter(timed.values()), {})
        md = ("Each arm's first-seed run (its trained weights, routing as it learned it) on its first validation micro "
              f"batch ({any_t.get('tokens', 0)} tokens): every feed-forward layer timed forward + backward, phase by "
              "phase, on the phase's real inputs, interleaved across arms and phases in "
              f"{len(next(iter(any_t.get('rounds', {}).values()), []))} rounds of {any_t.get('repeats', 0)} calls, "
              f"{any_t.get('threads') or 'the default number of'} torch thread(s); the median over rounds, in ms per "
              "micro-step, summed over "
              "the model's layers. `rest of the MoE layer` is the whole layer timed at once less its phases (the "
              "layer's reshapes and its routing statistics, which a training step records). The training step "
              "(forward, backward and the optimizer over all parameters, experts included) is the `throughput` "
              "measurement's, at initialisation; its difference to the reference is what the FFN times explain in "
              "part.\n\n"
              + table(["arm", *[label for _, label in PARTS], "FFN layers, total (ms)", "MoE layers timed whole (ms)",
                       "training micro-step (ms)", "vs reference"], rows))
        figures: list[str] = []
        md += figure_md(figures, plot_breakdown(ctx, data, ctx.out / "moe_breakdown.png"),
                        "feed-forward time per phase and training step per arm")
        return Section(self.title, md, figures, {"arms": data})


def breakdown_row(arm: str, timed: dict, bench: dict | None) -> dict:
    """One arm's phases (ms per micro-step summed over layers), the FFN total, the MoE layers timed
    whole, and the training micro-step from the throughput benchmark (None without it)."""
    ms = timed["ms"]
    parts = {p: ms[p] for p, _ in PARTS if p in ms}
    whole = ms.get("whole layer")
    if whole is not None:
        phases = sum(ms.get(p, 0.0) for p in ("router", "dispatch", "experts", "combine", "shared"))
        parts["other"] = whole - phases
    ffn = (whole or 0.0) + ms.get("dense FFN", 0.0)
    step = None
    if bench and bench.get("tokens_per_s"):
        step = 1e3 * timed["tokens"] / bench["tokens_per_s"]
    return {"arm": arm, "parts": parts, "ffn_ms": ffn, "whole_ms": whole, "step_ms": step, "layers": timed["layers"],
            "tokens": timed["tokens"]}


def plot_breakdown(ctx: Context, data: list[dict], path):
    """Horizontal stacked bars: each arm's feed-forward time by phase; a tick for its whole training
    micro-step where the throughput benchmark measured it."""
    if not data:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(11, 0.8 * len(data) + 2.4))
    labels = [ctx.arms[d["arm"]].label for d in data]
    for j, (part, label) in enumerate(PARTS):
        vals = [max(d["parts"].get(part, 0.0), 0.0) for d in data]
        if not any(vals):
            continue
        left = [sum(max(d["parts"].get(p, 0.0), 0.0) for p, _ in PARTS[:j]) for d in data]
        ax.barh(range(len(data)), vals, left=left, color=COLORS[j % len(COLORS)], label=label, height=0.55)
    steps = [(i, d["step_ms"]) for i, d in enumerate(data) if d["step_ms"] is not None]
    if steps:
        ax.scatter([s for _, s in steps], [i for i, _ in steps], marker="|", s=900, color="black", zorder=3,
                   label="whole training micro-step")
    ax.set_yticks(range(len(data)), labels)
    ax.invert_yaxis()
    ax.set_xlim(0, None)
    ax.set_xlabel("time per training micro-step (ms, forward + backward, summed over layers)")
    ax.set_title("Feed-forward layers phase by phase, against the whole training step")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, fontsize=8, frameon=False)
    fig.tight_layout()
    return save_figure(fig, path)
