"""The understanding tasks in an experiment's fine-tuning stage: each arm once per task, the fresh-init controls
once per base arm and task, and the report's section (controls and baselines beside the arms, verdicts of the
claims' comparisons with seed + item-sampling intervals)."""


import numpy as np

from analysis import finetune_tasks
from analysis.experiment_spec import Arm, Budget, Finetune, Tune
from tools.experiment import load_spec

B1, B2 = Budget("tokens", 1e6), Budget("tokens", 2e6)


def _arm(name: str) -> Arm:
    return Arm(name=name, label=name, recipe="r.yaml", overrides=["a=1"], own=[])


def test_each_arm_once_per_task_and_a_fresh_init_control_per_base_arm():
    ft = Finetune(set=["train.eval_every=20"], budget=Budget("tokens", 4e5), tune=Tune(lr=[1e-3]),
                  tasks=["tag", "bound"], controls=True)
    arms = [_arm(n) for n in ("gpt-tok1e6", "bert-tok1e6", "gpt-tok2e6", "bert-tok2e6")]
    seeded = {(a.name, s): f"runs/{a.name}-s{s}" for a in arms for s in (0, 1)}
    out, runs, meta = ft.expand(arms, seeded, [B1, B2])
    names = [a.name for a in out]
    assert "bert-tok2e6-tag" in names and "gpt-scratch-bound" in names and len(names) == 2 * (4 + 2)
    arm = next(a for a in out if a.name == "bert-tok2e6-tag")
    assert arm.overrides == ["a=1", "train.objective=tag"]
    assert runs[("bert-tok2e6-tag", 1)] == "runs/bert-tok2e6-s1" and runs[("bert-scratch-tag", 0)] == "null"
    assert meta["gpt-scratch-bound"] == {"base_arm": "gpt", "task": "bound", "control": True}
    assert Finetune.from_dict(ft.to_dict()) == ft
    plain = Finetune(set=["train.objective=classify"], budget=B1, tune=Tune(lr=[1e-3]))
    assert plain.expand(arms, seeded, [B1, B2])[0] == arms and "tasks" not in plain.to_dict()


def _scores(rng, rate, docs=60):
    n = rng.integers(50, 100, size=docs)
    c = rng.binomial(n, rate)
    return {"task": "tag", "accuracy": float(c.sum() / n.sum()), "items": int(n.sum()), "docs": list(range(docs)),
            "correct_D": c.tolist(), "counted_D": n.tolist(), "step": 40, "still_falling": False, "chance": 0.17,
            "baseline": 0.58, "baseline_rule": "each token id's most frequent role", "model_type": "encoder"}


def test_the_section_reports_arms_controls_baseline_and_the_claims_comparisons(root):
    spec = load_spec(str(root / "experiments/model-types.yaml"))
    rng = np.random.default_rng(0)
    rates = {"gpt": 0.60, "bert": 0.75, "t5": 0.70, "bert-postln": 0.74}
    results = [{"arm": f"{base}-{tag}-tag", "seed": s, "lr": 1e-3, "task": "tag",
                "result": _scores(rng, rates[base] + 0.005 * s)}
               for tag in ("tok500000", "tok1e6") for base in rates for s in (0, 1, 2)]
    results += [{"arm": f"{base}-scratch-tag", "seed": s, "lr": 3e-3, "task": "tag", "control": True,
                 "result": _scores(rng, 0.65)} for base in rates for s in (0, 1, 2)]
    s = finetune_tasks.summarise(spec, results, 0.02, [("bert", "t5")])
    verdicts = {(v["arm"], v["against"]): v for v in s["verdicts"]}
    assert len(verdicts) == 2 * 4  # per budget: bert, t5 vs gpt; post-LN vs pre-LN BERT; bert vs t5
    assert verdicts[("bert-tok1e6-tag", "gpt-tok1e6-tag")]["class"] == "better"
    assert verdicts[("bert-postln-tok1e6-tag", "bert-tok1e6-tag")]["against"] == "bert-tok1e6-tag"
    task = s["tasks"]["tag"]
    assert len(task["controls"]) == 4 and task["baseline"] == 0.58
    md = finetune_tasks.markdown(s, {"gpt": "GPT"})
    assert "### `tag`" in md and "Positive controls" in md and "`gpt-scratch-tag` (fresh init)" in md
    assert "seeds + items" in md
    assert "| `bert-tok1e6-tag` vs `t5-tok1e6-tag` |" in md  # the pair in its own table
    bert_row = next(line for line in md.splitlines() if line.startswith("| bert (`bert-tok1e6-tag`)"))
    assert "vs `gpt-tok1e6-tag`" in bert_row  # the arm's row: against the reference
