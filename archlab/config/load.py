"""Load a recipe: YAML (+ ``base:`` chain) + dotlist overrides -> validated DictConfig."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Union

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from archlab.config.options import check_moe_switch
from archlab.config.schema import ModelConfig, Recipe
from archlab.config.validate import RecipeError, validate


def _read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> DictConfig:
    """Read one YAML file, merging the chain of ``base:`` files under it."""
    path = path.resolve()
    if path in seen:
        raise RecipeError(f"{path}: 'base' chain loops back to itself")
    if not path.is_file():
        raise RecipeError(f"recipe file not found: {path}")
    try:
        node = OmegaConf.load(path)
    except Exception as e:  # yaml.YAMLError and friends
        raise RecipeError(f"{path}: not valid YAML ({e})") from None
    if not isinstance(node, DictConfig):
        raise RecipeError(f"{path}: a recipe is a YAML mapping, got {type(node).__name__}")
    base = node.get("base")
    if base:
        parent = _read_yaml(path.parent / str(base), seen + (path,))
        node = OmegaConf.merge(parent, node)
        node.base = None
    return node


def _omegaconf_message(e: OmegaConfBaseException) -> str:
    key = getattr(e, "full_key", None) or getattr(e, "key", None)
    msg = str(e).splitlines()[0]
    if "not in struct" in msg or "Key '" in msg and "not in" in msg:
        return f"unknown key '{key}': not part of the recipe schema (see archlab/config/schema.py)"
    return f"key '{key}': {msg}"


def fold_tensorboard(t) -> None:
    """``train.tensorboard`` (the key before ``train.trackers``) into ``train.trackers``: true adds
    ``tensorboard``, false leaves it out (refused when trackers names it); then null, so that a
    saved recipe states its trackers in one place. Recipes and run folders written before keep
    loading: their ``tensorboard: true`` (then the default: TensorBoard when installed) becomes
    ``trackers: [tensorboard]``, which needs the package to train."""
    if t.tensorboard is None:
        return
    if t.tensorboard and "tensorboard" not in t.trackers:
        t.trackers.append("tensorboard")
    elif not t.tensorboard and "tensorboard" in t.trackers:
        raise RecipeError(f"train.tensorboard=False: contradicts train.trackers={list(t.trackers)}; "
                          "set train.trackers alone (train.tensorboard is its older spelling)")
    t.tensorboard = None


def load_recipe(path: Union[str, Path, None] = None, overrides: Iterable[str] = ()) -> DictConfig:
    """Load and validate a recipe.

    ``path`` may be None to start from the schema defaults. ``overrides`` are OmegaConf dotlist
    entries such as ``model.n_layers=4``. Raises :class:`RecipeError` with a message naming the
    key, the value and the rule for any invalid recipe.
    """
    schema = OmegaConf.structured(Recipe)
    layers = [schema]
    if path is not None:
        layers.append(_read_yaml(Path(path)))
    overrides = list(overrides)
    for o in overrides:
        if "=" not in o:
            raise RecipeError(f"override {o!r} is not of the form key=value (e.g. model.n_layers=4)")
    try:
        cfg = OmegaConf.merge(*layers)
        written = OmegaConf.merge(OmegaConf.create(), *layers[1:])  # what the file and overrides set, no defaults
        if overrides:
            dotlist = OmegaConf.from_dotlist(overrides)
            cfg = OmegaConf.merge(cfg, dotlist)
            written = OmegaConf.merge(written, dotlist)
        # resolve interpolations now, so a bad one fails here and not mid-run
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as e:
        raise RecipeError(_omegaconf_message(e)) from None
    check_moe_switch(written.get("model"))  # MoE is switched on by model.moe.num_experts, not by any moe key
    fold_tensorboard(cfg.train)
    validate(cfg)
    OmegaConf.set_readonly(cfg, False)
    return cfg


def model_config(cfg) -> ModelConfig:
    """The typed ``ModelConfig`` object (with its derived properties) of a recipe or model node."""
    if isinstance(cfg, ModelConfig):
        return cfg
    node = cfg.model if "model" in cfg and "d_model" not in cfg else cfg
    if isinstance(node, DictConfig):
        obj = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), node))
        return obj
    raise TypeError(f"expected a recipe DictConfig or ModelConfig, got {type(cfg).__name__}")
