"""The recipe's keys read off the schema: groups with a line each, the nearest keys of an unknown one,
and a warmup longer than a short run capped at load."""

from dataclasses import fields

import pytest
from omegaconf import DictConfig

import archlab
from archlab.config import RecipeError
from archlab.config.keys import GROUPS, choices, key_groups, nearest_keys, schema_keys
from archlab.config.schema import ModelConfig, TrainConfig
from archlab.config.variants import variant_nodes


def _leaves(node, prefix=""):
    groups = key_groups()
    for k, v in node.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, DictConfig):
            yield from _leaves(v, key)
        elif v is None and key in groups:  # an optional group left null (train.upcycle) stands for its keys
            yield from (f"{key}.{leaf}" for leaf in groups[key])
        else:
            yield key


def test_schema_keys_are_the_keys_of_a_loaded_moe_recipe(root):
    """Every key of a loaded recipe, and besides them only the keys of the variants it did not choose."""
    cfg = archlab.load_recipe(root / "recipes/mixtral/tiny.yaml")
    loaded, keys = set(_leaves(cfg)), set(schema_keys())
    others = {f"{section}.{path}.{f.name}" for section, schema in (("model", ModelConfig), ("train", TrainConfig))
              for path, base in variant_nodes(schema)
              for name in base.variants.names() for f in fields(base.variants.get(name).Config)}
    assert loaded <= keys and keys - loaded <= others
    assert "model.ffn.multiple_of" in loaded and "model.ffn.approximate" in keys - loaded  # swiglu, not gelu


def test_every_group_has_its_line_and_every_line_a_group():
    assert set(key_groups()) == set(GROUPS)
    assert "mha" in choices()["model.attention.type"] and "wsd" in choices()["train.schedule"]


@pytest.mark.parametrize("typo, nearest", [
    ("train.max_step", "train.max_steps"), ("model.d_modle", "model.d_model"),
    ("model.attenton.type", "model.attention.type"), ("trian", "train"), ("data.tokeniser", "data.tokenizer"),
])
def test_an_unknown_key_names_the_nearest_valid_keys(root, typo, nearest):
    assert nearest_keys(typo)[0] == nearest
    with pytest.raises(RecipeError, match=rf"unknown key '{typo}'.*did you mean {nearest}\b"):
        archlab.load_recipe(root / "recipes/llama/tiny.yaml", [f"{typo}=1"])


def test_a_warmup_longer_than_a_short_run_is_capped_and_recorded(root):
    recipe = root / "recipes/llama/tiny.yaml"  # 30 warmup steps
    cfg = archlab.load_recipe(recipe, ["train.max_steps=20"])
    assert (cfg.train.warmup_steps, cfg.train.warmup_capped_from) == (2, 30)  # 10% of 20 steps
    assert archlab.load_recipe(recipe, ["train.max_steps=5"]).train.warmup_steps == 1  # at least one step
    fits = archlab.load_recipe(recipe, ["train.max_steps=30"])
    assert (fits.train.warmup_steps, fits.train.warmup_capped_from) == (30, None)
    # the user's own warmup stays refused, and the record cannot be set by hand
    with pytest.raises(RecipeError, match=r"train.warmup_steps=30: must lie in \[0, max_steps=20\]"):
        archlab.load_recipe(recipe, ["train.max_steps=20", "train.warmup_steps=30"])
    with pytest.raises(RecipeError, match="train.warmup_capped_from=30: set at load"):
        archlab.load_recipe(recipe, ["train.warmup_capped_from=30"])
