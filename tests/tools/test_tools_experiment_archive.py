"""tools.experiment archive / restore: an experiment trained in one folder, archived without checkpoints and restored
into another, reports the same numbers there without training anything; bad folders are refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.experiment import archive, load_spec, main
from tools.experiment.archive import archive_experiment, restore_experiment

FT = {"set": ["train.objective=classify", "train.objective.train_examples=64", "train.objective.eval_examples=32",
              "train.eval_batches=2"],
      "budget": {"tokens": 2048}, "tune": {"lr": [1.0e-3, 3.0e-3], "max_extend": 0}}


@pytest.fixture(autouse=True)
def _in_repo_root(root, monkeypatch):
    monkeypatch.chdir(root)  # specs name recipes relative to the repository root


def _spec(tmp_path: Path) -> str:
    """One arm at one budget, one seed, its lr and its fine-tuning lr tuned, the cloze measured: every stage that
    archives something, six tiny runs."""
    spec = {"name": "t", "budgets": [{"tokens": 4096}], "seeds": [0], "set": ["train.eval_context_multipliers=[1]"],
            "arms": [{"name": "gpt", "recipe": "recipes/dense/tiny.yaml", "set": ["model.vocab_size=1017"]}],
            "tune": {"lr": [1.0e-3, 3.0e-3], "max_extend": 0}, "finetune": FT,
            "measurements": {"cloze": {"windows": 16}}}
    path = tmp_path / "spec.yaml"
    path.write_text(json.dumps(spec))
    return str(path)


def _numbers(report: Path, out: Path) -> dict:
    """report.json with its runs folder's path taken out and the measuring time (of the invocation) dropped."""
    data = json.loads(report.read_text().replace(str(out.resolve()), "OUT"))
    data.pop("measure_wall_s", None)
    return data


@pytest.mark.slow
def test_a_restored_experiment_reports_the_same_numbers_and_trains_nothing(tmp_path, capsys):
    spec, cache = _spec(tmp_path), tmp_path / "cache"
    a, b, arch = tmp_path / "a" / "runs", tmp_path / "b" / "runs", tmp_path / "archive"
    common = ["--quick", "--set", f"data.cache_dir={cache}"]
    assert main(["run", spec, "--out", str(a), *common, "--jobs", "2", "--threads", "1"]) == 0
    assert main(["archive", spec, "--quick", "--out", str(a), "--dest", str(arch)]) == 0
    assert not list(arch.rglob("*.safetensors")) and not list(arch.rglob("checkpoints"))
    index = json.loads((arch / "archive.json").read_text())
    assert set(index["folders"]) == {"tune", "sweep", "finetune/tune", "finetune/sweep"}
    assert any(f.startswith("measurements/cloze/") for f in index["files"])

    assert main(["restore", spec, "--quick", "--out", str(b), "--src", str(arch)]) == 0
    assert "sweep: 1 runs restored" in capsys.readouterr().out
    restored = json.loads((b / "finetune" / "sweep" / "manifest.json").read_text())["points"]
    assert all(p["run_dir"].startswith(str(b.resolve())) for p in restored)
    assert str(a.resolve()) not in (Path(restored[0]["run_dir"]) / "recipe.yaml").read_text()

    assert main(["run", spec, "--out", str(b), *common, "--jobs", "2", "--threads", "1"]) == 0
    said = capsys.readouterr()
    assert "already done" in said.out + said.err and "cloze: " not in said.out + said.err  # nothing trained or scored
    assert not list(b.rglob("checkpoints"))  # nothing was trained: a trained run writes its checkpoints
    assert _numbers(b / "report" / "report.json", b) == _numbers(a / "report" / "report.json", a)

    # `report --out` reads the measurements cached beside the record, wherever its spec said it was written
    record = json.loads((b / "experiment.json").read_text())
    (b / "experiment.json").write_text(json.dumps({**record, "spec": {**record["spec"], "out": "runs/elsewhere"}}))
    assert main(["report", spec, "--out", str(b), "--quick", "--report", str(tmp_path / "again")]) == 0
    said = capsys.readouterr()
    assert "cloze: " not in said.out + said.err and "finetune: scoring" not in said.out + said.err
    assert _numbers(tmp_path / "again" / "report.json", b) == _numbers(a / "report" / "report.json", a)

    # a second restore writes nothing over what is there
    assert restore_experiment(arch, b) == {"tune": 0, "sweep": 0, "finetune/tune": 0, "finetune/sweep": 0}


def test_an_archive_inside_the_runs_folder_or_of_nothing_is_refused(tmp_path):
    (tmp_path / "runs").mkdir()
    with pytest.raises(ValueError, match="holds no experiment runs"):
        archive_experiment(tmp_path / "runs", tmp_path / "archive")
    (tmp_path / "runs" / "experiment.json").write_text("{}")
    with pytest.raises(ValueError, match="lies inside the runs folder"):
        archive_experiment(tmp_path / "runs", tmp_path / "runs" / "archive")


def test_restoring_from_a_folder_that_is_no_archive_names_it(tmp_path, root, capsys):
    assert main(["restore", str(root / "experiments/model-types.yaml"), "--out", str(tmp_path / "runs"),
                 "--src", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "archive.json does not exist: not an experiment archive" in err and str(tmp_path) in err


def _run(folder: Path) -> None:
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"status": "completed"}))


def _manifest(folder: Path, points: list[tuple[str, str, str]]) -> None:
    """points: (name, ladder, the run folder it starts from or "")."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "manifest.json").write_text(json.dumps({"kind": "archlab-sweep", "version": 1, "spec": {}, "points": [
        {"name": n, "ladder": ladder, "overrides": [f"train.init_from={init}"] if init else []}
        for n, ladder, init in points]}))


def test_runs_a_run_still_to_train_starts_from_are_left_out(tmp_path, monkeypatch):
    """With a fine-tuning stage: a seeded run stays out until its fine-tuned run is done, and the best tuning run so
    far of an arm whose fine-tuning lr is not tuned yet (that tuning starts from the grid's best); without one, only
    what an unfinished point names stays out."""
    out = tmp_path / "runs"
    _manifest(out / "tune", [("gpt-lr1-t", "gpt-lr1", ""), ("gpt-lr2-t", "gpt-lr2", ""),
                             ("bert-lr1-t", "bert-lr1", ""), ("bert-lr2-t", "bert-lr2", ""),
                             ("bert-lr4-t", "bert-lr4", "")])
    _manifest(out / "sweep", [("gpt-seed0-t", "gpt", ""), ("gpt-seed1-t", "gpt", ""), ("gpt-seed2-t", "gpt", "")])
    _manifest(out / "finetune" / "tune", [("gpt-lr1-f", "gpt-lr1", str(out / "tune" / "gpt-lr1-t")),
                                          ("gpt-lr2-f", "gpt-lr2", str(out / "tune" / "gpt-lr1-t"))])
    _manifest(out / "finetune" / "sweep", [("gpt-s0-f", "gpt-s0", str(out / "sweep" / "gpt-seed0-t")),
                                           ("gpt-s1-f", "gpt-s1", str(out / "sweep" / "gpt-seed1-t"))])
    for run in ["tune/gpt-lr1-t", "tune/gpt-lr2-t", "sweep/gpt-seed0-t", "sweep/gpt-seed1-t",
                "finetune/tune/gpt-lr1-f", "finetune/tune/gpt-lr2-f", "finetune/sweep/gpt-s0-f"]:
        _run(out / run)
    _run(out / "tune" / "bert-lr1-t")
    _run(out / "tune" / "bert-lr2-t")  # bert-lr4 still to train
    _run(out / "tune" / "gpt-lr4-t")  # an extension's run the manifest no longer lists (a later call planned anew)
    losses = {"bert-lr1-t": 3.0, "bert-lr2-t": 2.5}  # the tuning's score of each finished run
    monkeypatch.setattr(archive, "score", lambda path: losses.get(Path(path).name, 3.0))
    index = archive_experiment(out, tmp_path / "a", finetune=True)
    # bert's fine-tuning lr is not tuned yet: its grid's best so far stays out, gpt's tuning runs are all in
    assert index["folders"]["tune"]["left_out"] == ["bert-lr2-t"] and index["folders"]["tune"]["runs"] == 4
    archived = json.loads((tmp_path / "a" / "tune" / "manifest.json").read_text())["points"]
    assert {"name": "gpt-lr4-t", "ladder": "gpt-lr4", "status": "finished"}.items() <= archived[-1].items()
    assert index["folders"]["sweep"]["left_out"] == ["gpt-seed1-t"]  # its fine-tuned run is still to train
    assert index["folders"]["finetune/sweep"]["runs"] == 1
    restore_experiment(tmp_path / "a", tmp_path / "b")
    assert sorted(p.name for p in (tmp_path / "b" / "sweep").iterdir()) == ["gpt-seed0-t", "manifest.json"]
    status = {q["name"]: q.get("status") for q in json.loads((tmp_path / "b" / "sweep" / "manifest.json").read_text())
              ["points"]}
    assert status["gpt-seed1-t"] == "not archived"

    plain = archive_experiment(out, tmp_path / "c")  # no fine-tuning stage: only the unfinished point's start
    assert plain["folders"]["sweep"]["left_out"] == ["gpt-seed1-t"] and plain["folders"]["tune"]["runs"] == 5


def test_runs_a_measurement_still_has_to_score_are_left_out(tmp_path):
    """A run whose checkpoint the cloze has not scored yet (no cache file), or that the record does not list yet
    (written before it finished), stays out: a restored run has no checkpoint to score."""
    out = tmp_path / "runs"
    _manifest(out / "sweep", [(f"gpt-seed{s}-t", "gpt", "") for s in range(3)])
    for s in range(3):
        _run(out / "sweep" / f"gpt-seed{s}-t")
    spec = load_spec(_spec(tmp_path))
    runs = [{"arm": "gpt", "seed": s, "point": f"gpt-seed{s}-t", "run_dir": str(out / "sweep" / f"gpt-seed{s}-t")}
            for s in (0, 1)]  # seed 2 finished after the record was written
    (out / "experiment.json").write_text(json.dumps({"spec": {**spec.to_dict(), "out": "elsewhere"}, "arms": [],
                                                     "runs": runs}))
    (out / "measurements" / "cloze").mkdir(parents=True)
    (out / "measurements" / "cloze" / "gpt-seed0-t.json").write_text("{}")
    index = archive_experiment(out, tmp_path / "a", measurements=["cloze"])
    assert index["folders"]["sweep"]["left_out"] == ["gpt-seed1-t", "gpt-seed2-t"]
    assert index["folders"]["sweep"]["runs"] == 1
    # a measurement that loads no checkpoint (throughput times fresh models) keeps nothing out
    assert archive_experiment(out, tmp_path / "b", measurements=["throughput"])["folders"]["sweep"]["runs"] == 3
