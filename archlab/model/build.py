"""``build_model(cfg)``: a recipe (or its model node) -> the model its ``model.type`` names
(:class:`Decoder`, :class:`Encoder` or :class:`EncoderDecoder`)."""

from __future__ import annotations

from typing import Optional, Union

import torch
from omegaconf import DictConfig

from archlab.config.schema import ModelConfig, model_config
from archlab.model import encoder, encoder_decoder  # noqa: F401  (register model.type encoder, encoder_decoder)
from archlab.model.decoder import MODELS, Decoder
from archlab.model.validate import validate_model


def model_class(cfg) -> type[Decoder]:
    """The class of the model type a ``model`` node names (``model.type``)."""
    return MODELS.get(getattr(cfg, "type", "decoder"))


def build_model(cfg: Union[DictConfig, ModelConfig], device: Optional[Union[str, torch.device]] = None) -> Decoder:
    """Build the model a recipe describes. ``device="meta"`` builds without allocating."""
    mcfg = model_config(cfg)
    validate_model(mcfg)
    if device is None:
        return model_class(mcfg)(mcfg)
    with torch.device(device):
        return model_class(mcfg)(mcfg)


def num_params(cfg: Union[DictConfig, ModelConfig]) -> int:
    """Total parameters of the model a recipe describes, without building it."""
    mcfg = model_config(cfg)
    return model_class(mcfg).num_params(mcfg)
