"""Experiment trackers (``train.trackers``), driven through accelerate.

    train:
      trackers: [tensorboard, wandb, mlflow]
      tracker_project: archlab        # wandb project, MLflow experiment, TensorBoard subfolder

``metrics.jsonl`` stays the run's record; each tracker gets a copy of it:

- every row the trainer writes (train, validation, skipped batches), at the row's step: its
  numbers under ``<kind>/<key>`` (``train/loss``, ``val/loss``, ``train/moe/maxvio``), a
  validation at m times the training context under ``val_<m>x/<key>``; strings, booleans and
  lists (e.g. per-expert counts) stay in the JSON files only;
- the resolved recipe as hyperparameters, flattened to dotted keys (``model.d_model``); values
  that are not a bool, int, float or str are written as JSON (lists) or ``null`` (None), which
  every tracker accepts;
- the run name is the run folder's name, the project ``train.tracker_project``.

Wiring: the Accelerator is built with ``log_with=`` the trackers and the run folder as its
``project_dir`` once the folder is known (TensorBoard: events under ``<run>/tb/<project>/``;
wandb: its files under ``<run>/wandb/``; MLflow: wherever ``MLFLOW_TRACKING_URI`` points).
``accelerator.init_trackers`` and ``accelerator.log`` run on the main process only (accelerate
decorates both with ``on_main_process``); the other ranks hold no tracker. At the end each
tracker is finished as ``accelerator.end_training()`` finishes them, without its
``destroy_process_group``: the process groups are torn down later, in order, by
:func:`archlab.train.dist.shutdown_distributed`.

A tracker whose package is not installed fails at start (a RecipeError naming the
``pip install`` line), before the data or the model is built: nothing is lost. accelerate itself
would drop such a tracker silently.

A resumed run starts a new tracker run (TensorBoard: a new events file in the same folder) from its
checkpoint's step; a branch's tracker run starts at the branch step. Their whole history is in
``metrics.jsonl``.

Adding a tracker that accelerate knows: one entry in :data:`TRACKERS` (its package, how it is
told the run name and where to write) and a test.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from omegaconf import DictConfig, OmegaConf

from archlab.errors import RecipeError


def _available(name: str) -> Callable[[], bool]:
    """accelerate's own check for the tracker's package (``accelerate.utils.is_<name>_available``)."""

    def check() -> bool:
        from accelerate import utils

        return bool(getattr(utils, f"is_{name}_available")())

    return check


@dataclass(frozen=True)
class Tracker:
    """What archlab needs to know of one of accelerate's trackers."""

    package: str  # what ``pip install`` takes
    installed: Callable[[], bool]
    init_kwargs: Callable[[str, Path], dict]  # (run name, run folder) -> accelerate's init_kwargs for it


TRACKERS: dict[str, Tracker] = {
    # accelerate's TensorBoardTracker writes to <logging_dir>/<project>; logging_dir is <run>/tb
    "tensorboard": Tracker("tensorboard", _available("tensorboard"), lambda run, folder: {}),
    # wandb.init(project=<project>, name=<run>, dir=<run folder>); WANDB_MODE=offline works without a network
    "wandb": Tracker("wandb", _available("wandb"), lambda run, folder: {"name": run, "dir": str(folder)}),
    # MLflow: experiment <project>, run <run>, in the store of MLFLOW_TRACKING_URI (e.g. file:/path/mlruns)
    "mlflow": Tracker("mlflow", _available("mlflow"), lambda run, folder: {"run_name": run}),
}
TB_DIR = "tb"  # the run folder's TensorBoard subfolder


def requested(train_cfg) -> list[str]:
    """The trackers a ``train`` node asks for (``train.tensorboard`` is folded in at load)."""
    return [str(name) for name in train_cfg.get("trackers") or []]


def check_installed(names: Sequence[str]) -> None:
    """RecipeError naming the ``pip install`` line when a tracker's package is missing."""
    missing = [name for name in names if not TRACKERS[name].installed()]
    if missing:
        packages = " ".join(TRACKERS[name].package for name in missing)
        raise RecipeError(f"train.trackers={list(names)}: {', '.join(missing)} "
                          f"{'is' if len(missing) == 1 else 'are'} not installed; pip install {packages} "
                          "(or remove it from train.trackers)")


def check_accepted(accelerator, names: Sequence[str]) -> None:
    """RecipeError when the Accelerator left out a tracker it was asked for (accelerate drops one
    whose package it does not find, with a debug message only)."""
    kept = {str(t) for t in accelerator.log_with}  # LoggerType members print as their value
    dropped = [name for name in names if name not in kept]
    if dropped:
        raise RecipeError(f"train.trackers={list(names)}: accelerate did not set up {', '.join(dropped)} "
                          f"(is it installed? pip install {' '.join(TRACKERS[n].package for n in dropped)})")


def recipe_hparams(cfg: DictConfig) -> dict[str, Any]:
    """The resolved recipe as flat ``{"model.d_model": 96, ...}``: bool, int, float and str values
    as they are, None as ``"null"``, lists and anything else as JSON."""
    flat: dict[str, Any] = {}

    def walk(node: Any, key: str) -> None:
        if isinstance(node, dict) and node:
            for k, v in node.items():
                walk(v, f"{key}.{k}" if key else str(k))
        elif node is None:
            flat[key] = "null"
        elif isinstance(node, (bool, int, float, str)):
            flat[key] = node
        else:
            flat[key] = json.dumps(node, default=str)

    walk(OmegaConf.to_container(cfg, resolve=True), "")
    return flat


def row_values(row: dict[str, Any]) -> dict[str, float]:
    """The numbers of a metrics row as tracker keys: ``<kind>/<key>``; a validation row at a
    multiple m > 1 of the training context under ``val_<m>x/<key>``."""
    kind = str(row.get("kind", "train"))
    mult = row.get("context_multiplier", 1)
    prefix = f"{kind}_{mult}x" if kind == "val" and mult != 1 else kind
    return {f"{prefix}/{k}": v for k, v in row.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("step", "context_multiplier")}


def start(accelerator, run_dir: Path, cfg: DictConfig) -> None:
    """Start the run of every tracker the Accelerator was built with (main process; accelerate
    makes it a no-op elsewhere): run name = the run folder's name, the recipe as hyperparameters."""
    names = requested(cfg.train)
    if not names:
        return
    logging = run_dir / TB_DIR
    accelerator.project_configuration.project_dir = str(run_dir)
    accelerator.project_configuration.logging_dir = str(logging)
    if accelerator.is_main_process and "tensorboard" in names:
        logging.mkdir(parents=True, exist_ok=True)
    kwargs = {name: TRACKERS[name].init_kwargs(run_dir.name, run_dir) for name in names}
    accelerator.init_trackers(cfg.train.tracker_project, config=recipe_hparams(cfg), init_kwargs=kwargs)


def log(accelerator, row: dict[str, Any]) -> None:
    """One metrics row to every tracker, at its step."""
    values = row_values(row)
    if values:
        accelerator.log(values, step=int(row["step"]))


def finish(accelerator) -> None:
    """Finish every tracker (``Accelerator.end_training`` without its ``destroy_process_group``);
    idempotent."""
    while accelerator.trackers:
        accelerator.trackers.pop(0).finish()
