"""Recipes: schema, loading and validation."""

from archlab.config.load import load_recipe, model_config
from archlab.config.schema import (
    BalanceConfig,
    DataConfig,
    FFNConfig,
    ModelConfig,
    MoEConfig,
    NormConfig,
    PositionConfig,
    Recipe,
    RouterConfig,
    TrainConfig,
)
from archlab.config.validate import RecipeError, validate

__all__ = [
    "BalanceConfig", "DataConfig", "FFNConfig", "ModelConfig", "MoEConfig", "NormConfig",
    "PositionConfig", "Recipe", "RecipeError", "RouterConfig", "TrainConfig",
    "load_recipe", "model_config", "validate",
]
