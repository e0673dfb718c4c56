"""The report of an experiment (``python -m tools.experiment run|report``): per arm the final
validation loss over seeds with a 95% t-interval, the paired (same-seed) difference against the
reference arm and against the arm it extends, and what the arm costs (``analysis.experiments``:
the statistics and the costs); then the tuning stage (``tools.experiment.stages.tuning``), the
classification against the reference's compute curve (``tools.experiment.stages.ceg``), one section per
measurement the spec names (``analysis.measurements``: in the spec's order, ``throughput`` last)
and every run. Writes ``report.md``, ``report.json`` (every number) and PNGs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from analysis import ceg_report, cpu_hours, tuning_report, verdicts
from analysis.cpu_hours import RUN_LISTS
from analysis.experiments import (
    COST_HEADER,
    LEARN_MARGIN,
    Context,
    Group,
    _finite,
    build_context,
    cost_cells,
    errbar,
    figure_md,
    fmt_bytes,
    fmt_ci,
    fmt_count,
    table,
)
from analysis.measurements import MEASUREMENTS
from analysis.plotting import COLORS, pyplot, save_figure, style_axes, wrap_label
from analysis.runs import write_json_atomic, write_text_atomic
from archlab.config import load_recipe


def loss_note(g: Group, ctx: Optional["Context"] = None) -> str:
    m = g.measured()
    notes = []
    if g.vs_compare is not None and ctx is not None:
        notes.append(f"vs `{ctx.arms[g.arm].compare}` (paired): {fmt_ci(g.vs_compare, signed=True)}")
    if m["did_not_learn"]:
        notes.append(f"{m['did_not_learn']} of {len(g.runs)} did not learn (final loss not {LEARN_MARGIN} nats below "
                     "the unigram entropy)")
    bad = [r for r in g.runs.values() if r["status"] != "finished"]
    for r in bad:
        notes.append(f"seed {r['seed']} {r['status']}" + (f": {r['reason']}" if r["reason"] else ""))
    return "; ".join(notes)


# --------------------------------------------------------------------------------------------
# the main table and plot
# --------------------------------------------------------------------------------------------


def tuned_lr(ctx: Context, arm: str) -> str:
    """'3e-3 (bracketed)', '1e-2 (edge: limit hit)', or the lr the arm trained at when untuned."""
    tuning = ctx.record.get("tuning") or {}
    source = arm if arm in tuning else ctx.arms[arm].parent
    if source in tuning:
        t = tuning[source]
        where = "bracketed" if t["bracketed"] else "edge: limit hit"
        return f"{t['lr']:g} ({where}{'' if source == arm else f', of {source}'})"
    a = ctx.arms[arm]
    return f"{float(load_recipe(a.recipe, a.overrides).train.lr):g} (untuned)"


def verdict_cell(ctx: Context, comparison: dict) -> str:
    """The arm's verdict. A verdict read against another arm than the reference (the row's difference and CEG
    columns) names that arm and carries its own estimate and interval, so the cell never sits beside an interval
    from another comparison (a step against its parent, an arm against its ``compare:`` arm)."""
    verdict = comparison.get("class", "-")
    v = comparison.get("verdict") or {}
    against = v.get("against")
    if against and against != ctx.reference:
        verdict += f" vs `{against}`: {verdicts.fmt_interval(v)}"
    return verdict


def main_table(ctx: Context, cell: str = "") -> str:
    comp = ctx.comparison.get("arms", {}) if not cell else {}
    header = ["arm", "lr", "final val loss (nats/token), mean [95% CI]", f"vs `{ctx.reference}` (paired)",
              f"CEG vs `{ctx.reference}` (paired; interval at the verdict's level when it is the verdict's, else 95%)",
              "verdict (Holm)", "vs parent (paired)", "tokens trained",
              *COST_HEADER, "notes"]
    rows = []
    for g in ctx.arm_groups(cell):
        parent = ctx.arms[g.arm].parent
        vs_parent = f"{fmt_ci(g.vs_parent, signed=True)} vs {parent}" if g.vs_parent else "-"
        c = comp.get(g.arm, {})
        cal = ctx.comparison.get("calibration") if g.arm == ctx.reference and not cell else None
        ceg = (f"curve calibration {cal['ceg']:.2f}x" + ("" if cal.get("low") is None else
                                                          f" [{cal['low']:.2f}, {cal['high']:.2f}]")
               if cal and cal.get("ceg") else ceg_report.fmt_ceg(c.get("ceg")))
        loss = fmt_ci(g.loss) + (f" ({g.metric})" if g.metric != "loss" else "")  # another objective's loss
        rows.append([f"{g.label} (`{g.arm}`)", tuned_lr(ctx, g.arm), loss,
                     fmt_ci(g.vs_reference, signed=True) if g.vs_reference
                     else ("reference" if g.arm == ctx.reference else "-"), ceg, verdict_cell(ctx, c), vs_parent,
                     fmt_count(g.measured()["tokens"]), *cost_cells(g), loss_note(g, ctx)])
    return table(header, rows)


def paired_rows(ctx: Context, cell: str = "") -> list[tuple[Group, str, dict]]:
    """(arm, the arm it is differenced against, the paired difference) for every arm the claims rest on: its
    ``compare:`` arm under ``verdicts: pairs`` (or when it names one), the arm it extends under ``verdicts: parent``,
    else the reference; never across objectives (the difference is absent there)."""
    mode = ctx.spec.verdicts
    out = []
    for g in ctx.arm_groups(cell):
        arm = ctx.arms[g.arm]
        if arm.compare and g.vs_compare:
            out.append((g, arm.compare, g.vs_compare))
        elif mode == "parent" and g.vs_parent and not arm.side:
            out.append((g, arm.parent, g.vs_parent))
        elif mode == "reference" and g.vs_reference:
            out.append((g, ctx.reference, g.vs_reference))
    return out


def plot_losses(ctx: Context, path: Path, cell: str = "") -> Optional[Path]:
    """Left: each arm's final validation loss, every seed and the mean with its 95% interval. Right: the paired
    (same-seed) differences the claims rest on, with their 95% intervals and the equivalence margin. The
    unigram entropy is drawn only where it does not squeeze the data (else the title gives it); one legend
    for both panels, below them."""
    groups = [g for g in ctx.arm_groups(cell) if g.loss.get("mean") is not None]
    if not groups:
        return None
    diffs = [d for d in paired_rows(ctx, cell) if d[2].get("mean") is not None]
    plt = pyplot()
    labels = [wrap_label(g.label + (f" [{g.metric}]" if g.metric != "loss" else "")) for g in groups]
    rows = max(len(groups), len(diffs))
    height = (0.62 if any("\n" in t for t in labels) else 0.45) * rows + 2.2
    if diffs:
        fig, (ax, ax_d) = plt.subplots(1, 2, figsize=(14, height), gridspec_kw={"width_ratios": [3, 2]})
    else:
        fig, ax = plt.subplots(figsize=(8, height))
    for i, g in enumerate(groups):
        y = len(groups) - 1 - i
        losses = list(g.losses().values())
        ax.scatter(losses, [y] * len(losses), color=COLORS[0], s=14, alpha=0.5, zorder=3,
                   label="one seed" if i == 0 else None)
        ax.errorbar([g.loss["mean"]], [y], xerr=errbar(g.loss), fmt="D", color=COLORS[3], capsize=4, zorder=4,
                    label="mean, 95% t-interval" if i == 0 else None)
    unigram = [r["unigram_entropy"] for g in groups for r in g.runs.values() if _finite(r["unigram_entropy"])]
    title_note = ""
    if unigram:
        h = sum(unigram) / len(unigram)
        seen = [v for g in groups for v in g.losses().values() if _finite(v)]
        spread = max(seen) - min(seen) if seen else 0.0
        if seen and h - max(seen) > 0.25 * max(spread, 0.05):  # a line that far off would squeeze the data: say it
            title_note = f"; unigram {h:.2f}, off the axis"
        else:
            ax.axvline(h, color="0.5", ls="--", lw=1, label="unigram entropy (no learning)")
    ax.set_yticks(range(len(groups)), list(reversed(labels)))
    counts = sorted({len(g.runs) for g in groups})  # sequential seeds: arms may stop at different looks
    n = "-".join(str(c) for c in (counts[0], counts[-1]) if c) if len(counts) > 1 else str(counts[0])
    style_axes(ax, f"Final validation loss ({n} seed{'s' if n != '1' else ''} per arm{title_note})",
               "nats/token (lower is better)", "", legend=False, grid="x")
    handles, names = ax.get_legend_handles_labels()
    if diffs:
        margin = ctx.spec.margin.nats
        if margin:
            ax_d.axvspan(-margin, margin, color="0.85", zorder=0, label=f"equivalence margin +-{margin:g} nats")
        ax_d.axvline(0.0, color="0.3", lw=0.8)
        for i, (g, other, d) in enumerate(diffs):
            y = len(diffs) - 1 - i
            ax_d.errorbar([d["mean"]], [y], xerr=errbar(d), fmt="o", color=COLORS[i % len(COLORS)], capsize=4)
        ax_d.set_yticks(range(len(diffs)), [f"{g.arm} - {o}" for g, o, _ in reversed(diffs)])  # the arms' names
        style_axes(ax_d, "Paired difference (same seeds), 95% CI", "difference (nats/token; < 0: the first is better)",
                   "", legend=False, grid="x")
        more_handles, more_names = ax_d.get_legend_handles_labels()
        handles, names = handles + more_handles, names + more_names
    fig.tight_layout(rect=(0, 0.9 / height, 1, 1))
    fig.legend(handles, names, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    return save_figure(fig, path)


# --------------------------------------------------------------------------------------------
# the report
# --------------------------------------------------------------------------------------------


def _wall_time(ctx: Context) -> str:
    times = [r["elapsed_s"] for r in ctx.rows if _finite(r["elapsed_s"])]
    measure = ctx.record.get("measure_wall_s")
    return (f"{len(ctx.rows)} training runs, {sum(times) / 60:.1f} min of training wall time in total (the sum of the "
            f"runs' times, from the sweep manifests); measurements after training {measure or 0:.0f} s in the "
            "invocation that wrote this report (measurements cached in the runs folder are reused, not timed again).")


NOT_REGISTERED = "not pre-registered in the records (runs predate spec hashing)"


def registration_text(record: dict) -> str:
    """What the records prove of the design's pre-registration (``tools.experiment.registration``): the hash, when
    it was first stated, whether every run carries it, the amendments; or that the runs predate spec hashing."""
    reg = record.get("registration")
    if not reg:
        return f"Pre-registration: {NOT_REGISTERED}."
    lines = [f"pre-registered: {reg['first_hash']}, first run {reg['first_stated_at']} (the hash of the spec's "
             "decision-relevant part, `<out>/registration.json`)."]
    known = [reg["first_hash"], *(c["new"] for c in reg.get("chain") or [])]
    counts: dict = {}
    for key in RUN_LISTS:
        for r in record.get(key) or []:
            h = r.get("spec_hash")
            counts[h] = counts.get(h, 0) + 1
    n = sum(counts.values())
    if set(counts) == {reg["spec_hash"]}:
        lines.append(f"Every one of the {n} runs of the record carries it"
                     + (f" (as amended: {reg['spec_hash']})." if reg["spec_hash"] != reg["first_hash"] else "."))
    else:
        parts = [f"{c} under {h}" + ("" if h in known else " (not a hash of this registration)")
                 for h, c in counts.items() if h is not None]
        if None in counts:
            predating = set(reg.get("predating") or ())
            before = sum(r["run_dir"] in predating for key in RUN_LISTS for r in record.get(key) or []
                         if r.get("spec_hash") is None)
            parts.append(f"{counts[None]} without a spec hash"
                         + (f" ({before} of them started before the spec was first registered)" if before else ""))
        lines.append(f"The {n} runs of the record do not all share one hash: {'; '.join(parts)}.")
    for c in reg.get("chain") or []:
        when = "after the seeded runs began" if c.get("after_seeded_runs") else "before the seeded runs began"
        lines.append(f"Amended {c['at']} ({when}): {c['old']} -> {c['new']}, changed {', '.join(c['changed'])}: "
                     f"{c['reason']}.")
    if reg.get("spec_file_changed"):
        lines.append("The spec file now differs from the registration in " + ", ".join(reg["spec_file_changed"])
                     + " (not amended: this report reads the record's spec, as registered).")
    return " ".join(lines)


def _seeds(spec) -> str:
    """The seeds as the spec gives them: a list, or a sequential design's first look and its cap."""
    if spec.sequential is None:
        return str(spec.seeds)
    d = spec.sequential
    return (f"{spec.seeds} first, then {d.step} more a look for the comparisons still open, up to {d.max} "
            "(sequential; each comparison's seeds are in the verdicts table)")


def _setup(ctx: Context) -> str:
    spec = ctx.spec
    kind, value = spec.budget.kind, spec.budget.value
    lines = [f"- Budget per run: {value:.3g} {'training FLOPs' if kind == 'flops' else 'tokens'}"
             + (" (equal training FLOPs: tokens = budget / the arm's FLOPs per token)" if kind == "flops" else "")
             + "; arms with their own budget say so below.",
             f"- Seeds: {_seeds(spec)} (`train.seed`: initial weights and data order; the corpus split is fixed)."
             + (" Quick mode: tiny models, a few steps: the numbers only show that the pipeline works."
                if spec.quick else ""),
             *([f"- Quick mode's own changes (beyond the spec's `quick:`): {'; '.join(spec.quick_defaults)}."]
               if spec.quick_defaults else []),
             f"- Every arm: `{' '.join(spec.set)}`" if spec.set else "- Every arm: the recipe as it is.",
             f"- Reference arm: `{ctx.reference}`."]
    if spec.grid:
        lines.append("- Grid (every arm, every seed): " + "; ".join(f"`{k}` in {v}" for k, v in spec.grid.items()))
    rows = []
    for a in ctx.arms.values():
        b = a.budget
        budget_text = (f"time of `{b.match_time_of}` at the speed of `{b.speed_of}`" if b.timed
                       else f"{b.value:.3g} {b.kind}")
        rows.append([f"`{a.name}`", a.label, f"`{a.parent}`" if a.parent else f"`{a.recipe}`",
                     " ".join(f"`{o}`" for o in a.own) or "-", budget_text, a.note])
    return "\n".join(lines) + "\n\n" + table(["arm", "label", "recipe or parent", "its overrides", "budget", "note"],
                                            rows)


def excluded_runs(ctx: Context) -> list[dict]:
    """Every run the analysis leaves out, with why: seeded runs that did not finish (not in the loss table or
    the verdicts), compute-curve branches that did not finish or stayed near the unigram loss (not in the
    curve's fit), tuning runs that diverged or did not learn (scored as the worst lr, not in the lr fit)."""
    out = []
    for r in ctx.rows:
        if r["status"] != "finished":
            out.append({"run": r["point"], "stage": "seeded", "arm": r["arm"], "seed": r["seed"],
                        "why": f"{r['status']}" + (f" ({r['reason']})" if r["reason"] else "")
                        + ": not in the loss table or the verdicts"})
    for r in ctx.curve_rows:
        if r["role"] != "ceg-cooldown":
            continue  # the trunks are not points of the curve, by design
        why = None
        if r["status"] != "finished":
            why = f"{r['status']}" + (f" ({r['reason']})" if r["reason"] else "")
        elif not r["learned"]:
            why = (unlearned_why(r["val_loss"], r["unigram_entropy"])
                   if _finite(r["val_loss"]) and _finite(r["unigram_entropy"])
                   else "no final loss to compare with the unigram entropy")
        if why:
            out.append({"run": r["point"], "stage": "compute curve", "arm": r["arm"], "seed": r["seed"],
                        "why": why + ": not in the curve's fit"})
    for arm, t in (ctx.record.get("tuning") or {}).items():
        for i, point in enumerate(t.get("runs") or []):
            flags = [name for name, key in (("diverged", "diverged"), ("did not learn", "did_not_learn"))
                     if i < len(t.get(key) or []) and t[key][i]]
            if flags:
                out.append({"run": point, "stage": "tuning", "arm": arm, "seed": None,
                            "why": f"{' and '.join(flags)} at lr {t['lrs'][i]:g}: scored as the worst lr, "
                                   "not in the lr fit"})
    return out


def unlearned_why(loss: float, unigram: float) -> str:
    """Why a run counts as not learned: its final loss is not ``LEARN_MARGIN`` nats below the unigram entropy
    (``analysis.experiments``: learned = loss < unigram - margin), with how far from it the loss is."""
    gap = loss - unigram
    where = f"{gap:.3f} nats above it" if gap >= 0 else f"only {-gap:.3f} nats below it"
    return (f"near-unigram: final loss {loss:.3f} is not {LEARN_MARGIN} nats below the unigram entropy "
            f"{unigram:.3f} ({where})")


def excluded_table(ctx: Context) -> str:
    rows = excluded_runs(ctx)
    if not rows:
        return "None: every run of every stage is in the analysis."
    return table(["run", "stage", "arm", "seed", "why"],
                 [[f"`{r['run']}`", r["stage"], f"`{r['arm']}`", "-" if r["seed"] is None else r["seed"], r["why"]]
                  for r in rows])


def runs_table(ctx: Context) -> str:
    rows = []
    for r in ctx.rows:
        rows.append([r["point"], r["seed"], r["status"] + (f" ({r['reason']})" if r["reason"] else ""),
                     f"{r['val_loss']:.4f}" if _finite(r["val_loss"]) else "-", fmt_count(r["tokens"]),
                     f"{r['elapsed_s']:.0f}" if _finite(r["elapsed_s"]) else "-",
                     fmt_count(r["tokens_per_s"]), fmt_bytes(r["peak_rss_bytes"])])
    return table(["run", "seed", "status", "final val loss", "tokens", "wall s", "tokens/s", "peak RSS"], rows)


def _json_group(g: Group) -> dict:
    return {"arm": g.arm, "label": g.label, "cell": g.cell, "loss": g.loss, "vs_reference": g.vs_reference,
            "vs_parent": g.vs_parent, "vs_compare": g.vs_compare, "costs": g.costs, "measured": g.measured(),
            "bench_tokens_per_s": g.bench_tokens_per_s,
            "seeds": {str(s): r["val_loss"] for s, r in g.runs.items()}}


def _relative(path: str) -> str:
    """A run folder relative to the working directory (the repository root) when it lies under it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


QUICK_NOTE = ("**Smoke test (`--quick`).** Tiny models trained for a few steps on a small corpus, one seed: this "
              "report shows that the pipeline runs end to end. Its losses, lrs and verdicts are not results.")


def report_title(spec) -> str:
    """The report's title; a quick run's says it is a smoke test."""
    title = spec.title or spec.name
    return f"Smoke test (--quick): {title}" if spec.quick else title


def write_report(record: dict, measures: dict, out: Path, command: str) -> dict:
    """Write report.md, report.json and the figures under ``out``; returns their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ctx = build_context(record, measures, out)
    if not ctx.spec.grid:  # a grid's cells are compared in their own sections (stability)
        ctx.comparison = ceg_report.compare(ctx)
    spec = ctx.spec
    cost = cpu_hours.cpu_hours(record, ctx.comparison)
    figures = []
    md = [f"# {report_title(spec)}", ""]
    if spec.quick:
        md += [f"{QUICK_NOTE}", ""]
    if spec.description:
        md += [spec.description.strip(), ""]
    if spec.claim:
        md += [f"**Claim checked.** {spec.claim.strip()}", ""]
    md += ["## Regenerate", "", "From the repository root (runs go under "
           f"`{spec.out}`, git-ignored; finished runs are skipped, interrupted ones resumed):", "", "```sh",
           command, "```", "", _wall_time(ctx), "", cpu_hours.text(cost), "", registration_text(record), "",
           "## Setup", "", _setup(ctx), ""]
    if spec.notes:
        md += [spec.notes.strip(), ""]
    sections_json = {}
    if not spec.grid:
        md += ["## Results", "", main_table(ctx), ""]
        embed = figure_md(figures, plot_losses(ctx, out / "val_loss.png"), "final validation loss per arm")
        md += [embed.strip(), ""] if embed else []
    for section in ([tuning_report.section(ctx)] + ([ceg_report.section(ctx)] if ctx.comparison else [])):
        md += [f"## {section.title}", "", section.markdown.strip(), ""]  # the stages' data: tuning, comparison
        figures += section.figures
    wanted = [MEASUREMENTS[name] for name in spec.wanted]
    for m in [m for m in wanted if not m.last] + [m for m in wanted if m.last]:  # in the spec's order
        section = m.section(ctx)
        md += [f"## {section.title}", "", section.markdown.strip(), ""]
        figures += section.figures
        sections_json[m.name] = section.data
    md += ["## Runs left out of the analysis", "", excluded_table(ctx), ""]
    md += ["## Every run", "", runs_table(ctx), ""]
    arms = [{**a.to_dict(), "costs": ctx.costs[name]} for name, a in ctx.arms.items()]
    data = {"experiment": spec.name, "command": command, "spec": record["spec"], "arms": arms,
            "runs": [{**r, "run_dir": _relative(r["run_dir"])} for r in ctx.rows],
            "groups": [_json_group(g) for g in ctx.groups.values()], "sections": sections_json,
            "tuning": record.get("tuning"), "tune_wall_s": record.get("tune_wall_s"), "comparison": ctx.comparison,
            "curve_runs": [{**r, "run_dir": _relative(r["run_dir"])} for r in ctx.curve_rows],
            "timed_budgets": record.get("timed_budgets"), "measure_wall_s": record.get("measure_wall_s"),
            "excluded_runs": excluded_runs(ctx), "registration": record.get("registration"), "figures": figures,
            "cpu_hours": cost}
    md_path = write_text_atomic(out / "report.md", "\n".join(md))
    json_path = write_json_atomic(out / "report.json", data)
    return {"markdown": md_path, "json": json_path, "figures": [out / f for f in figures],
            "unfinished": [r["point"] for r in ctx.rows if r["status"] not in ("finished", "diverged")]}
