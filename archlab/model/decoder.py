"""The decoder-only transformer that stacks the building blocks a recipe names (``model.type: decoder``).

Shape legend: B batch, S sequence, D model dim, V vocabulary.

A model type is one class registered in :data:`MODELS` under its ``model.type`` name: this one, the
encoder (:mod:`archlab.model.encoder`, BERT) and the encoder-decoder (:mod:`archlab.model.encoder_decoder`,
T5) built on it. Each states ``causal`` (what its
attention layers are built with: each attention variant says whether it can run without the causal
mask), ``options`` (the ``model`` keys only it reads: ``archlab.config.options`` refuses them on another
type), ``validate`` (its rules on the ``model`` node), ``num_params``,
``block_class`` (its layer) and ``stacks`` (stacks of blocks, each with its own position
encoding); ``build_parts`` builds the parts only it has; ``kv_cache_bytes``: its inference cache per sequence.
The cost model (``archlab.costs``) composes its FLOPs and activations from these facts (``stacks``, ``causal``)
and the components' own counts; the model never imports the cost model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Optional

import torch
from torch import Tensor, nn

from archlab.config.schema import ModelConfig
from archlab.model.checkpointing import check_mode, checkpointed_block
from archlab.nn.attention import KVCache, LayerKVCache, attention_class, build_attention
from archlab.nn.component import ActShape
from archlab.nn.ffn import build_ffn, ffn_class
from archlab.nn.loss import linear_cross_entropy
from archlab.nn.moe.layer import MoELayer
from archlab.nn.mtp import MTPModule
from archlab.nn.mup import readout_mult, rescale_init
from archlab.nn.norms import build_norm, norm_class, norm_params
from archlab.nn.positions import PosContext, build_positions, position_params
from archlab.registry import Registry

MODELS: Registry = Registry("model")
BLOCKS: Registry = Registry("block")  # model.block.type: how a layer composes attention and FFN


@dataclass
class ModelOutput:
    logits: Optional[Tensor]  # (B, S, V); None when ``targets`` were given (the loss is fused)
    aux_loss: Tensor  # scalar: sum of the MoE balancing losses (0 for dense models)
    kv_cache: Optional[KVCache] = None
    loss: Optional[Tensor] = None  # mean next-token cross-entropy, when ``targets`` were given
    # (depth,): mean cross-entropy of each multi-token-prediction module, when ``targets`` reach that far
    mtp_losses: Optional[Tensor] = None


class Block(nn.Module):
    """One layer: attention then feed-forward, each a residual branch (``model.block.type: sequential``).

    pre-LN  (GPT-2, LLaMA):  x = x + f(norm(x))
    post-LN (2017):          x = norm(x + f(x))

    A block layout is one class in :data:`BLOCKS` (:mod:`archlab.model.parallel_block`: the parallel one);
    it states, as the components do, the ``model.block`` keys it reads (``options``), its rules
    (``validate``), its parameters and what its norms keep for backward (``norms_saved_bytes``,
    ``ffn_reads_attention_input``).
    """

    options: ClassVar[frozenset[str]] = frozenset()  # the keys of model.block it reads (besides type)

    def __init__(self, cfg: ModelConfig, layer: int, causal: bool = True):
        super().__init__()
        self.pre = cfg.norm.placement == "pre"
        self.attn_norm = build_norm(cfg, dim=cfg.d_model)
        self.attn = build_attention(cfg, layer=layer, causal=causal)  # causal=False: an encoder's
        self.ffn_norm = build_norm(cfg, dim=cfg.d_model)
        self.build_ffn(cfg, layer)
        self.drop = nn.Dropout(cfg.dropout)

    def build_ffn(self, cfg: ModelConfig, layer: int) -> None:
        """The feed-forward branch: routed experts on an MoE layer, else the dense FFN."""
        self.is_moe = cfg.is_moe_layer(layer)
        self.ffn = MoELayer(cfg) if self.is_moe else build_ffn(cfg, hidden=cfg.ffn_hidden)

    @classmethod
    def validate(cls, m, prefix: str = "model") -> None:
        """Rules of this layout on the ``model`` node (the sequential one has none)."""

    @staticmethod
    def n_norms(cfg: ModelConfig) -> int:
        return 2

    @classmethod
    def num_params(cls, cfg: ModelConfig, layer: int) -> int:
        n = cls.n_norms(cfg) * norm_params(cfg, dim=cfg.d_model)
        n += attention_class(cfg, layer).num_params(cfg, layer=layer)
        if cfg.is_moe_layer(layer):
            return n + MoELayer.num_params(cfg)
        return n + ffn_class(cfg).num_params(cfg.ffn, d_model=cfg.d_model, hidden=cfg.ffn_hidden)

    @staticmethod
    def norms_saved_bytes(s: ActShape) -> float:
        """What the block's norms keep for backward (``Norm.saved``), over the micro-batch: two norms, two inputs."""
        return 2 * s.n * norm_class(s.cfg).saved_bytes(s, dim=s.cfg.d_model)

    @staticmethod
    def ffn_reads_attention_input(cfg: ModelConfig) -> bool:
        """Whether the FFN branch's input is the attention's input tensor (kept for backward once, not twice)."""
        return False

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


BLOCKS.register("sequential")(Block)


def block_type(cfg) -> type[Block]:
    """The layer class ``model.block.type`` names (:data:`BLOCKS`)."""
    return BLOCKS.get(cfg.block.type)


@MODELS.register("decoder")
class Decoder(nn.Module):
    """Token embedding (+ absolute positions) -> blocks -> final norm (pre-LN) -> LM head.

    ``checkpointing``: ``none | full | selective``, how the blocks keep activations for backward
    in training forwards (:mod:`archlab.model.checkpointing`); the trainer sets it from
    ``train.activation_checkpointing``. Outputs and gradients are the same in every mode.
    """

    causal: ClassVar[bool] = True  # each query sees the keys at or before its position
    block_class: ClassVar[type[Block]] = Block  # one layer of the stack the LM head reads (Block: model.block's)
    stacks: ClassVar[int] = 1  # stacks of blocks, each with its own position encoding
    options: ClassVar[frozenset[str]] = frozenset({"mtp_depth", "block"})  # the model keys only this type reads
    # what a classification head may pool of hidden_states (archlab.nn.heads.POOLINGS), the first the convention:
    # GPT reads its last position (the only one that has seen the whole window; Radford et al. 2018), or the mean
    poolings: ClassVar[tuple[str, ...]] = ("last", "mean")
    pooling_refused: ClassVar[str] = ("position 0 of a causal decoder attends only to itself, so its state "
                                      "knows nothing of the rest of the window")

    @classmethod
    def validate(cls, m, prefix: str = "model") -> None:
        """Rules of this model type on the ``model`` node (the decoder has none of its own)."""

    def __init__(self, cfg: ModelConfig, checkpointing: str = "none"):
        super().__init__()
        self.cfg = cfg
        self.checkpointing = checkpointing
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.positions = build_positions(cfg, causal=self.causal)
        self.drop = nn.Dropout(cfg.dropout)
        layer = self.layer_class(cfg)
        self.blocks = nn.ModuleList(layer(cfg, i, causal=self.causal) for i in range(cfg.n_layers))
        # post-LN already normalises each block's output; pre-LN needs a last norm
        self.final_norm = build_norm(cfg, dim=cfg.d_model) if cfg.norm.placement == "pre" else nn.Identity()
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.embed_scale = math.sqrt(cfg.d_model) if cfg.scale_embeddings else 1.0  # the input side only
        self.readout_mult = readout_mult(cfg)  # muP: logits * 1/m (tied or not); 1 under standard
        self.build_parts(cfg)
        self.init_weights()

    @classmethod
    def layer_class(cls, cfg: ModelConfig) -> type[Block]:
        """The class of the stack's layers: the recipe's block layout where this model type reads it (``options``),
        else its own layer (``block_class``)."""
        return block_type(cfg) if "block" in cls.options else cls.block_class

    def build_parts(self, cfg: ModelConfig) -> None:
        """The parts only this model type has, before the weights are initialised."""
        if cfg.mtp_depth:  # multi-token prediction (archlab/nn/mtp.py): training only, dropped at export
            self.mtp = nn.ModuleList(MTPModule(cfg, block_type(cfg)) for _ in range(cfg.mtp_depth))

    @property
    def checkpointing(self) -> str:
        return self._checkpointing

    @checkpointing.setter
    def checkpointing(self, mode: str) -> None:
        self._checkpointing = check_mode(mode)

    @classmethod
    def num_params(cls, cfg: ModelConfig) -> int:
        """Parameter count from the config alone (tied weights counted once)."""
        n = cfg.vocab_size * cfg.d_model + position_params(cfg)
        n += sum(cls.layer_class(cfg).num_params(cfg, i) for i in range(cfg.n_layers))
        if cfg.norm.placement == "pre":
            n += norm_params(cfg, dim=cfg.d_model)
        if not cfg.tie_embeddings:
            n += cfg.vocab_size * cfg.d_model
        return n

    @classmethod
    def kv_cache_bytes(cls, cfg: ModelConfig, context: int, dtype_bytes: int,
                       memory_len: Optional[int] = None) -> float:
        """Inference cache of one sequence at ``context`` positions, summed over the layers as each attention
        variant keeps it; a model type that generates nothing keeps none."""
        if not cls.causal:
            return 0.0
        return float(sum(attention_class(cfg, i).kv_cache_bytes(cfg, context, layer=i, dtype_bytes=dtype_bytes)
                         for i in range(cfg.n_layers)))

    @staticmethod
    def num_mtp_params(cfg: ModelConfig) -> int:
        """Parameters of the multi-token-prediction modules: trained, never exported (not in :meth:`num_params`)."""
        return cfg.mtp_depth * MTPModule.num_params(cfg, block_type(cfg))

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
        :func:`archlab.nn.loss.linear_cross_entropy` without materialising the (B, S, V) logits.
        A model with ``mtp_depth`` = K modules also takes ``targets`` (B, S + K): the window's ids after
        the first; module k reads ``targets[:, k-1 : S+k-1]`` (the tokens k places ahead of the inputs)
        and predicts ``targets[:, k : S+k]``, and ``mtp_losses`` holds the K mean cross-entropies."""
        S = input_ids.shape[1]
        x, ctx, aux_total, run_block = self._stack(input_ids, kv_cache)
        h = self.final_norm(x)  # (B, S, D)
        if targets is None:
            logits_BSV = self.head_logits(h)
            return ModelOutput(logits=logits_BSV, aux_loss=aux_total, kv_cache=kv_cache)
        loss = self._head_loss(h, targets[:, :S])
        ahead = targets.shape[1] - S
        if ahead == 0 or not hasattr(self, "mtp"):
            if ahead:
                raise ValueError(f"targets {tuple(targets.shape)}: a model without MTP modules takes "
                                 f"(B, S={S}) targets")
            return ModelOutput(logits=None, aux_loss=aux_total, kv_cache=kv_cache, loss=loss)
        if ahead != len(self.mtp):
            raise ValueError(f"targets {tuple(targets.shape)}: with {len(self.mtp)} MTP modules, targets are "
                             f"(B, S or S + {len(self.mtp)}) for inputs (B, S={S})")
        mtp_losses = []
        for k, module in enumerate(self.mtp, start=1):  # depth k: embeddings of t_{i+k}, targets t_{i+k+1}
            emb = self.embed(targets[:, k - 1:S + k - 1])  # (B, S, D)
            if self.embed_scale != 1.0:
                emb = emb * self.embed_scale
            x, aux = module(x, emb, ctx, run_block)
            if aux is not None:
                aux_total = aux_total + aux
            mtp_losses.append(self._head_loss(module.out_norm(x), targets[:, k:S + k]))
        return ModelOutput(logits=None, aux_loss=aux_total, kv_cache=kv_cache, loss=loss,
                           mtp_losses=torch.stack(mtp_losses))

    def _stack(self, input_ids: Tensor, kv_cache: Optional[KVCache] = None):
        """Embedding and blocks: (x (B, S, D) before the final norm, the position context, the summed MoE
        aux loss, the block runner (checkpointed in training forwards when ``checkpointing`` says so))."""
        S = input_ids.shape[1]
        past = kv_cache.length if kv_cache is not None else 0
        self.positions.check_length(past + S)  # on Python ints: no host read of a tensor value
        pos = torch.arange(past, past + S, device=input_ids.device)  # (S,)
        x = self.drop(self.embed_tokens(input_ids, pos))  # (B, S, D)
        ctx = self.positions.context(pos, torch.arange(past + S, device=input_ids.device))
        aux_total = x.new_zeros(())
        recompute = self.checkpointing != "none" and kv_cache is None and torch.is_grad_enabled()

        def run_block(block: Block, x_BSD: Tensor, ctx: PosContext, cache: Optional[LayerKVCache] = None):
            if recompute:
                return checkpointed_block(block, self.checkpointing, x_BSD, ctx)
            return block(x_BSD, ctx, cache)

        for i, block in enumerate(self.blocks):
            x, aux = run_block(block, x, ctx, kv_cache.layers[i] if kv_cache is not None else None)
            if aux is not None:
                aux_total = aux_total + aux
        return x, ctx, aux_total, run_block

    def hidden_states(self, input_ids: Tensor) -> tuple[Tensor, Tensor]:
        """(the final hidden states (B, S, D) the LM head reads, after the final norm; the summed MoE aux loss):
        what a classification head pools (:mod:`archlab.model.classifier`)."""
        x, _, aux, _ = self._stack(input_ids)
        return self.final_norm(x), aux

    def embed_tokens(self, input_ids_BS: Tensor, pos_S: Tensor) -> Tensor:
        """Token embeddings (scaled when ``scale_embeddings``) with the absolute positions added: (B, S, D)."""
        tok = self.embed(input_ids_BS)  # (B, S, D)
        if self.embed_scale != 1.0:
            tok = tok * self.embed_scale
        return self.positions.embed(tok, pos_S)

    def head_logits(self, h_BSD: Tensor) -> Tensor:
        """The LM head's logits (B, S, V) of the last hidden states (after the final norm)."""
        return self.lm_head(self._readout(h_BSD))

    def _readout(self, h_BSD: Tensor) -> Tensor:
        """muP: lm_head(h) / m, applied to h (D values per token, not V); the identity under standard."""
        return h_BSD * self.readout_mult if self.readout_mult != 1.0 else h_BSD

    def _head_loss(self, h_BSD: Tensor, targets_BS: Tensor) -> Tensor:
        """Mean cross-entropy of the LM head on the normalised ``h`` against ``targets``, fused (no logits)."""
        return linear_cross_entropy(self._readout(h_BSD).flatten(0, 1), self.lm_head.weight, targets_BS.flatten())

    def new_kv_cache(self) -> KVCache:
        """An empty cache, each layer's as its attention variant keeps it (e.g. a rolling window)."""
        return KVCache(block.attn.new_cache() for block in self.blocks)
