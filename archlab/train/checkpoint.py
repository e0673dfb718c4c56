"""A model and its recipe rebuilt from a checkpoint (the files: :mod:`archlab.checkpoints`, re-exported here)."""

from __future__ import annotations

from pathlib import Path
from typing import Union

import torch
from omegaconf import DictConfig

from archlab.checkpoints import (  # noqa: F401  (the checkpoint files' API, re-exported)
    CKPT_DIR,
    MANIFEST,
    OPTIMIZER,
    RECIPE,
    RUN_MARKER,
    STATE,
    TOKENIZER,
    WEIGHTS,
    CheckpointError,
    PathLike,
    _sha256,
    begin,
    checkpoints,
    finish,
    hash_share,
    is_checkpoint_dir,
    is_run_dir,
    latest,
    latest_valid,
    load_optimizer_state,
    load_rng,
    load_state,
    load_weights_into,
    prune,
    rank_optimizer_name,
    resolve_checkpoint,
    save_model_weights,
    save_recipe,
    save_rng,
    step_dir_name,
    tmp_dir,
    verify,
)
from archlab.config.load import load_recipe
from archlab.model.build import build_model


def load_recipe_of(ckpt_dir: PathLike) -> DictConfig:
    path = Path(ckpt_dir) / RECIPE
    if not path.is_file():
        raise CheckpointError(f"{path}: missing; cannot rebuild the model without its recipe")
    return load_recipe(path)


def load_model(path: PathLike, device: Union[str, torch.device] = "cpu"):
    """(model, recipe) from a run folder (its newest complete checkpoint) or a checkpoint folder.

    The model is in eval mode; weights come from safetensors, the recipe from the checkpoint's copy.
    """
    ckpt = resolve_checkpoint(path)
    cfg = load_recipe_of(ckpt)
    model = build_model(cfg)
    load_weights_into(model, ckpt)
    return model.to(device).eval(), cfg
