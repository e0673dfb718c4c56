"""Model assembly and generation: the decoder (``model.type: decoder``), the encoder (``encoder``)
and the encoder-decoder (``encoder_decoder``)."""

from archlab.model.build import build_model, model_class, num_params
from archlab.model.decoder import MODELS, Block, Decoder, ModelOutput
from archlab.model.encoder import Encoder
from archlab.model.encoder_decoder import EncoderDecoder, Seq2SeqCache
from archlab.model.generate import generate, generate_seq2seq
from archlab.model.parallel_block import ParallelBlock  # registers model.block.type parallel

__all__ = ["MODELS", "Block", "Decoder", "Encoder", "EncoderDecoder", "ModelOutput", "Seq2SeqCache", "build_model",
           "ParallelBlock", "generate", "generate_seq2seq", "model_class", "num_params"]
