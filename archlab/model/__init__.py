"""Model assembly and generation: the decoder (``model.type: decoder``) and the encoder (``encoder``)."""

from archlab.model.build import build_model, model_class, num_params
from archlab.model.decoder import MODELS, Block, Decoder, ModelOutput
from archlab.model.encoder import Encoder
from archlab.model.generate import generate

__all__ = ["MODELS", "Block", "Decoder", "Encoder", "ModelOutput", "build_model", "generate", "model_class",
           "num_params"]
