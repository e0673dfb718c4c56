"""The fine-tuning stage's report on the understanding tasks (``finetune: {tasks: [tag, span_qa, bound]}``): per
task and pre-training budget each arm's test accuracy at its dev-best checkpoint, the positive controls beside
them (each architecture fine-tuned from a fresh init; the task's simple baseline), and the comparisons of the
claims, decided by :func:`analysis.task_scores.decide` (intervals with seed and item-sampling error, Holm over
every comparison of every task and budget, a margin in accuracy points).
"""

from __future__ import annotations

from analysis.experiment_spec import Spec
from analysis.experiments import table
from analysis.task_scores import combined_interval, decide

DEFAULT_MARGIN = 0.02  # accuracy points (a share of the items)


def _fmt(iv: dict, signed: bool = False) -> str:
    if not iv or iv.get("mean") is None:
        return "-"
    f = "{:+.3f}" if signed else "{:.3f}"
    return f"{f.format(iv['mean'])} [{f.format(iv['low'])}, {f.format(iv['high'])}]"


def by_task(results: list[dict]) -> dict[str, dict[str, dict[int, dict]]]:
    """{task: {fine-tuning arm: {seed: run_scores}}} of the measured understanding-task runs."""
    out: dict[str, dict[str, dict[int, dict]]] = {}
    for r in results:
        if r.get("task"):
            out.setdefault(r["task"], {}).setdefault(r["arm"], {})[int(r["seed"])] = {**r["result"], "lr": r.get("lr")}
    return out


def comparisons(spec: Spec, task: str, runs: dict[str, dict[int, dict]], pairs=()) -> list[dict]:
    """Per budget: each arm against the budget's reference (a side arm against its ``compare:`` arm), then each of
    ``pairs``; the fine-tuning arms of ``task`` (``<arm>-<task>``)."""
    ref_base = spec.base_reference()
    compare = {a.name: a.compare for a in spec.arms if a.compare}
    out = []
    for tag, _, arms in spec.budget_groups():
        named = [(b, n, compare.get(n) or arms.get(ref_base)) for b, n in arms.items()]
        named += [(b, arms.get(b), arms.get(o)) for b, o in pairs]
        for base, name, other in named:
            a, o = f"{name}-{task}", f"{other}-{task}"
            if name and other and name != other and a in runs and o in runs:
                out.append({"task": task, "tag": tag, "arm": a, "against": o, "base": base,
                            "arm_runs": runs[a], "other_runs": runs[o]})
    return out


def summarise(spec: Spec, results: list[dict], margin: float = DEFAULT_MARGIN, pairs=()) -> dict:
    """{tasks: {task: {groups, controls}}, verdicts, margin} of the understanding-task runs."""
    tasks = by_task(results)
    comps = [c for task, runs in tasks.items() for c in comparisons(spec, task, runs, pairs)]
    verdicts = decide(comps, margin) if comps else []
    out = {}
    for task, runs in tasks.items():
        groups = []
        for tag, budget, arms in spec.budget_groups():
            rows = [_row(f"{name}-{task}", base, runs) for base, name in arms.items() if f"{name}-{task}" in runs]
            if rows:
                groups.append({"tag": tag, "budget": budget.to_dict() if budget else spec.budget.to_dict(),
                               "arms": rows})
        controls = [_row(arm, arm.split("-scratch-")[0], seeds_runs) for arm, seeds_runs in runs.items()
                    if "-scratch-" in arm]
        first = next(iter(next(iter(runs.values())).values()))
        out[task] = {"groups": groups, "controls": controls, "baseline": first["baseline"],
                     "baseline_rule": first["baseline_rule"], "chance": first["chance"], "items": first["items"]}
    return {"tasks": out, "verdicts": verdicts, "margin": margin}


def _row(arm: str, base: str, runs: dict[str, dict[int, dict]]) -> dict:
    res = runs[arm] if isinstance(runs, dict) and arm in runs else runs
    first = next(iter(res.values()))
    return {"arm": arm, "base": base, "seeds": sorted(res), "accuracy": combined_interval(res), "lr": first.get("lr"),
            "still_falling": sum(bool(r["still_falling"]) for r in res.values()),
            "steps": sorted({int(r["step"]) for r in res.values()}), "model_type": first["model_type"]}


def markdown(s: dict, label: dict) -> str:
    """The section's text: the decision rule, per task the budgets' tables, the controls, the verdicts."""
    md = ("Each arm's pre-trained run of seed s fine-tuned (seed s) on each understanding task with the model type's "
          "own head (per-token heads for `tag` and `span_qa`; `bound` reads GPT's last state, BERT's first, T5's "
          "encoder mean), at the arm's own tuned lr, and scored on the task's test split at the checkpoint of lowest "
          "dev loss (early stopping). Intervals: 95%, seed variance / n + the document bootstrap's variance of the "
          "seed mean (test items sampled), t on n - 1 degrees of freedom. Comparisons: paired by seed, on the same "
          f"test documents; Holm over all {len(s['verdicts'])} comparisons of every task and budget, each interval at "
          f"its Holm level; better / worse: it excludes 0; equivalent: inside +-{s['margin']:g}; else unresolved, "
          "with the seeds it would need if its mean and variances held ('items' where the test items' error "
          "alone keeps it open). Positive controls: the same architecture fine-tuned from a fresh init, and the "
          "task's simple baseline.\n\n")
    by_arm: dict[str, dict] = {}
    for v in s["verdicts"]:
        by_arm.setdefault(v["arm"], v)  # an arm's own comparison (against the reference or its compare: arm) first
    for task, t in s["tasks"].items():
        md += (f"### `{task}` ({t['items']:,} test items; chance {t['chance']:.3f}; baseline {t['baseline']:.3f}: "
               f"{t['baseline_rule']})\n\n")
        for g in t["groups"]:
            rows = []
            for a in g["arms"]:
                v = by_arm.get(a["arm"])
                rows.append([label.get(a["base"], a["base"]) + f" (`{a['arm']}`)", _fmt(a["accuracy"]),
                             "-" if v is None else f"vs `{v['against']}`: {_fmt(v['interval'], signed=True)}",
                             "-" if v is None else v["class"] + (f" ({v['seeds_needed']} seeds)" if v["seeds_needed"]
                                                                 else " (items)" if v["class"] == "unresolved" else ""),
                             "-" if a["lr"] is None else f"{a['lr']:.3g}", ", ".join(map(str, a["steps"])),
                             f"{a['still_falling']} of {len(a['seeds'])}"])
            pair_rows = [[f"`{v['arm']}` vs `{v['against']}`", _fmt(v["interval"], signed=True), v["class"]]
                         for v in s["verdicts"] if v["task"] == task and v["tag"] == g["tag"]
                         and by_arm.get(v["arm"]) is not v]
            md += (f"**Pre-training budget {next(iter(g['budget'].values())):.3g} {next(iter(g['budget']))}**\n\n"
                   + table(["arm", "test accuracy [95%: seeds + items]", "difference (Holm level)", "verdict",
                            "fine-tuning lr", "dev-best steps", "dev loss still falling"], rows) + "\n\n")
            if pair_rows:
                md += table(["pair", "difference (Holm level)", "verdict"], pair_rows) + "\n\n"
        rows = [[f"`{c['arm']}` (fresh init)", _fmt(c["accuracy"]), "-" if c["lr"] is None else f"{c['lr']:.3g}",
                 f"{c['still_falling']} of {len(c['seeds'])}"] for c in t["controls"]]
        rows.append([f"baseline: {t['baseline_rule']}", f"{t['baseline']:.3f}", "-", "-"])
        rows.append(["chance", f"{t['chance']:.3f}", "-", "-"])
        md += "**Positive controls**\n\n" + table(["control", "test accuracy [95%]", "lr", "dev loss still falling"],
                                                  rows) + "\n\n"
    return md
