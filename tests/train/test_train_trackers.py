"""train.trackers: every metrics row and the resolved recipe go to accelerate's trackers, the run
named after its folder; a missing tracker package stops the run before anything is built; the
older train.tensorboard key keeps loading.

The wiring is tested with an in-memory tracker registered with accelerate (no package needed);
TensorBoard, MLflow (local file store) and wandb (offline) each where their package is installed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from accelerate.tracking import LOGGER_TYPE_TO_CLASS, GeneralTracker

import archlab
from archlab import trackers
from archlab.config import RecipeError
from archlab.trackers import TRACKERS, Tracker, recipe_hparams, row_values
from archlab.train import Trainer, train


class MemoryTracker(GeneralTracker):
    """Keeps what accelerate hands a tracker; one instance per run (``MemoryTracker.runs``)."""

    name = "memory"
    requires_logging_directory = False
    runs: list["MemoryTracker"] = []

    def __init__(self, project: str, run: str = ""):
        super().__init__()
        self.project, self.run, self.config, self.logged, self.finished = project, run, None, [], 0
        MemoryTracker.runs.append(self)

    @property
    def tracker(self):
        return self

    def store_init_configuration(self, values: dict):
        self.config = dict(values)

    def log(self, values: dict, step=None, **kwargs):
        self.logged.append((step, dict(values)))

    def finish(self):
        self.finished += 1


@pytest.fixture
def memory_tracker(monkeypatch):
    MemoryTracker.runs = []
    monkeypatch.setitem(LOGGER_TYPE_TO_CLASS, "memory", MemoryTracker)
    monkeypatch.setitem(TRACKERS, "memory", Tracker("memory-tracker", lambda: True, lambda run, folder: {"run": run}))
    return MemoryTracker


def _rows(run_dir) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in
                                        ((a[k], b[k]) for k in a))


def test_every_row_and_the_recipe_reach_the_tracker(tiny_cfg, memory_tracker):
    cfg = tiny_cfg("train.trackers=[memory]", "train.tracker_project=ladder")
    summary = train(cfg)
    run_dir = Path(summary["run_dir"])
    [run] = memory_tracker.runs
    assert run.project == "ladder" and run.run == run_dir.name == "run"  # the run folder's name
    assert run.finished == 1
    # every metrics.jsonl row, at its step, its numbers under <kind>/<key>
    rows = _rows(run_dir)
    assert len(run.logged) == len(rows) > 8
    for (step, values), row in zip(run.logged, rows):
        assert step == row["step"] and _same(values, row_values(row))
    keys = set().union(*(values for _, values in run.logged))
    assert {"train/loss", "train/lr", "train/grad_norm", "val/loss", "val_2x/loss"} <= keys
    assert not any(k.endswith(("/step", "/kind", "/final")) for k in keys)
    # the resolved recipe, flattened; values every tracker takes
    assert run.config == recipe_hparams(cfg)
    assert run.config["model.d_model"] == 32 and run.config["train.tracker_project"] == "ladder"
    assert run.config["train.trackers"] == '["memory"]' and run.config["train.branch_from"] == "null"
    assert run.config["train.eval_context_multipliers"] == "[1, 2]"
    assert all(isinstance(v, (bool, int, float, str)) for v in run.config.values())


def test_row_values_name_each_number():
    assert row_values({"kind": "val", "step": 4, "tokens": 8, "context_len": 64, "context_multiplier": 2,
                       "loss": 5.0, "final": True, "skipped": "no"}) == \
        {"val_2x/tokens": 8, "val_2x/context_len": 64, "val_2x/loss": 5.0}
    assert row_values({"kind": "train", "step": 3, "loss": 2.0, "moe/maxvio": 0.5, "moe/layer1/load_fraction": [1]}) \
        == {"train/loss": 2.0, "train/moe/maxvio": 0.5}


def test_a_missing_tracker_package_stops_the_run_before_anything(tiny_cfg, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(TRACKERS, "wandb", Tracker("wandb", lambda: False, TRACKERS["wandb"].init_kwargs))
    cfg = tiny_cfg("train.trackers=[tensorboard,wandb]")
    monkeypatch.setitem(TRACKERS, "tensorboard", Tracker("tensorboard", lambda: True, lambda run, folder: {}))
    with pytest.raises(RecipeError, match=r"train.trackers=\['tensorboard', 'wandb'\]: wandb is not installed; "
                                          r"pip install wandb \(or remove it from train.trackers\)"):
        Trainer(cfg)
    assert not (tmp_path / "runs").exists()  # no run folder, nothing trained
    # the command line: one line, exit status 2 (bad input), as for any recipe error
    from archlab.train.__main__ import _train

    assert _train(str(Path(archlab.__file__).parents[1] / "recipes/llama/tiny.yaml"),
                  [f"train.out_dir={tmp_path / 'runs'}", "train.trackers=[wandb]"]) == 2
    err = capsys.readouterr().err
    assert "error: train.trackers=['wandb']: wandb is not installed; pip install wandb" in err
    assert "Traceback" not in err and not (tmp_path / "runs").exists()


def test_tracker_settings_are_validated(root):
    recipe = root / "recipes/llama/tiny.yaml"
    for overrides, message in [
        (["train.trackers=[tensorbored]"], "train.trackers='tensorbored': must be one of: tensorboard, wandb, mlflow"),
        (["train.trackers=[mlflow,mlflow]"], "names a tracker twice"),
        (["train.trackers=[mlflow]", "train.tracker_project=' '"], "train.tracker_project=' ': must be a name"),
        (["train.tracker_project=mine"], "train.tracker_project='mine': only used when train.trackers names a "
                                         "tracker; this recipe has train.trackers=[]"),
        (["train.trackers=[tensorboard]", "train.tensorboard=false"], "train.tensorboard=False: contradicts"),
    ]:
        with pytest.raises(RecipeError, match=message.replace("[", r"\[").replace("]", r"\]")):
            archlab.load_recipe(recipe, overrides)


def test_the_older_tensorboard_key_keeps_loading(root, tmp_path):
    """train.tensorboard: true = trackers [tensorboard], false = none; folded at load, then null."""
    recipe = root / "recipes/llama/tiny.yaml"
    assert archlab.load_recipe(recipe).train.trackers == []  # the default: no tracker
    on = archlab.load_recipe(recipe, ["train.tensorboard=true"]).train
    assert list(on.trackers) == ["tensorboard"] and on.tensorboard is None
    off = archlab.load_recipe(recipe, ["train.tensorboard=false", "train.trackers=[mlflow]"]).train
    assert list(off.trackers) == ["mlflow"] and off.tensorboard is None
    # a recipe.yaml saved by a run before train.trackers (tensorboard: true was the default)
    from omegaconf import OmegaConf

    node = OmegaConf.to_container(archlab.load_recipe(recipe))
    del node["train"]["trackers"], node["train"]["tracker_project"]
    node["train"]["tensorboard"] = True
    saved = tmp_path / "recipe.yaml"
    saved.write_text(OmegaConf.to_yaml(node))
    assert list(archlab.load_recipe(saved).train.trackers) == ["tensorboard"]


def test_tensorboard_events_in_the_run_folder(tiny_cfg):
    pytest.importorskip("tensorboard", reason="TensorBoard not installed (pip install tensorboard)")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    summary = train(tiny_cfg("train.trackers=[tensorboard]"))
    run_dir = Path(summary["run_dir"])
    logdir = run_dir / "tb" / "archlab"
    assert list(logdir.glob("events.out.tfevents.*")), sorted(run_dir.rglob("*"))
    events = EventAccumulator(str(logdir))
    events.Reload()
    train_rows = [r for r in _rows(run_dir) if r["kind"] == "train"]
    losses = events.Scalars("train/loss")
    assert [e.step for e in losses] == [r["step"] for r in train_rows]
    assert [e.value for e in losses] == pytest.approx([r["loss"] for r in train_rows], rel=1e-6)
    assert "val_2x/loss" in events.Tags()["scalars"]
    assert list(logdir.glob("*/hparams.yml"))  # the recipe as hyperparameters


def test_mlflow_local_file_store(tiny_cfg, tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow", reason="MLflow not installed (pip install mlflow)")
    store = f"file:{tmp_path / 'mlruns'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps the file store behind this flag
    summary = train(tiny_cfg("train.trackers=[mlflow]", "train.tracker_project=trackers-test"))
    client = mlflow.tracking.MlflowClient(tracking_uri=store)
    experiment = client.get_experiment_by_name("trackers-test")
    [run] = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == Path(summary["run_dir"]).name and run.info.status == "FINISHED"
    assert run.data.params["model.d_model"] == "32" and run.data.params["train.trackers"] == '["mlflow"]'
    history = client.get_metric_history(run.info.run_id, "train/loss")
    train_rows = [r for r in _rows(summary["run_dir"]) if r["kind"] == "train"]
    assert [m.step for m in history] == [r["step"] for r in train_rows]
    assert [m.value for m in history] == pytest.approx([r["loss"] for r in train_rows])


def test_wandb_offline_run_in_the_run_folder(tiny_cfg, monkeypatch):
    pytest.importorskip("wandb", reason="wandb not installed (pip install wandb)")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    summary = train(tiny_cfg("train.trackers=[wandb]", "train.max_steps=4", "train.eval_every=2",
                             "train.eval_context_multipliers=[1]"))
    [offline] = (Path(summary["run_dir"]) / "wandb").glob("offline-run-*")
    assert list(offline.glob("run-*.wandb"))  # the run's records, for `wandb sync`
    assert summary["status"] == "completed"


def test_trackers_finish_once_and_the_trainer_closes_cleanly(tiny_cfg, memory_tracker):
    trainer = Trainer(tiny_cfg("train.trackers=[memory]", "train.max_steps=2", "train.eval_context_multipliers=[1]"))
    [run] = memory_tracker.runs
    trainer.close()  # never ran: close still ends the tracker's run
    trainer.close()
    assert run.finished == 1
    assert trackers.requested(trainer.cfg.train) == ["memory"]
