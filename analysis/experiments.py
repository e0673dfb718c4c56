"""What every part of an experiment's report (``analysis.experiment_report``) reads and writes
with: the runs of the record collected per arm and grid cell (:class:`Group`, :class:`Context`),
their statistics, costs and formatting helpers, and the :class:`Section` each measurement
(``analysis.measurements``) and stage (``tools.experiment.stages.tuning``, ``tools.experiment.stages.ceg``) adds
to the report. Imports no measurement: they import it.

Statistics. An arm's seeds give losses x_1..x_n: the table shows the mean and the 95% t-interval
mean ± t_{0.975, n-1} * sd / sqrt(n) (none for n = 1). Against the reference arm (or the parent
arm), runs are paired by seed (same initial-weight seed and data order): d_s = x_s(arm) - x_s(ref),
with the same t-interval over the d_s; pairing removes the seed-to-seed variance the two arms
share, so the paired interval is narrower than the two intervals side by side suggest.

Costs, per arm: parameters total / active per token (``archlab.costs.param_counts``), training
FLOPs per token (the run's, from the cost model), tokens/s measured on this machine (the
interleaved benchmark of the measurement ``throughput``, every arm timed side by side under the
same load, when the spec has it; and the runs': per run the median over its logged windows of
``train.log_every`` steps, then the mean over seeds; on a shared machine the runs' figures carry
whatever else ran beside them), peak resident
memory of the trainer process (``peak_rss_bytes`` of the sweep manifest, the largest over seeds)
and the KV-cache bytes per token of context at inference in bf16 (``archlab.costs.kv_cache_bytes``).

A run whose final validation loss is not at least :data:`LEARN_MARGIN` nats below the unigram entropy
of its training split (near it, or above it) is marked "did not learn": it learned no more than token
frequencies.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from analysis.experiment_spec import Arm, Spec
from analysis.runs import LEARN_MARGIN, RunError, open_run  # noqa: F401  (LEARN_MARGIN: re-exported)
from archlab.config import load_recipe, model_config
from archlab.costs import kv_cache_bytes, param_counts, training_flops_per_token, training_memory
from archlab.io import read_jsonl
from archlab.train.run_folder import METRICS

LEVEL = 0.95


# --------------------------------------------------------------------------------------------
# statistics
# --------------------------------------------------------------------------------------------


def t_interval(values: Sequence[float], level: float = LEVEL) -> dict:
    """{mean, low, high, sd, n} with the two-sided t-interval of the mean (low/high None for n < 2)."""
    from scipy import stats

    vals = [float(v) for v in values if v is not None and math.isfinite(v)]
    n = len(vals)
    if n == 0:
        return {"mean": None, "low": None, "high": None, "sd": None, "n": 0}
    mean = sum(vals) / n
    if n < 2:
        return {"mean": mean, "low": None, "high": None, "sd": None, "n": 1}
    sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1))
    half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)
    return {"mean": mean, "low": mean - half, "high": mean + half, "sd": sd, "n": n}


def paired_difference(a: dict, b: dict, level: float = LEVEL) -> dict:
    """t-interval of a[s] - b[s] over the seeds s present (and finite) in both; ``seeds`` lists them."""
    seeds = sorted(s for s in a if s in b and _finite(a[s]) and _finite(b[s]))
    return {**t_interval([a[s] - b[s] for s in seeds], level), "seeds": seeds}


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


# --------------------------------------------------------------------------------------------
# collecting the runs
# --------------------------------------------------------------------------------------------


def cell_tag(cell: dict) -> str:
    """``{train.lr: 1e-3, train.warmup_steps: 0}`` -> ``lr=1e-3, warmup_steps=0`` ('' without a grid)."""
    return ", ".join(f"{k.split('.')[-1]}={v}" for k, v in cell.items())


def _manifests(record: dict) -> dict[str, dict]:
    out, runs = {}, Path(Spec.from_dict(record["spec"]).out)
    for folder in sorted({r["sweep"] for r in record["runs"] + record.get("ceg_runs", [])}):
        path = runs / folder / "manifest.json"
        if path.is_file():
            for p in json.loads(path.read_text()).get("points", []):
                out[p["name"]] = p
    return out


def run_row(run: dict, manifest: dict) -> dict:
    """Everything the report uses of one run: status, losses, throughput, memory, time."""
    row = {**run, "status": "missing", "reason": "", "val_loss": None, "metric": "loss", "final_val": {},
           "tokens": None, "training_flops": None, "flops_per_token": None, "tokens_per_s": None,
           "unigram_entropy": None, "elapsed_s": wall_seconds({"run_dir": run["run_dir"], **manifest}),
           "peak_rss_bytes": manifest.get("peak_rss_bytes"), "learned": None}
    try:
        r = open_run(run["run_dir"])
    except RunError as e:
        return {**row, "reason": str(e)}
    s = r.summary or {}
    row.update(status=r.status, reason=r.reason, val_loss=r.final_val_loss, metric=r.loss_key,
               final_val=s.get("final_val_loss") or {},
               tokens=s.get("tokens"), training_flops=s.get("training_flops"), flops_per_token=s.get("flops_per_token"),
               tokens_per_s=run_tokens_per_s(run["run_dir"]), unigram_entropy=s.get("unigram_entropy_train"))
    if r.status == "finished" and _finite(row["val_loss"]) and _finite(row["unigram_entropy"]):
        row["learned"] = bool(row["val_loss"] < row["unigram_entropy"] - LEARN_MARGIN)
    return row


def wall_seconds(point: dict) -> Optional[float]:
    """A run's wall time: the sweep's (its manifest entry's ``elapsed_s``, launch to exit), else the trainer's own
    (the run folder's summary, a few seconds less: start-up excluded) where a manifest lost it (a restored run; a
    manifest an earlier version rewrote without it); None for a run with neither."""
    if _finite(point.get("elapsed_s")):
        return float(point["elapsed_s"])
    try:
        own = (open_run(point["run_dir"]).summary or {}).get("elapsed_s")
    except (RunError, KeyError, TypeError):
        return None
    return float(own) if _finite(own) else None


def run_tokens_per_s(run_dir) -> Optional[float]:
    """Median training throughput of a run over its logged windows (metrics.jsonl ``kind: train``
    rows; the first window, with the start-up, is left out when there are others)."""
    speeds = [r["tokens_per_s"] for r in read_jsonl(Path(run_dir) / METRICS)
              if r.get("kind") == "train" and _finite(r.get("tokens_per_s"))]
    if len(speeds) > 2:
        speeds = speeds[1:]
    if not speeds:
        return None
    speeds.sort()
    mid = len(speeds) // 2
    return speeds[mid] if len(speeds) % 2 else (speeds[mid - 1] + speeds[mid]) / 2


def kv_and_state(cfg) -> tuple[float, float]:
    """(KV-cache bytes per token of context, recurrent-state bytes per sequence), bf16: what grows with the context
    (attention's K/V) and what does not (a Gated DeltaNet layer's state), from the cache at contexts 1 and 2."""
    one, two = (float(kv_cache_bytes(cfg, batch=1, context=c, dtype="bf16")) for c in (1, 2))
    return two - one, 2 * one - two


def arm_costs(arm: Arm) -> dict:
    """Cost-model numbers of an arm from its recipe: parameters, FLOPs per token, KV-cache bytes."""
    cfg = load_recipe(arm.recipe, arm.overrides)
    pc = param_counts(cfg).as_dict()
    kv, state = kv_and_state(cfg)
    # one rank's training step as these runs take it: fp32 on the CPU, the recipe's micro batch, AdamW states
    memory = training_memory(cfg, int(cfg.train.micro_batch_size), int(cfg.train.seq_len), precision="fp32",
                             device="cpu")
    return {"params_total": pc["total"], "params_active": pc["active"], "params_non_embedding": pc["non_embedding"],
            "flops_per_token": float(training_flops_per_token(model_config(cfg), int(cfg.train.seq_len))),
            "kv_bytes_per_token": kv, "state_bytes_per_sequence": state,
            "seq_len": int(cfg.train.seq_len), "family": str(cfg.family), "train_memory_bytes": memory["total"],
            "activation_bytes": memory["activations"]}


@dataclass
class Group:
    """The runs of one arm in one grid cell (all seeds), with their statistics."""

    arm: str
    label: str
    cell: dict
    runs: dict  # seed -> run row
    costs: dict
    loss: dict = field(default_factory=dict)
    vs_reference: Optional[dict] = None
    vs_parent: Optional[dict] = None
    vs_compare: Optional[dict] = None  # against the arm's `compare:` arm
    bench_tokens_per_s: Optional[float] = None  # the interleaved throughput benchmark (measurement `throughput`)

    def speed(self) -> Optional[float]:
        """Tokens/s to compare arms by: the benchmark's when measured, else the runs' mean."""
        return self.bench_tokens_per_s or self.measured()["tokens_per_s"]["mean"]

    @property
    def key(self) -> tuple[str, str]:
        return self.arm, cell_tag(self.cell)

    def losses(self) -> dict:
        return {s: r["val_loss"] for s, r in self.runs.items() if r["status"] == "finished"}

    @property
    def metric(self) -> str:
        """The validation loss its runs report: ``loss`` (next token), ``mlm_loss``, ``span_loss``."""
        return next(iter(self.runs.values()))["metric"] if self.runs else "loss"

    def measured(self) -> dict:
        speeds = [r["tokens_per_s"] for r in self.runs.values() if _finite(r["tokens_per_s"])]
        rss = [r["peak_rss_bytes"] for r in self.runs.values() if r["peak_rss_bytes"]]
        times = [r["elapsed_s"] for r in self.runs.values() if _finite(r["elapsed_s"])]
        tokens = [r["tokens"] for r in self.runs.values() if _finite(r["tokens"])]
        learned = [r["learned"] for r in self.runs.values() if r["learned"] is not None]
        return {"tokens_per_s": t_interval(speeds), "peak_rss_bytes": max(rss) if rss else None,
                "run_seconds": t_interval(times), "tokens": max(tokens) if tokens else None,
                "did_not_learn": sum(1 for x in learned if not x), "statuses": sorted({r["status"] for r in
                                                                                         self.runs.values()})}


@dataclass
class Context:
    """What every report section reads: the record, the arms, the run rows, the groups and the
    measurement results; sections add their figures under ``out``."""

    record: dict
    arms: dict[str, Arm]  # name -> the arm, in the record's order
    rows: list
    groups: dict  # (arm, cell tag) -> Group
    measures: dict
    out: Path
    curve_rows: list = field(default_factory=list)  # the compute curve's trunks and branches (role ceg-*)
    comparison: dict = field(default_factory=dict)  # analysis.ceg_report.compare (set by the report): verdicts, CEG
    costs: dict = field(default_factory=dict)  # arm name -> its cost-model numbers (arm_costs)

    @property
    def spec(self) -> Spec:
        return Spec.from_dict(self.record["spec"])

    @property
    def reference(self) -> str:
        return self.spec.reference

    def group(self, arm: str, cell: str = "") -> Optional[Group]:
        return self.groups.get((arm, cell))

    def arm_groups(self, cell: str = "") -> list[Group]:
        return [g for (a, c), g in self.groups.items() if c == cell]


def build_context(record: dict, measures: dict, out: Path) -> Context:
    """The report's context from the run folders the record names."""
    manifests = _manifests(record)
    rows = [run_row(r, manifests.get(r["point"], {})) for r in record["runs"]]
    curve_rows = [run_row(r, manifests.get(r["point"], {})) for r in record.get("ceg_runs", [])]
    return context_from_rows(record, rows, curve_rows, measures, out)


def context_from_rows(record: dict, rows: list[dict], curve_rows: list[dict], measures: dict, out: Path,
                      costs: Optional[dict] = None) -> Context:
    """The context from run rows already read (:func:`run_row`; a committed report.json's ``runs`` and
    ``curve_runs``): groups per arm and cell with their intervals and paired differences. ``costs``: each
    arm's cost-model numbers when known (else computed from its recipe)."""
    arms = {a.name: a for a in map(Arm.from_dict, record["arms"])}
    costs = {name: (costs or {}).get(name) or arm_costs(a) for name, a in arms.items()}
    groups: dict = {}
    for row in rows:
        key = (row["arm"], cell_tag(row["cell"]))
        if key not in groups:
            groups[key] = Group(arm=row["arm"], label=arms[row["arm"]].label, cell=row["cell"], runs={},
                                costs=costs[row["arm"]])
        groups[key].runs[row["seed"]] = row
    bench = measures.get("throughput") or {}
    for (arm, _), g in groups.items():
        g.bench_tokens_per_s = (bench.get(arm) or {}).get("tokens_per_s")
    order = {a: i for i, a in enumerate(arms)}
    reference = Spec.from_dict(record["spec"]).reference
    groups = dict(sorted(groups.items(), key=lambda kv: (kv[0][1], order[kv[0][0]])))
    for (arm, tag), g in groups.items():
        g.loss = t_interval(list(g.losses().values()))
        # losses of different objectives (next-token, masked-token, span) measure different things: only arms
        # sharing the objective are differenced
        ref = groups.get((reference, tag))
        if ref is not None and arm != ref.arm and ref.metric == g.metric:
            g.vs_reference = paired_difference(g.losses(), ref.losses())
        parent = groups.get((arms[arm].parent, tag)) if arms[arm].parent else None
        if parent is not None and parent.metric == g.metric:
            g.vs_parent = paired_difference(g.losses(), parent.losses())
        other = groups.get((arms[arm].compare, tag)) if arms[arm].compare else None
        if other is not None and other.metric == g.metric:
            g.vs_compare = paired_difference(g.losses(), other.losses())
    return Context(record=record, arms=arms, rows=rows, groups=groups, measures=measures, out=out,
                   curve_rows=curve_rows, costs=costs)


# --------------------------------------------------------------------------------------------
# formatting
# --------------------------------------------------------------------------------------------


def fmt_ci(iv: Optional[dict], digits: int = 3, signed: bool = False) -> str:
    """'4.512 [4.480, 4.544]', '+0.012 [-0.030, +0.054]', '4.512 (1 seed)', or '-'; ``digits`` decimals, and two
    significant figures where they would round a mean that is not 0 to 0, or (``digits=0``) one under 10: '0.58',
    '3.4'."""
    if not iv or iv.get("mean") is None:
        return "-"
    mean = abs(float(iv["mean"]))
    if 0 < mean < (10 if digits == 0 else 0.5 * 10 ** -digits):  # whole units under 10, or a value not 0
        digits = 1 - math.floor(math.log10(mean))  # rounded to 0: two significant figures
    f = f"{{:{'+' if signed else ''}.{digits}f}}"
    if iv.get("low") is None:
        return f.format(iv["mean"]) + " (1 seed)"
    return f"{f.format(iv['mean'])} [{f.format(iv['low'])}, {f.format(iv['high'])}]"


def fmt_count(n: Optional[float]) -> str:
    if n is None:
        return "-"
    for factor, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= factor:
            return f"{n / factor:.3g}{unit}"
    return f"{n:.3g}"


def fmt_bytes(n: Optional[float]) -> str:
    if n is None:
        return "-"
    if n >= 2**20:
        return f"{n / 2**20:.0f} MiB"
    return f"{n:.0f} B"


def table(header: Sequence[str], rows: Sequence[Sequence]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


COST_HEADER = ["params total / active", "train FLOPs/token", "tokens/s on this machine: benchmark; runs", "peak RSS",
               "KV cache/token"]


def cost_cells(g: Group) -> list[str]:
    c, m = g.costs, g.measured()
    speed = f"runs {fmt_count(m['tokens_per_s']['mean'])}"
    if g.bench_tokens_per_s:
        speed = f"{fmt_count(g.bench_tokens_per_s)}; {speed}"
    return [f"{fmt_count(c['params_total'])} / {fmt_count(c['params_active'])}", fmt_count(c["flops_per_token"]),
            speed, fmt_bytes(m["peak_rss_bytes"]), fmt_bytes(c["kv_bytes_per_token"])
            + (f" + {fmt_bytes(c['state_bytes_per_sequence'])} state/sequence" if c.get("state_bytes_per_sequence")
               else "")]


def figure_md(figures: list[str], fig, alt: str) -> str:
    """Markdown that embeds a saved figure (its name appended to ``figures``), or "" when the plot
    had nothing to draw (``fig`` None)."""
    if not fig:
        return ""
    figures.append(fig.name)
    return f"\n\n![{alt}]({fig.name})"


def errbar(iv: dict) -> Optional[list]:
    """matplotlib's ``xerr``/``yerr`` of one interval (distances below and above the mean), or None
    without an interval."""
    if iv.get("low") is None:
        return None
    return [[iv["mean"] - iv["low"]], [iv["high"] - iv["mean"]]]


def mean_unigram(ctx: Context) -> Optional[float]:
    """The runs' mean unigram entropy of the training split (the loss of a model that learned only
    token frequencies), or None."""
    vals = [r["unigram_entropy"] for r in ctx.rows if _finite(r["unigram_entropy"])]
    return sum(vals) / len(vals) if vals else None


# --------------------------------------------------------------------------------------------
# report sections
# --------------------------------------------------------------------------------------------


@dataclass
class Section:
    """One section of the report: its title (``## title``), markdown, the figures it saved under the
    report folder and the numbers behind it (``report.json``)."""

    title: str
    markdown: str
    figures: list = field(default_factory=list)
    data: dict = field(default_factory=dict)
