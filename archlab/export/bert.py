"""Export encoders (``model.type: encoder``) to ``BertForMaskedLM``.

BERT: word + learned position + token-type embeddings, a LayerNorm on their sum, post-LN blocks (LayerNorm
after each residual sum) of bidirectional multi-head attention and a GELU (or ReLU) MLP, all with biases,
then the MLM head: dense + activation + LayerNorm, the decoder tied to the word embeddings, an output bias.
archlab expresses it as an encoder with ``embed_norm``, ``head_transform`` (and ``head_bias``), LayerNorm,
``placement: post``, learned positions and ``attention.type: mha``.

Written so that the logits are equal: archlab has no token-type embedding, so HF's one token type is a row
of zeros; a bias archlab does not have (attention, FFN, norms, the output bias) is written as zeros; GQA/MQA
key/value heads are repeated into H heads (BERT has MHA only). archlab's GELU is the tanh approximation
(``hidden_act: gelu_new``); BERT's head transform uses the same activation as its MLP, as archlab's does.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from archlab.config.schema import ModelConfig
from archlab.export.hf import EXPORTERS, HFExporter, _expand_kv, _split_qkv, component_reasons
from archlab.model.decoder import Decoder
from archlab.nn.ffn import ffn_class


@EXPORTERS.register("bert")
class BertExporter(HFExporter):
    hf_class_name = "BertForMaskedLM"
    tied_head_key = "cls.predictions.decoder.weight"

    def matches(self, cfg: ModelConfig) -> Optional[str]:
        why = component_reasons(cfg, "bert")
        if why is not None:
            return why
        if cfg.moe is not None:
            return "it has MoE layers (BERT is dense)"
        if cfg.norm.placement != "post":
            return f"norm.placement={cfg.norm.placement}: BERT is post-LN"
        if cfg.attention.qk_norm:
            return "attention.qk_norm=true: BERT has no per-head q/k norm"
        if cfg.attention.scale is not None:
            return f"attention.scale={cfg.attention.scale}: BERT always scales scores by 1/sqrt(d_head)"
        if not cfg.embed_norm:
            return "embed_norm=false: BERT always normalises the summed embeddings"
        if not cfg.head_transform:
            return "head_transform=false: BERT's MLM head always has its dense + activation + LayerNorm transform"
        return None

    def hf_config(self, cfg: ModelConfig):
        from transformers import BertConfig

        return BertConfig(
            vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers,
            num_attention_heads=cfg.n_heads, intermediate_size=cfg.ffn_hidden,
            hidden_act=ffn_class(cfg).hf_export["bert"], hidden_dropout_prob=cfg.dropout,
            attention_probs_dropout_prob=cfg.attention.dropout, max_position_embeddings=cfg.max_seq_len,
            type_vocab_size=1, initializer_range=cfg.init_std, layer_norm_eps=cfg.norm.eps,
            tie_word_embeddings=cfg.tie_embeddings, pad_token_id=None,
        )

    def state_dict(self, model: Decoder) -> dict[str, Tensor]:
        cfg = model.cfg
        D, V = cfg.d_model, cfg.vocab_size
        zeros = model.embed.weight.new_zeros
        e = "bert.embeddings"
        sd = {f"{e}.word_embeddings.weight": model.embed.weight,
              f"{e}.position_embeddings.weight": model.positions.table.weight,
              f"{e}.token_type_embeddings.weight": zeros(1, D)}  # no segments: one type, adding nothing
        sd.update(_norm(f"{e}.LayerNorm", model.embed_norm))
        for i, blk in enumerate(model.blocks):
            p = f"bert.encoder.layer.{i}"
            q, k, v = _split_qkv(blk.attn.wqkv.weight, cfg)
            qb, kb, vb = _split_qkv(blk.attn.wqkv.bias, cfg) if blk.attn.wqkv.bias is not None else (None,) * 3
            for name, w, b in (("query", q, qb), ("key", _expand_kv(k, cfg), kb), ("value", _expand_kv(v, cfg), vb)):
                sd[f"{p}.attention.self.{name}.weight"] = w
                sd[f"{p}.attention.self.{name}.bias"] = (b if name == "query" else _expand_kv(b, cfg)) \
                    if b is not None else zeros(w.shape[0])
            sd.update(_linear(f"{p}.attention.output.dense", blk.attn.wo))
            sd.update(_norm(f"{p}.attention.output.LayerNorm", blk.attn_norm))
            sd.update(_linear(f"{p}.intermediate.dense", blk.ffn.up))
            sd.update(_linear(f"{p}.output.dense", blk.ffn.down))
            sd.update(_norm(f"{p}.output.LayerNorm", blk.ffn_norm))
        t = "cls.predictions"
        sd.update(_linear(f"{t}.transform.dense", model.head_transform.dense))
        sd.update(_norm(f"{t}.transform.LayerNorm", model.head_transform.norm))
        bias = model.head_bias if model.head_bias is not None else zeros(V)
        sd[f"{t}.bias"] = sd[f"{t}.decoder.bias"] = bias  # one parameter in HF (the decoder's bias is tied to it)
        if not cfg.tie_embeddings:
            sd[f"{t}.decoder.weight"] = model.lm_head.weight
        return sd


def _linear(prefix: str, linear: torch.nn.Linear) -> dict[str, Tensor]:
    """nn.Linear -> weight and bias (zeros for a missing bias: BERT's layers all have one)."""
    bias = linear.bias if linear.bias is not None else linear.weight.new_zeros(linear.out_features)
    return {f"{prefix}.weight": linear.weight, f"{prefix}.bias": bias}


def _norm(prefix: str, norm: torch.nn.LayerNorm) -> dict[str, Tensor]:
    bias = norm.bias if norm.bias is not None else torch.zeros_like(norm.weight)
    return {f"{prefix}.weight": norm.weight, f"{prefix}.bias": bias}
