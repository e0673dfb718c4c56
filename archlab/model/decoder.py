"""The decoder-only transformer that stacks the building blocks a recipe names.

Shape legend: B batch, S sequence, D model dim, V vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor, nn

from archlab.config.schema import ModelConfig
from archlab.model.checkpointing import check_mode, checkpointed_block
from archlab.nn.attention import KVCache, LayerKVCache, attention_class, build_attention
from archlab.nn.ffn import build_ffn, ffn_class
from archlab.nn.loss import linear_cross_entropy
from archlab.nn.mup import readout_mult, rescale_init
from archlab.nn.norms import build_norm, norm_params
from archlab.nn.positions import PosContext, build_positions, position_class


@dataclass
class ModelOutput:
    logits: Optional[Tensor]  # (B, S, V); None when ``targets`` were given (the loss is fused)
    aux_loss: Tensor  # scalar: sum of the MoE balancing losses (0 for dense models)
    kv_cache: Optional[KVCache] = None
    loss: Optional[Tensor] = None  # mean next-token cross-entropy, when ``targets`` were given


def _moe_layer_cls():
    from archlab.nn.moe.layer import MoELayer  # imported on demand: dense models never need it

    return MoELayer


class Block(nn.Module):
    """One layer: attention then feed-forward, each a residual branch.

    pre-LN  (GPT-2, LLaMA):  x = x + f(norm(x))
    post-LN (2017):          x = norm(x + f(x))
    """

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.pre = cfg.norm.placement == "pre"
        self.attn_norm = build_norm(cfg, dim=cfg.d_model)
        self.attn = build_attention(cfg, layer=layer)
        self.ffn_norm = build_norm(cfg, dim=cfg.d_model)
        self.is_moe = cfg.is_moe_layer(layer)
        if self.is_moe:
            self.ffn = _moe_layer_cls()(cfg)
        else:
            self.ffn = build_ffn(cfg, hidden=cfg.ffn_hidden)
        self.drop = nn.Dropout(cfg.dropout)

    @staticmethod
    def num_params(cfg: ModelConfig, layer: int) -> int:
        n = 2 * norm_params(cfg, dim=cfg.d_model) + attention_class(cfg).num_params(cfg, layer=layer)
        if cfg.is_moe_layer(layer):
            return n + _moe_layer_cls().num_params(cfg)
        return n + ffn_class(cfg).num_params(cfg, hidden=cfg.ffn_hidden)

    def _ffn(self, x: Tensor) -> tuple[Tensor, Optional[Tensor]]:
        if self.is_moe:
            return self.ffn(x)  # (y, aux_loss)
        return self.ffn(x), None

    def forward(self, x_BSD: Tensor, ctx: PosContext, cache: Optional[LayerKVCache] = None):
        if self.pre:
            x = x_BSD + self.drop(self.attn(self.attn_norm(x_BSD), ctx, cache))
            h, aux = self._ffn(self.ffn_norm(x))
            return x + self.drop(h), aux
        x = self.attn_norm(x_BSD + self.drop(self.attn(x_BSD, ctx, cache)))
        h, aux = self._ffn(x)
        return self.ffn_norm(x + self.drop(h)), aux


class Decoder(nn.Module):
    """Token embedding (+ absolute positions) -> blocks -> final norm (pre-LN) -> LM head.

    ``checkpointing``: ``none | full | selective``, how the blocks keep activations for backward
    in training forwards (:mod:`archlab.model.checkpointing`); the trainer sets it from
    ``train.activation_checkpointing``. Outputs and gradients are the same in every mode.
    """

    def __init__(self, cfg: ModelConfig, checkpointing: str = "none"):
        super().__init__()
        self.cfg = cfg
        self.checkpointing = checkpointing
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.positions = build_positions(cfg)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        # post-LN already normalises each block's output; pre-LN needs a last norm
        self.final_norm = build_norm(cfg, dim=cfg.d_model) if cfg.norm.placement == "pre" else nn.Identity()
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.embed_scale = math.sqrt(cfg.d_model) if cfg.scale_embeddings else 1.0  # the input side only
        self.readout_mult = readout_mult(cfg)  # muP: logits * 1/m (tied or not); 1 under standard
        self.init_weights()

    @property
    def checkpointing(self) -> str:
        return self._checkpointing

    @checkpointing.setter
    def checkpointing(self, mode: str) -> None:
        self._checkpointing = check_mode(mode)

    @staticmethod
    def num_params(cfg: ModelConfig) -> int:
        """Parameter count from the config alone (tied weights counted once)."""
        n = cfg.vocab_size * cfg.d_model + position_class(cfg).num_params(cfg)
        n += sum(Block.num_params(cfg, i) for i in range(cfg.n_layers))
        if cfg.norm.placement == "pre":
            n += norm_params(cfg, dim=cfg.d_model)
        if not cfg.tie_embeddings:
            n += cfg.vocab_size * cfg.d_model
        return n

    @torch.no_grad()
    def init_weights(self) -> None:
        """N(0, init_std) for matrices and embeddings, zero biases; residual projections get
        init_std / sqrt(2 * n_layers) (GPT-2) so the residual stream's variance stays O(1).
        muP (m != 1): the blocks' matrices are then rescaled (``archlab.nn.mup.rescale_init``)."""
        std = self.cfg.init_std
        res_std = std / math.sqrt(2 * self.cfg.n_layers) if self.cfg.scaled_residual_init else std
        for m in self.modules():
            if hasattr(m, "init_weights") and m is not self:
                m.init_weights(std, res_std)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0.0, res_std if getattr(m, "is_residual_proj", False) else std)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, 0.0, std)
        rescale_init(self)

    def forward(self, input_ids: Tensor, kv_cache: Optional[KVCache] = None,
                targets: Optional[Tensor] = None) -> ModelOutput:
        """input_ids (B, S) -> logits (B, S, V). With ``kv_cache``, the ids continue the cached
        sequence and the cache is extended in place. With ``targets`` (B, S) (-100 = ignored),
        returns ``loss`` = mean cross-entropy instead of logits, computed by
        :func:`archlab.nn.loss.linear_cross_entropy` without materialising the (B, S, V) logits."""
        B, S = input_ids.shape
        past = kv_cache.length if kv_cache is not None else 0
        self.positions.check_length(past + S)  # on Python ints: no host read of a tensor value
        pos = torch.arange(past, past + S, device=input_ids.device)  # (S,)
        tok = self.embed(input_ids)  # (B, S, D)
        if self.embed_scale != 1.0:
            tok = tok * self.embed_scale
        x = self.positions.embed(tok, pos)  # (B, S, D)
        x = self.drop(x)
        ctx = self.positions.context(pos, torch.arange(past + S, device=input_ids.device))
        aux_total = x.new_zeros(())
        recompute = self.checkpointing != "none" and kv_cache is None and torch.is_grad_enabled()
        for i, block in enumerate(self.blocks):
            if recompute:
                x, aux = checkpointed_block(block, self.checkpointing, x, ctx)
            else:
                x, aux = block(x, ctx, kv_cache.layers[i] if kv_cache is not None else None)
            if aux is not None:
                aux_total = aux_total + aux
        h = self.final_norm(x)  # (B, S, D)
        if self.readout_mult != 1.0:  # muP: lm_head(h) / m, applied to h (D values per token, not V)
            h = h * self.readout_mult
        if targets is not None:
            loss = linear_cross_entropy(h.flatten(0, 1), self.lm_head.weight, targets.flatten())
            return ModelOutput(logits=None, aux_loss=aux_total, kv_cache=kv_cache, loss=loss)
        return ModelOutput(logits=self.lm_head(h), aux_loss=aux_total, kv_cache=kv_cache)  # (B, S, V)

    def new_kv_cache(self) -> KVCache:
        """An empty cache, each layer's as its attention variant keeps it (e.g. a rolling window)."""
        return KVCache(block.attn.new_cache() for block in self.blocks)
