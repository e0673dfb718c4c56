"""Loading recipes: base chains, dotlist overrides, the typed model config."""

from pathlib import Path

import pytest

import archlab
from archlab.config import RecipeError
from archlab.config.schema import ModelConfig

ROOT = Path(__file__).resolve().parents[2]


def test_overrides_apply_after_the_file():
    cfg = archlab.load_recipe(ROOT / "recipes/llama/tiny.yaml", ["model.n_layers=2", "model.position.rope_base=500000"])
    assert cfg.model.n_layers == 2 and cfg.model.position.rope_base == 500000.0
    assert cfg.model.norm.type == "rmsnorm"  # the rest of the file is kept


def test_base_chain_merges_child_over_parent():
    cfg = archlab.load_recipe(ROOT / "recipes/llama/xs.yaml")
    assert cfg.name == "llama-xs" and cfg.model.d_model == 256  # child
    assert cfg.model.ffn.type == "swiglu" and cfg.family == "llama"  # inherited from tiny.yaml
    assert cfg.base is None


def test_schema_defaults_are_a_valid_recipe():
    cfg = archlab.load_recipe(None)
    assert archlab.build_model(cfg).cfg.d_model == cfg.model.d_model


def test_model_config_gives_the_typed_object_with_derived_sizes():
    cfg = archlab.load_recipe(ROOT / "recipes/llama/tiny.yaml")
    m = archlab.model_config(cfg)
    assert isinstance(m, ModelConfig)
    assert m.kv_heads == 2 and m.d_head == 24
    assert m.ffn_hidden == 256  # 8/3 * 96 = 256, already a multiple of 32
    assert archlab.model_config(cfg.model) == m and archlab.model_config(m) is m


def test_recipe_is_editable_after_loading():
    cfg = archlab.load_recipe(ROOT / "recipes/dense/tiny.yaml")
    cfg.train.max_steps = 5
    assert cfg.train.max_steps == 5


def test_a_missing_recipe_gets_the_nearest_recipe_files(monkeypatch):
    monkeypatch.chdir(ROOT)
    for typo in ("recipes/llama/tiny.yml", "recipes/lama/tiny.yaml", "llama/tiny.yaml"):
        with pytest.raises(RecipeError, match=r"did you mean recipes/llama/tiny\.yaml(,|\?)") as e:
            archlab.load_recipe(typo)
        assert str(e.value).startswith(f"recipe file not found: {typo}; ")
    with pytest.raises(RecipeError, match=f"did you mean {ROOT}/recipes/mixtral/tiny.yaml"):
        archlab.load_recipe(ROOT / "recipes/mixtral/tinny.yaml")  # an absolute path: absolute suggestions
    with pytest.raises(RecipeError, match=r"^recipe file not found: recipes/zzzz\.yaml \(the recipes are under "):
        archlab.load_recipe("recipes/zzzz.yaml")
