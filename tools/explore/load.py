"""What the explorer opens: a run folder, a checkpoint folder or a recipe (random init), as an
:class:`Explorable` (model in eval mode, recipe, text codec, label). Every refusal is one line
that names the path and what to do."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Optional, Sequence

import torch

import archlab
from archlab.checkpoints import is_run_dir
from archlab.config import RecipeError
from archlab.nn.positions import position_class
from archlab.train.checkpoint import CheckpointError, load_model
from tools.explore.prompt import DefaultPrompt, default_prompt
from tools.sample import TextCodec, find_tokenizer_file, load_codec, recipe_eot_id


class ExploreError(ValueError):
    """A user mistake: shown as one line in the terminal or the page."""


@dataclass
class Explorable:
    model: torch.nn.Module
    cfg: object  # the recipe (DictConfig)
    codec: TextCodec
    label: str
    source: str  # "run" | "recipe"
    byte_codec: bool  # no trained tokenizer: UTF-8 bytes as ids
    run_dir: Optional[Path] = None  # the run folder (a checkpoint outside one: that folder); None for a recipe

    @property
    def kind(self) -> str:
        """decoder | encoder | encoder_decoder (model.type)."""
        return self.model.cfg.type

    @property
    def max_len(self) -> Optional[int]:
        """The longest input the model takes: the learned position table, else model.max_seq_len."""
        m = self.model.cfg
        limit = position_class(m).max_length(m)
        return limit if limit is not None else m.max_seq_len

    @cached_property
    def prompt(self) -> DefaultPrompt:
        """The first prompt: the start of the model's own validation split (``tools.explore.prompt``)."""
        return default_prompt(self, self.run_dir)


def _is_hf_export(path: Path) -> bool:
    cfg = path / "config.json"
    if not cfg.is_file():
        return False
    try:
        return "model_type" in json.loads(cfg.read_text())
    except (OSError, ValueError):
        return False


def load(path: Path, overrides: Sequence[str] = (), tokenizer: Optional[Path] = None) -> Explorable:
    """The model ``path`` names: a recipe YAML (random init, ``overrides`` applied), or a run /
    checkpoint folder (its newest complete checkpoint and its ``tokenizer.json``)."""
    if not path.exists():
        raise ExploreError(f"{path}: no such run folder, checkpoint or recipe")
    if tokenizer is not None and not tokenizer.is_file():
        raise ExploreError(f"--tokenizer {tokenizer}: no such file")
    if path.is_file():
        if path.suffix not in (".yaml", ".yml"):
            raise ExploreError(f"{path}: not a recipe (.yaml) nor a run folder")
        try:
            cfg = archlab.load_recipe(path, list(overrides))
            torch.manual_seed(0)
            model = archlab.build_model(cfg).eval()
        except RecipeError as e:
            raise ExploreError(str(e)) from None
        return Explorable(model, cfg, load_codec(tokenizer, recipe_eot_id(cfg)), f"{cfg.name} (random init)",
                          "recipe", tokenizer is None)
    if overrides:
        raise ExploreError("key=value overrides apply to a recipe only; a run's architecture is fixed")
    if _is_hf_export(path):
        raise ExploreError(f"{path}: a Hugging Face export; import it into a run first: "
                           f"python -m tools.import_hf {path} --out runs/NAME, then open runs/NAME")
    try:
        model, cfg = load_model(path)
    except CheckpointError as e:
        raise ExploreError(str(e)) from None
    tok = tokenizer if tokenizer is not None else find_tokenizer_file(path)
    if tok is None:
        data = cfg.get("data") or {}
        if data.get("tokenizer") != "byte":
            raise ExploreError(f"{path}: this checkpoint has no tokenizer.json in its run folder (trained with "
                               f"data.tokenizer={data.get('tokenizer')!r}): pass --tokenizer PATH/tokenizer.json, "
                               "the tokenizer it was trained with")
    run_dir = next((p for p in [path, *list(path.resolve().parents)[:2]] if is_run_dir(p)), path)
    return Explorable(model.eval(), cfg, load_codec(tok, recipe_eot_id(cfg)), f"{cfg.name} ({path.name})", "run",
                      tok is None, run_dir)
