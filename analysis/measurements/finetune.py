"""``finetune: {margin, pairs}``: the fine-tuned runs of the spec's fine-tuning stage
(``tools.experiment.stages.finetune``) scored on the labelled task's test split, and compared per pre-training budget.

Each fine-tuned run (record ``finetune_runs``) is loaded and scored on the test examples
(``archlab.objectives.classify.score``: cross-entropy in nats and accuracy), with the task's chance and majority
baselines; cached under ``<out>/measurements/finetune/``. The report, per pre-training budget (``budgets:``): each
arm's test accuracy and loss (mean and 95% t-interval over seeds), and each arm against the reference arm of that
budget (an arm that names a ``compare:`` arm against that arm instead), then each of ``pairs`` (``[[bert, t5]]``:
arm names without the budget's suffix, compared within each budget), paired by seed (the fine-tuned runs of seed
s start from the pre-trained runs of seed s). The verdict reads
the test loss difference (nats, lower is better), one inference per comparison (``analysis.verdicts.family``
without a compute curve: paired t and TOST within +-``margin`` nats, default 0.02), Holm over every comparison of
the section (all budgets: one family); its interval is at the Holm level. The accuracy difference beside it is a
plain 95% paired t-interval (descriptive). Both intervals hold a known difference in 94-96% of simulated studies at
3 and 5 seeds, seed luck independent or shared between the arms (tests/analysis/test_analysis_finetune.py). Then
the trend: each arm's accuracy and loss difference across budgets.
"""

from __future__ import annotations

import math
from pathlib import Path

from analysis import finetune_tasks, verdicts
from analysis.experiment_spec import Spec
from analysis.experiments import Context, Section, errbar, figure_md, fmt_ci, paired_difference, t_interval, table
from analysis.measurements.base import Measurement, cached, measurement_folder, register
from analysis.plotting import COLORS, pyplot, save_figure, style_axes
from analysis.task_scores import run_scores
from archlab.checkpoints import resolve_checkpoint
from archlab.errors import RecipeError
from archlab.model.classifier import pooling_for
from archlab.objectives import objective_for
from archlab.objectives.classify import score
from archlab.train.checkpoint import load_recipe_of, load_weights_into

DEFAULT_MARGIN = 0.02  # nats of the task's cross-entropy


def budget_text(b: dict) -> str:
    """{'tokens': 2.5e6} -> '2.5e+06 tokens'."""
    kind, value = next(iter(b.items()))
    return f"{float(value):.3g} {kind}"


def test_scores(run_dir: str | Path) -> dict:
    """{loss, accuracy, examples, baselines, pooling, model_type} of a fine-tuned run on the test split."""
    ckpt = resolve_checkpoint(str(run_dir))
    cfg = load_recipe_of(ckpt)
    objective = objective_for(cfg)
    data = objective.prepare_data(cfg)
    model = objective.build_model(cfg)
    load_weights_into(model, ckpt)
    e = data.examples["test"]
    return {**score(model, e.x, e.y), "baselines": data.meta["baselines"]["test"],
            "pooling": pooling_for(cfg.model, cfg.train.objective.get("pooling")), "model_type": str(cfg.model.type)}


def _comparison(name: str, other: str, tag: str, base: str, by_arm: dict[str, dict[int, dict]],
                pair: bool = False) -> dict:
    """The inputs of ``verdicts.family`` for ``name`` against ``other`` (per-seed test losses), with ``tag``,
    ``base``, ``pair`` (one of the measurement's ``pairs``) and the paired per-seed accuracy difference."""
    mine, theirs = by_arm[name], by_arm[other]
    return {"arm": name, "against": other, "tag": tag, "base": base, "pair": pair,
            "arm_losses": {s: r["loss"] for s, r in mine.items()},
            "other_losses": {s: r["loss"] for s, r in theirs.items()},
            "arm_compute": {s: 1.0 for s in mine}, "other_compute": {s: 1.0 for s in theirs},
            "accuracy": paired_difference({s: r["accuracy"] for s, r in mine.items()},
                                          {s: r["accuracy"] for s, r in theirs.items()})}


def budget_comparisons(spec: Spec, by_arm: dict[str, dict[int, dict]], pairs=()) -> list[dict]:
    """Per pre-training budget: each arm against that budget's reference arm, an arm that names a ``compare:`` arm
    against that arm instead (a side arm answers its own question: post-LN BERT against pre-LN BERT), then each
    of ``pairs`` ([arm, against], names without the budget's suffix). The inputs of ``verdicts.family``."""
    ref_base = spec.base_reference()
    compare = {a.name: a.compare for a in spec.arms if a.compare}
    out = []
    for tag, _, arms in spec.budget_groups():
        ref = arms.get(ref_base)
        for base, name in arms.items():
            other = compare.get(name, ref)
            if name != other and name in by_arm and other in by_arm:
                out.append(_comparison(name, other, tag, base, by_arm))
        for base, against in pairs:
            if arms.get(base) in by_arm and arms.get(against) in by_arm:
                out.append(_comparison(arms[base], arms[against], tag, base, by_arm, pair=True))
    return out


def summarise(spec: Spec, results: list[dict], margin: float = DEFAULT_MARGIN, pairs=()) -> dict:
    """{groups: [{tag, budget, reference, arms: [{arm, base, accuracy, loss, baselines, pooling, lr}]}],
    verdicts: [the family (:func:`budget_comparisons`), Holm over every budget's comparisons]} from the cached
    test scores."""
    by_arm: dict[str, dict[int, dict]] = {}
    for r in results:
        by_arm.setdefault(r["arm"], {})[int(r["seed"])] = {**r["result"], "lr": r.get("lr")}
    comps = budget_comparisons(spec, by_arm, pairs)
    fam = verdicts.family(None, {}, comps, {verdicts.LN_CEG: None, verdicts.NATS: (-margin, margin),
                                            "from": f"+-{margin:g} nats"}) if comps else []
    for r, c in zip(fam, comps):
        r.update(tag=c["tag"], base=c["base"], accuracy=c["accuracy"], pair=c["pair"])
    groups = []
    ref_base = spec.base_reference()
    for tag, budget, arms in spec.budget_groups():
        rows = []
        for base, name in arms.items():
            res = by_arm.get(name)
            if not res:
                continue
            first = next(iter(res.values()))
            rows.append({"arm": name, "base": base, "seeds": sorted(res),
                         "accuracy": t_interval([x["accuracy"] for x in res.values()]),
                         "loss": t_interval([x["loss"] for x in res.values()]),
                         "baselines": first["baselines"], "pooling": first["pooling"], "lr": first.get("lr"),
                         "model_type": first["model_type"]})
        if rows:
            groups.append({"tag": tag, "budget": budget.to_dict() if budget else spec.budget.to_dict(),
                           "reference": arms.get(ref_base), "arms": rows})
    return {"groups": groups, "verdicts": fam, "margin": margin}


@register
class FinetuneMeasurement(Measurement):
    """The fine-tuned runs on the labelled task's test split, per pre-training budget."""

    name = "finetune"
    title = "Fine-tuned on the labelled task: test accuracy and loss per pre-training budget"
    keys = ("margin", "pairs")

    def check(self, settings, where: str) -> dict:
        s = super().check(settings, where)
        m = s.get("margin")
        if m is not None and not (isinstance(m, (int, float)) and not isinstance(m, bool) and m > 0):
            raise RecipeError(f"{where}.margin={m!r}: a positive number of nats")
        pairs = s.get("pairs")
        if "pairs" in s and not (isinstance(pairs, list) and all(
                isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) and x for x in p) and p[0] != p[1]
                for p in pairs)):
            raise RecipeError(f"{where}.pairs={pairs!r}: a list of [arm, against] pairs of two arms' names (without "
                              "the budget's suffix), e.g. [[bert, t5]]")
        return s

    loads_checkpoints = True

    def _scored(self, record: dict) -> list[tuple[dict, Path]]:
        """(run, cache file) of every finished fine-tuning run."""
        folder = measurement_folder(record) / self.name
        return [(run, folder / f"{run['point']}.json") for run in record.get("finetune_runs") or []
                if (Path(run["run_dir"]) / "summary.json").is_file()]

    def checkpoints(self, record: dict) -> dict[str, Path]:
        return {run["run_dir"]: path for run, path in self._scored(record)}

    def run(self, record: dict, log=print) -> list[dict]:
        out = []
        for run, path in self._scored(record):
            if not path.is_file():
                log(f"finetune: scoring {run['point']} on the test split")
            task = run.get("task")
            result = cached(path, {"run_dir": run["run_dir"], **({"scorer": "dev-best"} if task else {})},
                            (lambda r=run: run_scores(r["run_dir"])) if task else
                            (lambda r=run: test_scores(r["run_dir"])))
            out.append({"arm": run["arm"], "seed": run["seed"], "point": run["point"], "lr": run.get("lr"),
                        "task": task, "control": bool(run.get("control")), "result": result})
        return out

    def section(self, ctx: Context) -> Section:
        spec = ctx.spec
        settings = self.settings(ctx.record)
        margin = float(settings.get("margin", DEFAULT_MARGIN))
        label = {n: a.label for n, a in ctx.arms.items()}
        pairs = [tuple(p) for p in settings.get("pairs", [])]
        results = ctx.measures.get(self.name) or []
        if any(r.get("task") for r in results):  # the understanding tasks (finetune: {tasks: [...]})
            st = finetune_tasks.summarise(spec, results, margin, pairs)
            base_label = {b: a.label for _, _, arms in spec.budget_groups() for b, n in arms.items()
                          for a in [ctx.arms.get(n)] if a is not None}
            return Section("Fine-tuned on the understanding tasks: test accuracy per task and pre-training budget",
                           finetune_tasks.markdown(st, base_label) + tuning_table(ctx.record, label, two_way=False),
                           [], st)
        s = summarise(spec, results, margin, pairs)
        by_arm = {v["arm"]: v for v in s["verdicts"] if not v["pair"]}  # each arm's own comparison
        md = (f"Each arm's pre-trained run of seed s fine-tuned (seed s, the arm's own fine-tuning lr, "
              f"`{' '.join(spec.finetune.set) if spec.finetune else ''}`) and scored on the task's test examples. "
              "Intervals: 95% t over seeds. Each arm against the reference of the same budget (a side arm against "
              "its `compare:` arm, named in its cell), paired by seed: the verdict "
              f"reads the test loss difference (nats, lower is better; TOST margin +-{margin:g} nats), Holm over "
              f"all {len(s['verdicts'])} comparisons of this section, its interval at the Holm level; the accuracy "
              "difference is a 95% paired t-interval (descriptive).\n\n")
        for g in s["groups"]:
            base = g["arms"][0]["baselines"]
            md += (f"**Pre-training budget {budget_text(g['budget'])}** (chance {base['chance']:.3f}, majority "
                   f"{base['majority']:.3f} on the test split)\n\n")
            rows = []
            for a in g["arms"]:
                v = by_arm.get(a["arm"])
                named = "" if v is None or v["against"] == g["reference"] else f"vs `{v['against']}`: "
                vs = ("reference" if a["arm"] == g["reference"] else "-" if v is None else
                      f"{named}{verdicts.fmt_interval(v)} / {fmt_ci(v['accuracy'], signed=True)}")
                rows.append([f"{label.get(a['arm'], a['arm'])} (`{a['arm']}`)", a["pooling"],
                             "-" if a["lr"] is None else f"{a['lr']:.3g}", fmt_ci(a["accuracy"]), fmt_ci(a["loss"]),
                             vs, v["class"] if v else "-", len(a["seeds"])])
            md += table(["arm", "pooling", "fine-tuning lr", "test accuracy [95% CI]", "test loss (nats) [95% CI]",
                         f"vs `{g['reference']}`: loss (Holm level) / accuracy (paired)", "verdict (loss, Holm)",
                         "seeds"], rows) + "\n\n"
            pairs = [v for v in s["verdicts"] if v["pair"] and v["tag"] == g["tag"]]
            if pairs:
                md += table(["pair", "loss (Holm level) / accuracy (paired)", "verdict (loss, Holm)"],
                            [[f"`{v['arm']}` vs `{v['against']}`",
                              f"{verdicts.fmt_interval(v)} / {fmt_ci(v['accuracy'], signed=True)}", v["class"]]
                             for v in pairs]) + "\n\n"
        if len(s["groups"]) > 1:
            md += ("**Across pre-training budgets** (accuracy mean; loss difference to the reference, a side arm's to "
                   "its `compare:` arm, nats)\n\n")
            bases = list(dict.fromkeys(a["base"] for g in s["groups"] for a in g["arms"]))
            rows = []
            for b in bases:
                cells = []
                for g in s["groups"]:
                    a = next((x for x in g["arms"] if x["base"] == b), None)
                    v = by_arm.get(a["arm"]) if a else None
                    acc = "-" if a is None or a["accuracy"]["mean"] is None else f"{a['accuracy']['mean']:.3f}"
                    cells.append(acc + ("" if v is None or v["mean"] is None else f"; {v['mean']:+.3f} ({v['class']})"))
                rows.append([f"`{b}`", *cells])
            md += table(["arm", *[budget_text(g["budget"]) for g in s["groups"]]], rows) + "\n\n"
        md += tuning_table(ctx.record, label)
        figures: list[str] = []
        md += figure_md(figures, plot_trend(s, ctx.out / "finetune.png"), "fine-tuned test accuracy per budget")
        return Section(self.title, md, figures, s)


def tuning_table(record: dict, label: dict, two_way: bool = True) -> str:
    """Each arm's fine-tuning lr grid (the tuning of ``tools.experiment.stages.finetune``, in the record): the
    validation loss at each lr, the lr chosen and whether the grid brackets it; a loss at or above ln 2 is marked:
    on a balanced two-way task such a run is no better than predicting 0.5."""
    tuned = record.get("finetune_tuning") or {}
    if not tuned:
        return ""
    inits = record.get("finetune_tune_inits") or {}
    rows = []
    for arm, t in tuned.items():
        losses = ", ".join("diverged" if d else "-" if v is None else
                           f"{v:.3f}" + (" (>= ln 2)" if two_way and v >= math.log(2) else "")
                           for v, d in zip(t["losses"], t["diverged"]))
        where = "bracketed" if t["bracketed"] else "at the edge of the grid, extension limit hit"
        rows.append([f"{label.get(arm, arm)} (`{arm}`)", f"`{Path(inits[arm]).name}`" if arm in inits else "-",
                     ", ".join(f"{lr:g}" for lr in t["lrs"]), losses, f"**{t['lr']:.3g}**", where])
    return ("**Fine-tuning lr, tuned per arm** (one fine-tuning run per lr from the arm's best pre-training tuning "
            "run, at the tuning seed; scored on the task's validation loss, chosen as the pre-training lr is; "
            + (f"chance: ln 2 = {math.log(2):.3f} nats)\n\n" if two_way else "the dev loss at the run's end)\n\n")
            + table(["arm", "fine-tuned from", "lrs tried", "validation loss at each lr (nats)", "chosen lr", "where"],
                    rows) + "\n\n")


def plot_trend(s: dict, path):
    """Test accuracy (95% CI over seeds) against the pre-training budget, one line per arm (the arms side by side
    around each budget, so that their intervals do not hide one another)."""
    groups = s["groups"]
    if not groups:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8.5, 4.2))
    xs = [float(next(iter(g["budget"].values()))) for g in groups]
    log = len(xs) > 1 and min(xs) > 0 and not math.isclose(min(xs), max(xs))
    bases = list(dict.fromkeys(a["base"] for g in groups for a in g["arms"]))
    for i, b in enumerate(bases):
        shift = (i - (len(bases) - 1) / 2) * 0.025  # a few percent of a decade (or of the budget) per arm
        pts = [(x * 10 ** shift if log else x * (1 + shift), a) for x, g in zip(xs, groups) for a in g["arms"]
               if a["base"] == b and a["accuracy"]["mean"] is not None]
        if not pts:
            continue
        err = [errbar(a["accuracy"]) or [[0.0], [0.0]] for _, a in pts]
        ax.errorbar([x for x, _ in pts], [a["accuracy"]["mean"] for _, a in pts],
                    yerr=[[e[0][0] for e in err], [e[1][0] for e in err]], fmt="o-", capsize=4,
                    color=COLORS[i % len(COLORS)], label=b)
    base = groups[0]["arms"][0]["baselines"]
    ax.axhline(base["majority"], color="grey", ls="--", lw=1, label="majority (= chance)"
               if math.isclose(base["majority"], base["chance"]) else "majority")
    if log:
        ax.set_xscale("log")
    ax.set_xticks(xs, [budget_text(g["budget"]) for g in groups])
    ax.minorticks_off()
    style_axes(ax, "Fine-tuned test accuracy against pre-training budget", f"pre-training budget "
               f"({next(iter(groups[0]['budget']))})", "test accuracy (95% CI over seeds)", legend=False)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    return save_figure(fig, path)
