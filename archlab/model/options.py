"""The model node's choices and conditions (``archlab.options``): which keys each model type, component and
parametrisation reads, so that a key the selected ones do not read is refused by name."""

from __future__ import annotations

from archlab.config.schema import (
    BlockConfig,
    ModelConfig,
    MoEConfig,
    PositionConfig,
    RopeScalingConfig,
    RouterConfig,
)
from archlab.model.decoder import BLOCKS, MODELS
from archlab.nn.attention import MHAConfig
from archlab.nn.ffn import SwiGLUConfig
from archlab.nn.moe.router import ROUTERS
from archlab.nn.mup import PARAMETRIZATION_OPTIONS
from archlab.nn.positions import POSITIONS, ROPE_SCALINGS, position_class
from archlab.options import Choice, Condition, check, registry_options

MODEL_CHOICES: list[Choice] = [
    # the model type first: a key of another type is refused before its components are asked
    Choice("", "type", "model.type", "model type", ModelConfig, lambda: registry_options(MODELS)),
    # position first: on a position without RoPE every rope_scaling key is foreign
    Choice("position", "position.type", "position.type", "position", PositionConfig,
           lambda: registry_options(POSITIONS)),
    Choice("position.rope_scaling", "position.rope_scaling.type", "position.rope_scaling.type", "rope scaling",
           RopeScalingConfig, lambda: registry_options(ROPE_SCALINGS)),
    Choice("block", "block.type", "block.type", "block", BlockConfig, lambda: registry_options(BLOCKS)),
    Choice("moe.router", "moe.router.type", "moe.router.type", "router", RouterConfig,
           lambda: registry_options(ROUTERS)),
    Choice("", "parametrization", "parametrization", "parametrization", ModelConfig,
           lambda: dict(PARAMETRIZATION_OPTIONS)),
]

MODEL_CONDITIONS: list[Condition] = [
    Condition("attention.qk_norm_over", MHAConfig, "qk_norm_over", "attention.qk_norm is true",
              lambda m, _: getattr(m.attention, "qk_norm", True), lambda m, _: "attention.qk_norm=false"),
    Condition("attention.rotary_fraction", MHAConfig, "rotary_fraction", "the position rotates q and k (rope)",
              lambda m, _: not hasattr(m.attention, "rotary_fraction") or position_class(m).rotates_qk,
              lambda m, _: f"position.type={m.position.type}"),
    Condition("ffn.multiple_of", SwiGLUConfig, "multiple_of", "ffn.hidden is null (it rounds the default width)",
              lambda m, _: m.ffn.hidden is None or not hasattr(m.ffn, "multiple_of"),
              lambda m, _: f"ffn.hidden={m.ffn.hidden}"),
    Condition("moe.shared_hidden", MoEConfig, "shared_hidden", "moe.n_shared_experts > 0",
              lambda m, _: m.moe is None or m.moe.n_shared_experts > 0,
              lambda m, _: f"moe.n_shared_experts={m.moe.n_shared_experts}"),
    Condition("moe.min_capacity", MoEConfig, "min_capacity",
              "moe.capacity_factor is set (dropless routing has no capacity)",
              lambda m, _: m.moe is None or m.moe.capacity_factor is not None,
              lambda m, _: "moe.capacity_factor=None (dropless)"),
]


def check_model_options(m, prefix: str = "model") -> None:
    """Refuse a key of the ``model`` node ``m`` that the selected variants do not read."""
    check(m, m, prefix, MODEL_CHOICES, MODEL_CONDITIONS)
