"""``build_model(cfg)``: a recipe (or its model node) -> :class:`Decoder`."""

from __future__ import annotations

from typing import Optional, Union

import torch
from omegaconf import DictConfig

from archlab.config.load import model_config
from archlab.config.schema import ModelConfig
from archlab.config.validate import validate_model
from archlab.model.decoder import Decoder


def build_model(cfg: Union[DictConfig, ModelConfig], device: Optional[Union[str, torch.device]] = None) -> Decoder:
    """Build the decoder a recipe describes. ``device="meta"`` builds without allocating."""
    mcfg = model_config(cfg)
    validate_model(mcfg)
    if device is None:
        return Decoder(mcfg)
    with torch.device(device):
        return Decoder(mcfg)


def num_params(cfg: Union[DictConfig, ModelConfig]) -> int:
    """Total parameters of the model a recipe describes, without building it."""
    return Decoder.num_params(model_config(cfg))
