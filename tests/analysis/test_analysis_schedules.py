"""analysis.schedules: cooldown branches paired with full-schedule runs of the same model and length."""

import json

from analysis.runs import expand_inputs
from analysis.schedules import main, pair_runs
from tests.analysis.conftest import write_fake_run

RECIPE = "recipes/dense/tiny.yaml"
SMALL = ["model.d_model=32", "model.n_layers=2", "model.vocab_size=384"]


def _sweep(tmp_path):
    """Two lengths: a cosine run and a cooldown branch each; a stable trunk; an unpaired branch of
    another model; a cooldown branch of a length with no full run."""
    for tokens, full, cd in ((1000, 5.0, 4.9), (2000, 4.5, 4.55)):
        write_fake_run(tmp_path / f"full-{tokens}", RECIPE, [*SMALL, f"train.max_steps={tokens // 10}"],
                       tokens=tokens, loss=full, summary_extra={"role": "full"})
        write_fake_run(tmp_path / f"cd-{tokens}", RECIPE,
                       [*SMALL, "train.schedule=wsd", "train.decay_steps=5", "train.decay_shape=sqrt",
                        f"train.max_steps={tokens // 10}"],
                       tokens=tokens, loss=cd, summary_extra={"role": "cooldown", "branch_step": tokens // 10 - 5})
    write_fake_run(tmp_path / "stable", RECIPE, [*SMALL, "train.schedule=constant"], tokens=1800, loss=4.8,
                   summary_extra={"role": "stable"})
    write_fake_run(tmp_path / "cd-other-model", RECIPE, [*SMALL[:-1], "model.vocab_size=512", "train.schedule=wsd"],
                   tokens=1000, loss=4.0, summary_extra={"role": "cooldown", "branch_step": 95})
    write_fake_run(tmp_path / "cd-3000", RECIPE, [*SMALL, "train.schedule=wsd"], tokens=3000, loss=4.2,
                   summary_extra={"role": "cooldown", "branch_step": 295})


def test_branches_pair_with_the_full_run_of_the_same_model_and_length(tmp_path):
    _sweep(tmp_path)
    runs, _ = expand_inputs([str(tmp_path)])
    rows, notes = pair_runs(runs)
    assert [(r["cooldown_run"], r["full_run"]) for r in rows] == [("cd-1000", "full-1000"), ("cd-2000", "full-2000")]
    assert [round(r["cooldown_minus_full"], 6) for r in rows] == [-0.1, 0.05]
    assert rows[0]["decay_shape"] == "sqrt" and rows[0]["full_schedule"] == "cosine" and rows[0]["branch_step"] == 95
    assert sorted(n.split(":")[0] for n in notes) == ["cd-3000", "cd-other-model"]  # unpaired, named
    assert not any("stable" in (r["cooldown_run"], r["full_run"]) for r in rows)


def test_cli_writes_the_table_json_and_plot(tmp_path, capsys):
    _sweep(tmp_path / "runs")
    assert main([str(tmp_path / "runs"), "--out", str(tmp_path / "out")]) == 0
    report = json.loads((tmp_path / "out" / "schedules.json").read_text())
    assert len(report["pairs"]) == 2
    md = (tmp_path / "out" / "schedules.md").read_text()
    assert "| dense | 1e+03 |" in md and "-0.1000" in md and "+0.0500" in md
    assert (tmp_path / "out" / "schedules.png").stat().st_size > 10_000
    assert main([str(tmp_path / "missing")]) == 2
