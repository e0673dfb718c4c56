"""Load a recipe: YAML (+ ``base:`` chain) + dotlist overrides -> validated DictConfig."""

from __future__ import annotations

import difflib
import os
import warnings
from pathlib import Path
from typing import Any, Iterable, Optional, Union

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from archlab.config.keys import key_groups, nearest_keys, schema_keys
from archlab.config.options import check_moe_switch
from archlab.config.schema import (
    OBJECTIVES,
    ModelConfig,
    Recipe,
    TrainConfig,
    model_config,  # noqa: F401  (re-exported)
)
from archlab.config.validate import RecipeError, validate
from archlab.config.variants import select
from archlab.nn.component import field_default

REPO_RECIPES = Path(__file__).resolve().parents[2] / "recipes"  # a source checkout's recipes


def _recipes_root(path: Path) -> Optional[Path]:
    """The ``recipes`` folder a missing recipe path was meant to be in: one named so above it, else the checkout's."""
    for folder in path.absolute().parents:
        if folder.name == "recipes" and folder.is_dir():
            return folder
    return REPO_RECIPES if REPO_RECIPES.is_dir() else None


def missing_recipe_message(path: Path) -> str:
    """``recipe file not found: recipes/lama/tiny.yaml; did you mean recipes/llama/tiny.yaml?`` (the nearest
    recipe files by their path under ``recipes/``, written relative to the working folder where they lie below it)."""
    message = f"recipe file not found: {path}"
    root = _recipes_root(path)
    if root is None:
        return message
    parts = path.parts
    if "recipes" in parts:
        tail = "/".join(parts[len(parts) - 1 - parts[::-1].index("recipes"):])
    else:  # llama/tiny.yaml: a path under recipes/
        tail = f"recipes/{path.as_posix()}"
    files = {file.relative_to(root.parent).as_posix(): file for file in root.rglob("*.y*ml")}
    near = difflib.get_close_matches(tail, sorted(files), n=3, cutoff=0.8)
    if not near:
        return f"{message} (the recipes are under {root})"

    def shown(file: Path) -> str:
        rel = os.path.relpath(file)
        return file.as_posix() if path.is_absolute() or rel.startswith("..") else rel

    return f"{message}; did you mean {', '.join(shown(files[n]) for n in near)}?"


def moved_keys() -> dict[str, tuple[str, list[str]]]:
    """Each flat train key of the schema before objective options nested under ``train.objective``
    (``mtp_weight``) -> (its name there, ``weight``; the objectives whose Config has it), from each objective
    Config's ``renamed``."""
    out: dict[str, tuple[str, list[str]]] = {}
    for name in OBJECTIVES.names():
        for old, new in getattr(OBJECTIVES.get(name).Config, "renamed", {}).items():
            out.setdefault(old, (new, []))[1].append(name)
    return out


def nest_objective(node: Any, where: str) -> None:
    """A written recipe layer's ``train.objective`` as a node, in place: a bare name is ``{type: NAME}``, and a
    flat key of the schema before (``train.mtp_weight``: saved run folders' recipes write every one) is read
    as its place under the objective (``train.objective.weight``), unless the layer writes that too. A value
    other than the default is read with a warning naming the new key; the loader then refuses it, as any
    key, where the chosen objective does not read it."""
    train = node.get("train") if isinstance(node, DictConfig) else None
    if not isinstance(train, DictConfig):
        return
    if train.get("objective") is not None and not isinstance(train.objective, DictConfig):
        train.objective = {"type": train.objective}
    moved = moved_keys()
    for old in [k for k in train if k in moved]:
        new, users = moved[old]
        value = train.pop(old)
        if train.get("objective") is None:
            train.objective = {}
        if new in train.objective:
            continue
        train.objective[new] = value
        if any(value != field_default(OBJECTIVES.get(u).Config, new) for u in users):
            warnings.warn(f"{where}: train.{old}={value!r} is read as train.objective.{new} (objective options "
                          f"nest under train.objective); write train.objective.{new}", stacklevel=2)


def respell(override: str) -> str:
    """``train.objective=mtp`` as ``train.objective.type=mtp`` (what the bare name is short for), so that
    ``train.objective.weight=0.1`` beside it adds to the same node; a flat key of the schema before
    (``train.mtp_weight=0.1``, as experiment records write it) as its place under the objective, with a warning
    naming it."""
    key, _, value = override.partition("=")
    key = key.strip()
    if key == "train.objective" and not value.strip().startswith("{"):
        return f"train.objective.type={value}"
    moved = moved_keys()
    if key.startswith("train.") and key.removeprefix("train.") in moved:
        new = f"train.objective.{moved[key.removeprefix('train.')][0]}"
        warnings.warn(f"{key}={value}: read as {new}={value} (objective options nest under train.objective); "
                      f"write {new}", stacklevel=3)
        return f"{new}={value}"
    return override


def _read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> DictConfig:
    """Read one YAML file, merging the chain of ``base:`` files under it."""
    given, path = path, path.resolve()
    if path in seen:
        raise RecipeError(f"{path}: 'base' chain loops back to itself")
    if not path.is_file():
        raise RecipeError(missing_recipe_message(given))
    try:
        node = OmegaConf.load(path)
    except Exception as e:  # yaml.YAMLError and friends
        raise RecipeError(f"{path}: not valid YAML ({e})") from None
    if not isinstance(node, DictConfig):
        raise RecipeError(f"{path}: a recipe is a YAML mapping, got {type(node).__name__}")
    nest_objective(node, str(given))
    base = node.get("base")
    if base:
        parent = _read_yaml(path.parent / str(base), seen + (path,))
        node = OmegaConf.merge(parent, node)
        node.base = None
    return node


def unknown_key_message(key: str) -> str:
    """``unknown key 'train.max_step': ...; did you mean train.max_steps, ...?``"""
    near = nearest_keys(key)
    hint = f"; did you mean {' or '.join([', '.join(near[:-1]), near[-1]] if len(near) > 1 else near)}?" \
        if near else ""
    return (f"unknown key '{key}': not part of the recipe schema{hint} "
            "(python -m archlab.train --help lists the key groups; archlab/config/schema.py)")


def _check_override_keys(overrides: list[str]) -> None:
    """Each override names a key or a group of the schema (``extra`` is free-form): an unknown one is named
    whole (``model.attenton.type``, not just its first unknown part), with the nearest valid keys."""
    valid = set(schema_keys()) | set(key_groups())
    for o in overrides:
        key = o.split("=", 1)[0].strip().lstrip("+~")
        if key not in valid and key.split(".")[0] != "extra":
            raise RecipeError(unknown_key_message(key))


def _omegaconf_message(e: OmegaConfBaseException) -> str:
    key = getattr(e, "full_key", None) or getattr(e, "key", None)
    msg = str(e).splitlines()[0]
    if "not in struct" in msg or "Key '" in msg and "not in" in msg:
        return unknown_key_message(str(key))
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


WARMUP_CAP_FRACTION = 0.1  # a warmup longer than the run becomes this share of its steps


def fit_warmup(t, overrides: DictConfig) -> None:
    """A warmup longer than the run (a recipe's 30 steps under ``train.max_steps=20``) is capped to
    ``WARMUP_CAP_FRACTION`` of the steps (at least 1), the recipe's value kept in
    ``train.warmup_capped_from`` (saved with the run; the trainer prints it). A warmup set among the
    overrides is the user's own and stays refused by the validator, as is a hand-set ``warmup_capped_from``."""
    given = overrides.get("train") or {}
    if "warmup_capped_from" in given:
        raise RecipeError(f"train.warmup_capped_from={given['warmup_capped_from']!r}: set at load when the recipe's "
                          "warmup exceeds train.max_steps, not by hand; set train.warmup_steps instead")
    if "warmup_steps" in given or not isinstance(t.max_steps, int) or t.max_steps <= 0:
        return
    if t.warmup_steps > t.max_steps:
        t.warmup_capped_from = int(t.warmup_steps)
        t.warmup_steps = max(1, int(WARMUP_CAP_FRACTION * t.max_steps))


def warmup_note(t) -> Optional[str]:
    """The line that says a warmup was capped (None when it was not)."""
    if t.warmup_capped_from is None:
        return None
    return (f"train.warmup_steps={t.warmup_capped_from} exceeds train.max_steps={t.max_steps}: capped to "
            f"{t.warmup_steps} ({WARMUP_CAP_FRACTION:.0%} of the steps; set train.warmup_steps to choose)")


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
    overrides = [respell(o) for o in overrides]
    _check_override_keys(overrides)
    try:
        written = OmegaConf.merge(OmegaConf.create(), *layers[1:])  # what the file and overrides set, no defaults
        dotlist = OmegaConf.create()
        if overrides:
            dotlist = OmegaConf.from_dotlist(overrides)
            written = OmegaConf.merge(written, dotlist)
        select(schema.model, written.get("model"), ModelConfig)  # each component node: its type's dataclass
        select(schema.train, written.get("train"), TrainConfig, prefix="train")  # the objective's own Config
        cfg = OmegaConf.merge(schema, written)
        # resolve interpolations now, so a bad one fails here and not mid-run
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as e:
        raise RecipeError(_omegaconf_message(e)) from None
    check_moe_switch(written.get("model"))  # MoE is switched on by model.moe.num_experts, not by any moe key
    fold_tensorboard(cfg.train)
    fit_warmup(cfg.train, dotlist)  # a short run of a recipe with a longer warmup: capped, recorded
    validate(cfg)
    OmegaConf.set_readonly(cfg, False)
    return cfg
