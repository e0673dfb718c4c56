"""tools.experiment.stages.finetune and `budgets:`: the spec keys, every arm once per pre-training budget, and the
fine-tuning runs `plan` lists (one per arm and seed, ``train.init_from`` = that arm's pre-trained run of that
seed); the whole pipeline end to end with ``--quick`` (slow)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from archlab.config import RecipeError
from tools.experiment import load_spec, main, plan, planned_points, resolve_arms, sweep_spec
from tools.experiment.stages import finetune

FT = {"set": ["train.objective=classify", "train.objective.train_examples=64", "train.objective.eval_examples=32"],
      "budget": {"tokens": 2048}, "tune": {"lr": [1.0e-3, 3.0e-3]}}


@pytest.fixture(autouse=True)
def _in_repo_root(root, monkeypatch):
    monkeypatch.chdir(root)


def _spec(tmp_path: Path, **over) -> str:
    base = {"name": "t", "budgets": [{"tokens": 4096}, {"tokens": 8192}], "seeds": [0, 1],
            "set": ["train.eval_context_multipliers=[1]"],
            "arms": [{"name": "gpt", "recipe": "recipes/dense/tiny.yaml"},
                     {"name": "wide", "extends": "gpt", "set": ["model.d_model=128"]},
                     {"name": "side", "extends": "gpt", "side": True, "compare": "wide"}],
            "reference": "gpt", "tune": {"lr": [1.0e-3, 2.0e-3, 4.0e-3]}, "finetune": FT}
    path = tmp_path / "spec.yaml"
    path.write_text(json.dumps({**base, **over}))
    return str(path)


def test_budgets_give_every_arm_once_per_budget_with_its_relations_renamed(tmp_path):
    spec = load_spec(_spec(tmp_path))
    assert [a.name for a in spec.arms] == ["gpt-tok4096", "wide-tok4096", "side-tok4096",
                                           "gpt-tok8192", "wide-tok8192", "side-tok8192"]
    arms = {a.name: a for a in resolve_arms(spec)}
    assert arms["wide-tok8192"].parent == "gpt-tok8192" and arms["side-tok8192"].compare == "wide-tok8192"
    assert arms["gpt-tok8192"].budget.value == 8192 and spec.reference == "gpt-tok4096"
    assert spec.base_reference() == "gpt"
    groups = spec.budget_groups()
    assert [g[0] for g in groups] == ["tok4096", "tok8192"]
    assert groups[1][2] == {"gpt": "gpt-tok8192", "wide": "wide-tok8192", "side": "side-tok8192"}
    assert "finetune" in spec.wanted  # the fine-tuning stage's report section comes with it
    assert load_spec(_spec(tmp_path)).to_dict() == type(spec).from_dict(spec.to_dict()).to_dict()
    # a labelled arm's label names its budget (the same model twice in every table and figure otherwise)
    labelled = load_spec(_spec(tmp_path, arms=[{"name": "gpt", "label": "GPT", "recipe": "recipes/dense/tiny.yaml"}],
                               budgets=[{"tokens": 2.5e6}, {"tokens": 5.0e6}]))
    assert [a.label for a in labelled.arms] == ["GPT, 2.5M tokens", "GPT, 5M tokens"]


@pytest.mark.parametrize("over,message", [
    ({"budget": {"tokens": 4096}}, "not both"),
    ({"finetune": {**FT, "set": ["train.objective.pooling=mean"]}}, "name the fine-tuning objective"),
    ({"finetune": {**FT, "set": ["train.objective=classify", "train.init_from=x"]}}, "set per run by the stage"),
    ({"finetune": {**FT, "steps": 3}}, "unknown keys ['steps']"),
    ({"measurements": {"finetune": {"pairs": [["wide", "bert"]]}}}, "finetune.pairs names 'bert', not an arm"),
    ({"measurements": {"finetune": {"pairs": [["wide", "wide"]]}}}, "a list of [arm, against] pairs"),
    ({"finetune": {**FT, "tune": {"lr": [1e-3, 2e-3], "seed": 0}}}, "not one of seeds"),
    ({"finetune": FT, "grid": {"model.n_layers": [2, 4]}}, "no grid"),
])
def test_bad_finetune_specs_fail_naming_the_key(tmp_path, over, message):
    with pytest.raises(RecipeError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_spec(_spec(tmp_path, **over))


def test_finetune_tune_defaults_to_the_pretraining_tune_seed(tmp_path):
    spec = load_spec(_spec(tmp_path, tune={"lr": [1.0e-3, 2.0e-3], "seed": 77}))
    assert spec.finetune.tune.seed == 77 and spec.finetune.budget.value == 2048


def test_plan_lists_one_finetuning_run_per_arm_and_seed_from_that_seeds_pretrained_run(tmp_path):
    spec = dataclasses.replace(load_spec(_spec(tmp_path)), out=str(tmp_path / "out"))
    stages = plan(spec, log=lambda *a: None, estimate=False)["stages"]
    assert stages["fine-tuning runs"]["runs"] == 6 * 2
    assert stages["fine-tuning: tuning (starting grid)"]["runs"] == 6 * 2
    arms = resolve_arms(spec)
    seeded = {("gpt-tok8192", 1): str(tmp_path / "out" / "sweep" / "gpt-tok8192-seed1-tok8192")}
    sspec = finetune.sweep_spec(spec, [a for a in arms if a.name == "gpt-tok8192"],
                                           {"gpt-tok8192": 2.5e-3}, {**seeded, ("gpt-tok8192", 0): "p0"})
    ladder = sspec["ladders"]["gpt-tok8192-s1"]
    assert ladder["tokens"] == [2048.0] and sspec["out"] == str(tmp_path / "out" / "finetune" / "sweep")
    assert ladder["set"][-3:] == [f"train.init_from={seeded[('gpt-tok8192', 1)]}", "train.lr=0.0025", "train.seed=1"]
    assert "train.objective=classify" in ladder["set"]
    # the planned pre-training run folders are the ones the sweep writes
    names = {Path(p.run_dir).name for p in planned_points(sweep_spec(spec, arms, "sweep",
                                                                     {a.name: a.budget for a in arms}))}
    assert "gpt-tok8192-seed1-tok8192" in names


def test_tuning_starts_from_the_pretraining_tuning_run_at_the_best_grid_lr(tmp_path):
    arms = resolve_arms(load_spec(_spec(tmp_path)))[:2]
    runs = [{"arm": "gpt-tok4096", "lr": lr, "run_dir": f"t{lr}"} for lr in (1e-3, 2e-3, 4e-3)]
    inits = finetune.tuning_inits(arms, {"gpt-tok4096": {"grid_lr": 2e-3, "lr": 2.3e-3}}, runs,
                                             {("wide-tok4096", 0): "seeded0"}, 0)
    assert inits == {"gpt-tok4096": "t0.002", "wide-tok4096": "seeded0"}  # not searched: the first seed's run


@pytest.mark.slow
def test_quick_model_types_runs_end_to_end(tmp_path, root):
    out = tmp_path / "mt"
    assert main(["run", str(root / "experiments/model-types.yaml"), "--quick", "--out", str(out)]) == 0
    report = (out / "report" / "report.md").read_text()
    assert "Fine-tuned on the understanding tasks" in report and "Positive controls" in report
    for task in ("tag", "span_qa", "bound"):
        assert f"### `{task}`" in report and f"vs `gpt-tok8192-{task}`" in report
        assert f"| `bert-tok8192-{task}` vs `t5-tok8192-{task}` |" in report  # the spec's finetune pairs
    record = json.loads((out / "experiment.json").read_text())
    for r in record["finetune_runs"]:
        if r["control"]:
            assert r["init_from"] == "null" and r["arm"] == f"{r['base_arm']}-scratch-{r['task']}"
        else:
            assert Path(r["init_from"]).name.startswith(f"{r['base_arm']}-seed{r['seed']}-")
