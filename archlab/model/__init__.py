"""Model assembly and generation."""

from archlab.model.build import build_model, num_params
from archlab.model.decoder import Block, Decoder, ModelOutput
from archlab.model.generate import generate

__all__ = ["Block", "Decoder", "ModelOutput", "build_model", "generate", "num_params"]
