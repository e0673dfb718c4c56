"""tools.experiment.stages.looks: a sequential spec is checked when it loads, `plan` lists its looks with the
worst-case runs, and a run adds seeds to exactly the arms of the comparisons its looks left unresolved."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from analysis import sequential
from tools.experiment import load_spec, main, read_record
from tools.experiment.stages import looks

QUICK = ["model.vocab_size=384", "data.max_bytes=150000", "model.d_model=32", "model.n_layers=2",
         "train.seq_len=32", "train.micro_batch_size=4", "train.eval_batches=2", "train.tensorboard=false",
         "train.warmup_steps=2"]


@pytest.fixture(autouse=True)
def _in_repo_root(root, monkeypatch):
    monkeypatch.chdir(root)


def _spec(tmp_path: Path, **over) -> str:
    spec = {"name": "seq", "budget": {"tokens": 4096}, "set": QUICK, "seeds": {"min": 3, "max": 4, "step": 1},
            "tune": {"shared": "the arms differ by their lr on purpose"}, "margin": {"nats": 1.0e-6},
            "arms": [{"name": "ref", "recipe": "recipes/llama/tiny.yaml", "set": ["train.lr=3e-3"]},
                     {"name": "slow", "extends": "ref", "set": ["train.lr=1e-3"]},
                     {"name": "same", "extends": "ref"},
                     {"name": "twin", "extends": "ref", "set": ["train.lr=3.0001e-3"]}], **over}
    path = tmp_path / "seq.yaml"
    path.write_text(json.dumps(spec))
    return str(path)


def test_the_design_replaces_the_seeds_with_its_first_look(tmp_path):
    spec = load_spec(_spec(tmp_path))
    assert spec.seeds == [0, 1, 2] and spec.sequential.stages == [3, 4]


@pytest.mark.parametrize("over, message", [
    ({"grid": {"model.d_model": [32, 48]}}, "with grid:"),
    ({"seeds": {"min": 3, "max": 2}}, "seeds.max=2: must exceed min=3"),
    ({"tune": {"lr": [1e-3, 3e-3], "seed": 3}}, "tune.seed=3"),
])
def test_bad_sequential_specs_are_refused(tmp_path, capsys, over, message):
    assert main(["plan", _spec(tmp_path, **over), "--out", str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err


def test_plan_lists_every_look_with_its_worst_case_runs(tmp_path, capsys):
    spec = load_spec(_spec(tmp_path, seeds={"min": 3, "max": 7, "step": 2}))
    spec = replace(spec, out=str(tmp_path / "out"))
    from tools.experiment import plan
    out = plan(spec, estimate=False)
    text = capsys.readouterr().out
    assert "looks at 3 seeds at 0.0" in text and "- look 3: seeds [5, 6]" in text
    assert out["stages"]["seeded runs, look 2 (worst case)"]["runs"] == 8  # 4 arms x seeds 3, 4
    assert out["stages"]["seeded runs, look 3 (worst case)"]["runs"] == 8


@pytest.mark.slow
def test_a_sequential_run_adds_seeds_only_where_a_comparison_is_open(tmp_path, monkeypatch):
    """Arms: `same` trains exactly the reference's runs (equivalent at look 1: every paired difference is 0);
    `slow` (3x lower lr) and `twin` (lr + 0.003%) differ. Look 1's level is set to 1e-12 so that only the
    exact tie resolves there: the run must then train seed 3 for ref, slow and twin, and not for same."""
    monkeypatch.setattr(sequential.Design, "levels", lambda self: [1e-12, self.alpha - 1e-12])
    out = tmp_path / "runs"
    assert main(["run", _spec(tmp_path), "--out", str(out), "--set", f"data.cache_dir={tmp_path / 'cache'}",
                 "--jobs", "2", "--threads", "1"]) == 0
    record = read_record(out)
    seeds: dict[str, set] = {}
    for r in record["runs"]:
        seeds.setdefault(r["arm"], set()).add(r["seed"])
    assert seeds == {"ref": {0, 1, 2, 3}, "slow": {0, 1, 2, 3}, "twin": {0, 1, 2, 3}, "same": {0, 1, 2}}
    assert {r["sweep"] for r in record["runs"] if r["seed"] == 3} == {looks.folder(2)}
    report = json.loads((out / "report" / "report.json").read_text())
    res = {a: v["verdict"] for a, v in report["comparison"]["arms"].items() if v.get("verdict")}
    assert res["same"]["class"] == "equivalent within the margin" and res["same"]["look"] == 1
    assert res["same"]["stopped"] == "resolved at look 1 (3 seeds)"
    assert res["slow"]["look"] == 2 and res["slow"]["class"] == "worse" and res["slow"]["seeds"] == [0, 1, 2, 3]
    assert res["twin"]["look"] == 2 and (res["twin"]["class"] != "unresolved"
                                         or res["twin"]["stopped"] == "cap: 4 seeds, unresolved")
    md = (out / "report" / "report.md").read_text()
    assert "group-sequential over seeds (pocock" in md and "resolved at look 1 (3 seeds)" in md
