"""``moe_breakdown: {rounds, repeats, windows}``: where an MoE training step's time goes against the
dense model's (``analysis.moe_breakdown``): for each arm's first-seed run (its trained weights, on its
first validation micro batch), every feed-forward layer timed forward + backward phase by phase
(router, dispatch, expert products, combine, shared experts; a dense FFN whole), interleaved across
the arms; cached as ``<out>/measurements/moe_breakdown.json``. The report sets the feed-forward time
of each arm beside the whole training step of the ``throughput`` measurement (when the spec has it),
so that it says how much of a MoE's per-second loss is its dispatch and how much the extra work.
"""

from __future__ import annotations

from analysis.experiments import Context, Section, figure_md, table
from analysis.measurements.base import Measurement, cached, check_int, measurement_folder, register
from analysis.plotting import COLORS, pyplot, save_figure

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

    def run(self, record: dict, log=print) -> dict:
        from analysis.moe_breakdown import breakdown

        m = self.settings(record)
        rounds, repeats, windows = int(m.get("rounds", 5)), int(m.get("repeats", 10)), m.get("windows")
        first: dict[str, str] = {}  # arm -> run folder of its first seed (side arms train a model already timed)
        side = {a["name"] for a in record["arms"] if a.get("side")}
        for run in sorted(record["runs"], key=lambda r: r["seed"]):
            if run["arm"] not in side and run["arm"] not in first and run.get("role", "seeded") == "seeded":
                first[run["arm"]] = run["run_dir"]
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
            rows.append([f"{ctx.arms[d['arm']]['label']} (`{d['arm']}`)", *cells, f"{ffn:.1f}",
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
    labels = [ctx.arms[d["arm"]]["label"] for d in data]
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
