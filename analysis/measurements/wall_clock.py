"""``wall_clock: {}``: for each time-matched arm (``budget: {match_time_of: A, speed_of: B}``) two
views of the same question: A against B at equal training FLOPs, and A against the time-matched
arm at equal training time; and the validation curves against training time and FLOPs. No
settings; nothing to compute beyond the run folders (the speeds: the ``throughput`` benchmark when
the spec measures it).
"""

from __future__ import annotations

import numpy as np

from analysis.experiments import (
    Context,
    Group,
    Section,
    _finite,
    figure_md,
    fmt_ci,
    fmt_count,
    paired_difference,
    t_interval,
    table,
)
from analysis.measurements.base import Measurement, register
from analysis.plotting import COLORS, pyplot, save_figure, style_axes
from analysis.runs import open_run


@register
class WallClock(Measurement):
    """Equal FLOPs against equal wall-clock time."""

    name = "wall_clock"
    title = "Equal FLOPs against equal wall-clock time"

    def section(self, ctx: Context) -> Section:
        timed = [a for a in ctx.arms.values() if a.budget.timed]
        rows, data = [], []
        for a in timed:
            target, speed_arm = a.budget.match_time_of, a.budget.speed_of
            g, tg, sg = ctx.group(a.name), ctx.group(target), ctx.group(speed_arm)
            if g is None or tg is None or sg is None:
                continue
            budget = (ctx.record.get("timed_budgets") or {}).get(a.name, {})
            eq_flops = paired_difference(tg.losses(), sg.losses())
            eq_time = paired_difference(tg.losses(), g.losses())
            secs = {"target": _training_seconds(tg), "speed": _training_seconds(sg), "timed": _training_seconds(g)}
            ratio = tg.speed() / sg.speed() if tg.speed() and sg.speed() else None
            data.append({"arm": a.name, "target": target, "speed_arm": speed_arm, "budget": budget,
                         "equal_flops": eq_flops, "equal_time": eq_time, "training_seconds": secs,
                         "speed_ratio": ratio})
            rows.append([f"{tg.label} vs {sg.label}", "equal training FLOPs", fmt_ci(tg.loss), fmt_ci(sg.loss),
                         fmt_ci(eq_flops, signed=True), f"{fmt_count(tg.measured()['tokens'])} / "
                         f"{fmt_count(sg.measured()['tokens'])}", f"{fmt_ci(secs['target'], 0)} / "
                         f"{fmt_ci(secs['speed'], 0)}"])
            rows.append([f"{tg.label} vs {g.label}", "equal training time", fmt_ci(tg.loss), fmt_ci(g.loss),
                         fmt_ci(eq_time, signed=True), f"{fmt_count(tg.measured()['tokens'])} / "
                         f"{fmt_count(g.measured()['tokens'])}", f"{fmt_ci(secs['target'], 0)} / "
                         f"{fmt_ci(secs['timed'], 0)}"])
        budgets = list((ctx.record.get("timed_budgets") or {}).values())
        speeds_from = budgets[0].get("speeds_from", "the runs") if budgets else "the runs"
        md = ("Two views of the same question. Equal FLOPs: both arms train the same training FLOPs. Equal time: the "
              "dense arm trains as many tokens as it processes in the training time of the MoE arm, training time = "
              f"tokens / tokens per second, the speeds from {speeds_from} (evaluation and start-up excluded). A "
              "negative difference: the first arm is better.\n\n"
              + table(["comparison", "view", "first arm loss", "second arm loss", "first - second (paired)",
                       "tokens (first / second)", "training s (first / second)"], rows))
        if data and data[0]["speed_ratio"]:
            md += "\n\n" + "; ".join(f"{ctx.arms[d['target']].label} trains at {d['speed_ratio']:.2f}x the tokens/s "
                                     f"of {ctx.arms[d['speed_arm']].label}" for d in data) + "."
        figures: list[str] = []
        md += figure_md(figures, plot_curves(ctx, ctx.out / "loss_vs_time_and_flops.png"),
                        "validation loss against time and FLOPs")
        return Section(self.title, md, figures, {"comparisons": data})


def _val_curve(run_dir: str) -> tuple[list, list, list, list]:
    """(training seconds, tokens, training FLOPs, validation loss) at each validation of a run."""
    run = open_run(run_dir)
    train = run.train_rows
    steps = [r["step"] for r in train]
    secs = [r.get("elapsed_s", 0.0) for r in train]
    t, n, f, v = [], [], [], []
    for row in run.val_rows:
        if row.get("final"):
            continue
        t.append(float(np.interp(row["step"], steps, secs)) if steps else None)
        n.append(row.get("tokens", 0))
        f.append(row.get("tokens", 0) * run.flops_per_token)
        v.append(row["loss"])
    fin = run.final_val_loss
    if fin is not None and train:
        t.append(secs[-1])
        n.append(run.tokens_seen or 0)
        f.append((run.tokens_seen or 0) * run.flops_per_token)
        v.append(fin)
    return t, n, f, v


def _training_seconds(g: Group) -> dict:
    """Training time of each of the arm's runs: tokens / tokens per second (the benchmark's when
    measured, so that arms compare under the same load; else each run's own median)."""
    vals = []
    for r in g.runs.values():
        speed = g.bench_tokens_per_s or r["tokens_per_s"]
        if _finite(r["tokens"]) and _finite(speed):
            vals.append(r["tokens"] / speed)
    return t_interval(vals)


def plot_curves(ctx: Context, path):
    """Each arm's validation curve (mean over seeds, band: min to max over seeds) against training time
    and against training compute; the time-matched arms dashed. The y-axis spans the last stretch of
    training, where the arms separate (the first evaluations, near log V, would squash it)."""
    plt = pyplot()
    fig, (ax_t, ax_f) = plt.subplots(1, 2, figsize=(13, 5))
    bench = all(g.bench_tokens_per_s for g in ctx.arm_groups())
    finals, drawn = [], 0
    for i, g in enumerate(ctx.arm_groups()):
        curves = [_val_curve(r["run_dir"]) for r in g.runs.values() if r["status"] == "finished"]
        curves = [c for c in curves if c[3]]
        if not curves:
            continue
        k = min(len(c[3]) for c in curves)  # the seeds of an arm evaluate at the same steps
        n = np.mean([c[1][:k] for c in curves], axis=0)
        t = n / g.bench_tokens_per_s if bench else np.mean([c[0][:k] for c in curves], axis=0)
        f = np.mean([c[2][:k] for c in curves], axis=0) / 1e12
        v = np.array([c[3][:k] for c in curves], dtype=float)
        color, style = COLORS[i % len(COLORS)], "--" if ctx.arms[g.arm].budget.timed else "-"
        label = f"{g.label} ({len(curves)} seed{'s' if len(curves) > 1 else ''})"
        for ax, x in ((ax_t, t), (ax_f, f)):
            ax.plot(x, v.mean(axis=0), style, color=color, lw=1.5, label=label)
            if len(curves) > 1:
                ax.fill_between(x, v.min(axis=0), v.max(axis=0), color=color, alpha=0.15, lw=0)
        finals.append(float(v.mean(axis=0)[-1]))
        drawn += 1
    if not drawn:
        return None
    for ax in (ax_t, ax_f):  # the end of training readable: from below the best final loss to 0.6 nats above the worst
        ax.set_ylim(min(finals) - 0.1, max(finals) + 0.6)
        ax.set_xlim(0, None)
    style_axes(ax_t, "Validation loss against training time\n(mean over seeds; band: min to max)",
               "training time (s): tokens / benchmark tokens per second" if bench
               else "training wall-clock time (s, this machine)", "validation loss (nats/token)")
    style_axes(ax_f, "Validation loss against training compute\n(mean over seeds; band: min to max)",
               "training compute (10^12 FLOPs)", "validation loss (nats/token)")
    return save_figure(fig, path)
