"""The model layer checks its own node: ``build_model`` refuses a broken model config without the recipe
loader (``archlab.config``) above it, with the rule's message."""

from __future__ import annotations

import pytest

from archlab.config.schema import ModelConfig
from archlab.config.validate import validate_model as recipe_validate_model
from archlab.errors import RecipeError
from archlab.model.build import build_model
from archlab.model.validate import validate_model
from archlab.nn.attention import SlidingWindowConfig
from archlab.nn.positions import PositionConfig


def small(**kw) -> ModelConfig:
    return ModelConfig(vocab_size=64, max_seq_len=16, d_model=16, n_layers=1, n_heads=2, **kw)


def test_build_model_refuses_an_odd_rotated_head_dim():
    with pytest.raises(RecipeError, match=r"model.n_heads=2: rope rotates pairs of channels: the rotated head dim "
                                          r"= 15 must be even"):
        build_model(ModelConfig(vocab_size=64, max_seq_len=16, d_model=30, n_layers=1, n_heads=2,
                                position=PositionConfig(type="rope")), device="meta")


def test_an_odd_head_dim_is_fine_without_rope():
    build_model(ModelConfig(vocab_size=64, max_seq_len=16, d_model=30, n_layers=1, n_heads=2), device="meta")


def test_a_model_config_refuses_a_key_the_chosen_attention_does_not_read():
    """The type chooses the dataclass without the loader too: a sliding window's config under type mha."""
    with pytest.raises(RecipeError, match=r"model.attention.window=8: not a key of attention.type mha \(its keys: "
                                          r".*\); window is read by attention.type sliding_window"):
        small(attention=SlidingWindowConfig(type="mha", window=8))


def test_the_recipe_validator_runs_the_model_layers_rules():
    assert recipe_validate_model is validate_model
