"""The encoder-only transformer (``model.type: encoder``): BERT (Devlin et al. 2019).

Shape legend: B batch, S sequence, D model dim, V vocabulary.

The same stack as the decoder (:class:`archlab.model.decoder.Decoder`: embedding, positions, blocks,
LM head), with every attention layer built with ``causal=False``: each position sees the whole
window, both sides. The attention variant and the position encoding say whether they can
(``supports_bidirectional``); the others are refused by name. It is trained by masked-token
prediction (``train.objective: mlm``, :mod:`archlab.objectives.mlm`): it has no KV cache and does not
generate.

BERT's parts, each an option only this model type reads:

- ``embed_norm``: a norm on the summed embeddings, before the embedding dropout;
- ``head_transform``: dense D -> D, the FFN's activation and a norm before the LM head
  (:class:`archlab.nn.heads.HeadTransform`);
- ``head_bias``: a bias on the logits.

BERT's token-type (segment) embedding is not modelled: with one segment it adds the same learned
vector to every position.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from archlab.config.schema import ModelConfig
from archlab.errors import fail
from archlab.model.decoder import MODELS, Decoder, ModelOutput
from archlab.nn.attention import KVCache, attention_class
from archlab.nn.heads import HeadTransform
from archlab.nn.loss import linear_cross_entropy
from archlab.nn.norms import build_norm, norm_params
from archlab.nn.positions import position_class

NO_CACHE = ("model.type=encoder: an encoder attends to both sides of every position, so there is no KV cache "
            "to extend and nothing to generate left to right; it predicts masked tokens (model(ids).logits)")


@MODELS.register("encoder")
class Encoder(Decoder):
    """Token embedding + positions (-> embedding norm) -> bidirectional blocks -> final norm (pre-LN)
    (-> head transform) -> LM head (+ bias)."""

    causal = False
    options = frozenset({"embed_norm", "head_transform", "head_bias"})
    # BERT reads its first position ([CLS]'s; Devlin et al. 2019, sec. 3) or the mean; every position sees the window
    poolings = ("first", "mean", "last")
    pooling_refused = ""  # every position sees the whole window

    @classmethod
    def validate(cls, m, prefix: str = "model") -> None:
        """Every component must run without the causal mask; the head transform needs an activation."""
        attention = attention_class(m)
        if not attention.supports_bidirectional:
            fail(f"{prefix}.attention.type", m.attention.type,
                 f"model.type=encoder needs bidirectional attention: {attention.bidirectional_unsupported}")
        position = position_class(m)
        if not position.supports_bidirectional:
            fail(f"{prefix}.position.type", m.position.type,
                 "model.type=encoder needs a position encoding that works without the causal mask: "
                 f"{position.bidirectional_unsupported}")
        if m.parametrization != "standard":
            fail(f"{prefix}.parametrization", m.parametrization, "model.type=encoder is verified under standard "
                 "parametrisation only (muP's scaling of the MLM head transform is not derived)")
        if m.head_transform:
            HeadTransform.validate(m, prefix)

    @classmethod
    def num_params(cls, cfg: ModelConfig) -> int:
        n = super().num_params(cfg)
        if cfg.embed_norm:
            n += norm_params(cfg, dim=cfg.d_model)
        if cfg.head_transform:
            n += HeadTransform.num_params(cfg)
        return n + (cfg.vocab_size if cfg.head_bias else 0)

    def build_parts(self, cfg: ModelConfig) -> None:
        self.embed_norm = build_norm(cfg, dim=cfg.d_model) if cfg.embed_norm else None
        self.head_transform = HeadTransform(cfg) if cfg.head_transform else None
        self.head_bias = nn.Parameter(torch.zeros(cfg.vocab_size)) if cfg.head_bias else None  # zero init (BERT)

    def forward(self, input_ids: Tensor, kv_cache: Optional[KVCache] = None,
                targets: Optional[Tensor] = None) -> ModelOutput:
        """input_ids (B, S) -> logits (B, S, V), every position seeing the whole window; with ``targets``
        (B, S) (-100 = not predicted), ``loss`` = the mean cross-entropy over the predicted positions."""
        if kv_cache is not None:
            raise ValueError(NO_CACHE)
        return super().forward(input_ids, targets=targets)

    def new_kv_cache(self) -> KVCache:
        raise ValueError(NO_CACHE)

    def embed_tokens(self, input_ids_BS: Tensor, pos_S: Tensor) -> Tensor:
        x = super().embed_tokens(input_ids_BS, pos_S)
        return self.embed_norm(x) if self.embed_norm is not None else x

    def _transform(self, h_BSD: Tensor) -> Tensor:
        return self.head_transform(h_BSD) if self.head_transform is not None else h_BSD

    def head_logits(self, h_BSD: Tensor) -> Tensor:
        logits_BSV = super().head_logits(self._transform(h_BSD))
        return logits_BSV + self.head_bias if self.head_bias is not None else logits_BSV

    def _head_loss(self, h_BSD: Tensor, targets_BS: Tensor) -> Tensor:
        h = self._readout(self._transform(h_BSD))
        return linear_cross_entropy(h.flatten(0, 1), self.lm_head.weight, targets_BS.flatten(), bias_V=self.head_bias)
