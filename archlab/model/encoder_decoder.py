"""The encoder-decoder transformer (``model.type: encoder_decoder``): T5 (Raffel et al. 2020), the 2017
Transformer's layout.

Shape legend: B batch, M encoder (input) positions, S decoder positions, D model dim, V vocabulary.

Two stacks of ``n_layers`` blocks each, one token embedding shared by both and by a tied LM head:

- the encoder: its own position encoding built bidirectional (T5's relative bias: two-sided buckets) and
  blocks with ``causal=False`` (:class:`archlab.model.decoder.Block`, as the encoder-only model's), then a
  final norm (pre-LN): the memory (B, M, D);
- the decoder: causal self-attention with its own position encoding (one-sided buckets), cross-attention
  to the memory (:class:`archlab.nn.attention.cross.CrossAttention`) and the FFN, each a residual branch
  (:class:`CrossBlock`), a final norm and the LM head over its S positions.

With tied embeddings the decoder's output is scaled by D^-1/2 before the LM head (T5: the shared table is
initialised at unit scale; HF's ``scale_decoder_outputs``). It is trained by span corruption
(``train.objective: span_corruption``, :mod:`archlab.objectives.span_corruption`); the decoder's inputs are
its targets shifted right behind a start id. Generation (:func:`archlab.model.generate.generate_seq2seq`)
encodes once and decodes against a cache holding each decoder layer's self-attention keys/values and its
cross-attention keys/values of the memory, projected once per sequence (:class:`Seq2SeqCache`).

Layout: the decoder side keeps the decoder-only model's names (``embed``, ``positions``, ``blocks``,
``final_norm``, ``lm_head``), the encoder's are prefixed (``encoder_positions``, ``encoder_blocks``,
``encoder_norm``).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from archlab.config.schema import ModelConfig
from archlab.errors import fail
from archlab.model.checkpointing import checkpointed_block
from archlab.model.decoder import MODELS, Block, Decoder, ModelOutput
from archlab.nn.attention import KVCache, LayerKVCache, attention_class
from archlab.nn.attention.cross import CrossAttention
from archlab.nn.norms import build_norm, norm_params
from archlab.nn.positions import PosContext, build_positions, position_class, position_params


class CrossBlock(Block):
    """A decoder layer of an encoder-decoder: causal self-attention, cross-attention to the memory, FFN.

    pre-LN (T5):    x = x + f(norm(x)) for each of the three
    post-LN (2017): x = norm(x + f(x)) for each of the three
    """

    def __init__(self, cfg: ModelConfig, layer: int, causal: bool = True):
        super().__init__(cfg, layer, causal=causal)
        self.cross_norm = build_norm(cfg, dim=cfg.d_model)
        self.cross = CrossAttention(cfg)

    @staticmethod
    def num_params(cfg: ModelConfig, layer: int) -> int:
        return Block.num_params(cfg, layer) + norm_params(cfg, dim=cfg.d_model) + CrossAttention.num_params(cfg)

    def forward(self, x_BSD: Tensor, ctx: PosContext, cache: Optional[LayerKVCache] = None,
                memory_BMD: Optional[Tensor] = None, cross_cache: Optional[LayerKVCache] = None):
        if self.pre:
            x = x_BSD + self.drop(self.attn(self.attn_norm(x_BSD), ctx, cache))
            x = x + self.drop(self.cross(self.cross_norm(x), memory_BMD, cross_cache))
            h, aux = self._ffn(self.ffn_norm(x))
            return x + self.drop(h), aux
        x = self.attn_norm(x_BSD + self.drop(self.attn(x_BSD, ctx, cache)))
        x = self.cross_norm(x + self.drop(self.cross(x, memory_BMD, cross_cache)))
        h, aux = self._ffn(x)
        return self.ffn_norm(x + self.drop(h)), aux


class Seq2SeqCache(KVCache):
    """The decoder's self-attention caches (``layers``, grown one position per step), each decoder layer's
    cross-attention keys/values of the memory (``cross``, filled at the first step) and the memory itself."""

    def __init__(self, layers: list[LayerKVCache], memory_BMD: Tensor):
        super().__init__(layers)
        self.cross = [LayerKVCache() for _ in self.layers]
        self.memory = memory_BMD


@MODELS.register("encoder_decoder")
class EncoderDecoder(Decoder):
    """Shared embedding -> encoder stack -> memory; shared embedding -> decoder stack (self, cross, FFN)
    -> final norm -> (x D^-1/2 when tied) -> LM head."""

    causal = True  # the decoder's self-attention; the encoder's is built with causal=False
    block_class = CrossBlock
    stacks = 2
    options = frozenset()
    # a classification head pools the encoder's output (hidden_states: the memory), by the mean by convention
    poolings = ("mean", "first", "last")
    pooling_refused = ""  # every position sees the whole window

    @classmethod
    def validate(cls, m, prefix: str = "model") -> None:
        """The encoder stack runs without the causal mask; MoE, MTP and muP are not derived for two stacks."""
        attention = attention_class(m)
        if not attention.supports_bidirectional:
            fail(f"{prefix}.attention.type", m.attention.type, "model.type=encoder_decoder needs bidirectional "
                 f"attention for its encoder stack: {attention.bidirectional_unsupported}")
        position = position_class(m)
        if not position.supports_bidirectional:
            fail(f"{prefix}.position.type", m.position.type, "model.type=encoder_decoder needs a position "
                 f"encoding that works without the causal mask: {position.bidirectional_unsupported}")
        if position.max_length(m) is not None:
            fail(f"{prefix}.position.type", m.position.type, "model.type=encoder_decoder: the encoder's input and "
                 "the decoder's targets have their own lengths; use a position encoding without a table "
                 "(relative, rope, sinusoidal, none)")
        if m.parametrization != "standard":
            fail(f"{prefix}.parametrization", m.parametrization, "model.type=encoder_decoder is verified under "
                 "standard parametrisation only")
        if m.moe is not None:
            fail(f"{prefix}.moe", "set", "model.type=encoder_decoder: MoE layers in two stacks are not modelled "
                 "(the cost model and the routing statistics assume one stack); remove model.moe")

    @staticmethod
    def num_params(cfg: ModelConfig) -> int:
        d = cfg.d_model
        n = cfg.vocab_size * d + 2 * position_params(cfg)  # shared table; a table per stack
        n += sum(Block.num_params(cfg, i) + CrossBlock.num_params(cfg, i) for i in range(cfg.n_layers))
        if cfg.norm.placement == "pre":
            n += 2 * norm_params(cfg, dim=d)
        return n + (0 if cfg.tie_embeddings else cfg.vocab_size * d)

    @classmethod
    def kv_cache_bytes(cls, cfg: ModelConfig, context: int, dtype_bytes: int,
                       memory_len: Optional[int] = None) -> float:
        """The decoder's self-attention cache of ``context`` generated positions, plus each decoder layer's
        cross-attention keys/values of the ``memory_len`` (default ``context``) encoder positions, computed
        once per sequence (``CrossAttention.kv_cache_bytes``)."""
        memory = context if memory_len is None else memory_len
        return (super().kv_cache_bytes(cfg, context, dtype_bytes)
                + cfg.n_layers * CrossAttention.kv_cache_bytes(cfg, memory, dtype_bytes=dtype_bytes))

    def build_parts(self, cfg: ModelConfig) -> None:
        self.encoder_positions = build_positions(cfg, causal=False)
        self.encoder_blocks = nn.ModuleList(Block(cfg, i, causal=False) for i in range(cfg.n_layers))
        self.encoder_norm = build_norm(cfg, dim=cfg.d_model) if cfg.norm.placement == "pre" else nn.Identity()
        # T5 ties the head to a unit-scale table and rescales the decoder's output by D^-1/2
        self.head_scale = cfg.d_model ** -0.5 if cfg.tie_embeddings else 1.0

    @torch.no_grad()
    def init_weights(self) -> None:
        """The decoder-only model's init; a tied token table at unit scale (T5's: the head reads it through the
        D^-1/2 output scale, so the first logits are O(1))."""
        super().init_weights()
        if self.cfg.tie_embeddings:
            nn.init.normal_(self.embed.weight, 0.0, 1.0)

    def _run(self, block: nn.Module, x: Tensor, ctx: PosContext, cache: Optional[LayerKVCache] = None,
             memory: Optional[Tensor] = None, cross_cache: Optional[LayerKVCache] = None):
        """One block (a decoder block with the memory), checkpointed in training forwards when
        ``checkpointing`` says so."""
        if self.checkpointing != "none" and cache is None and torch.is_grad_enabled():
            return checkpointed_block(block, self.checkpointing, x, ctx, memory)
        return block(x, ctx) if memory is None else block(x, ctx, cache, memory, cross_cache)

    def encode(self, input_ids: Tensor) -> Tensor:
        """input_ids (B, M) -> the memory (B, M, D): the encoder's final hidden states."""
        M = input_ids.shape[1]
        pos = torch.arange(M, device=input_ids.device)
        x = self.drop(self._embed(input_ids, self.encoder_positions))  # (B, M, D)
        ctx = self.encoder_positions.context(pos, pos)
        for block in self.encoder_blocks:
            x, _ = self._run(block, x, ctx)
        return self.drop(self.encoder_norm(x))

    def hidden_states(self, input_ids: Tensor) -> tuple[Tensor, Tensor]:
        """(the encoder's output (B, M, D), a zero aux loss): what a classification head pools; the decoder
        does not run."""
        memory = self.encode(input_ids)
        return memory, memory.new_zeros(())

    def forward(self, input_ids: Tensor, decoder_input_ids: Optional[Tensor] = None,
                kv_cache: Optional[Seq2SeqCache] = None, targets: Optional[Tensor] = None) -> ModelOutput:
        """input_ids (B, M) and decoder_input_ids (B, S) -> logits (B, S, V) of each decoder position's next
        target. With ``kv_cache`` (:meth:`new_kv_cache`), the memory is the cache's and ``input_ids`` may be None;
        the decoder ids continue the cached ones. With ``targets`` (B, S) (-100 = ignored): ``loss`` = the mean
        cross-entropy instead of logits (fused, no (B, S, V) tensor)."""
        if decoder_input_ids is None:
            raise ValueError("model.type=encoder_decoder: pass decoder_input_ids (B, S), the targets shifted "
                             "right behind the start id (archlab.objectives.span_corruption)")
        memory = kv_cache.memory if kv_cache is not None else self.encode(input_ids)
        S = decoder_input_ids.shape[1]
        past = kv_cache.length if kv_cache is not None else 0
        pos = torch.arange(past, past + S, device=decoder_input_ids.device)
        x = self.drop(self._embed(decoder_input_ids, self.positions, past))  # (B, S, D)
        ctx = self.positions.context(pos, torch.arange(past + S, device=decoder_input_ids.device))
        for i, block in enumerate(self.blocks):
            cache, cross = (kv_cache.layers[i], kv_cache.cross[i]) if kv_cache is not None else (None, None)
            x, _ = self._run(block, x, ctx, cache, memory, cross)
        h = self.drop(self.final_norm(x))  # (B, S, D)
        zero = h.new_zeros(())
        if targets is None:
            return ModelOutput(logits=self.head_logits(h), aux_loss=zero, kv_cache=kv_cache)
        return ModelOutput(logits=None, aux_loss=zero, kv_cache=kv_cache, loss=self._head_loss(h, targets))

    def _embed(self, ids_BS: Tensor, positions: nn.Module, past: int = 0) -> Tensor:
        """The shared token embedding (scaled when ``scale_embeddings``) plus the stack's absolute positions,
        if it has any (positions past ... past + S - 1)."""
        tok = self.embed(ids_BS)
        if self.embed_scale != 1.0:
            tok = tok * self.embed_scale
        return positions.embed(tok, torch.arange(past, past + ids_BS.shape[1], device=ids_BS.device))

    def _readout(self, h_BSD: Tensor) -> Tensor:
        return h_BSD * self.head_scale if self.head_scale != 1.0 else h_BSD

    def new_kv_cache(self, input_ids: Optional[Tensor] = None, memory: Optional[Tensor] = None) -> Seq2SeqCache:
        """A cache for decoding against the memory of ``input_ids`` (B, M) (encoded here) or a given memory."""
        if memory is None:
            if input_ids is None:
                raise ValueError("model.type=encoder_decoder: new_kv_cache(input_ids) encodes the input the "
                                 "decoder attends to; pass input_ids (B, M) or memory (B, M, D)")
            memory = self.encode(input_ids)
        return Seq2SeqCache([block.attn.new_cache() for block in self.blocks], memory)

