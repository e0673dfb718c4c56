"""BERT <-> archlab: encoders (``model.type: encoder``) -> ``BertForMaskedLM``.

BERT: word + learned position + token-type embeddings, a LayerNorm on their sum, post-LN blocks (LayerNorm
after each residual sum) of bidirectional multi-head attention and a GELU (or ReLU) MLP, all with biases,
then the MLM head: dense + activation + LayerNorm, the decoder tied to the word embeddings, an output bias.
archlab expresses it as an encoder with ``embed_norm``, ``head_transform`` (and ``head_bias``), LayerNorm,
``placement: post``, learned positions and ``attention.type: mha``.

archlab has no token-type embedding: an export writes one token type, a row of zeros; an import adds the
first type's row (what HF adds when no ``token_type_ids`` are given) to every position's row. A bias archlab
does not have is written as zeros; GQA/MQA key/value heads are repeated into H heads (BERT has MHA only).
GELU: ``ffn.approximate: none`` is BERT's exact ``hidden_act: gelu`` (the default), ``tanh`` its ``gelu_new``;
BERT's head transform uses the same activation as its MLP, as archlab's does.
"""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from archlab.config.schema import ModelConfig
from archlab.hf.adapter import (
    ADAPTERS,
    HFAdapter,
    component_reasons,
    dense_decoder_node,
    gelu_or_relu,
    hf_activation,
    layernorm_sd,
    linear_with_bias_sd,
    mha_rows,
    refuse,
)

E = "bert.embeddings"


@ADAPTERS.register("bert")
class BertAdapter(HFAdapter):
    family = "bert"
    hf_class_name = "BertForMaskedLM"
    tied_head_key = "cls.predictions.decoder.weight"
    expresses = {"type": ("encoder",), "attention.type": ("mha",), "norm.type": ("layernorm",),
                 "position.type": ("learned",), "ffn.type": ("gelu", "relu"), "block.type": ("sequential",)}

    def matches(self, cfg: ModelConfig) -> Optional[str]:
        why = component_reasons(cfg, self.expresses)
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

    def to_hf_config(self, cfg: ModelConfig):
        from transformers import BertConfig

        return BertConfig(
            vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers,
            num_attention_heads=cfg.n_heads, intermediate_size=cfg.ffn_hidden,
            hidden_act=hf_activation(cfg), hidden_dropout_prob=cfg.dropout,
            attention_probs_dropout_prob=cfg.attention.dropout, max_position_embeddings=cfg.max_seq_len,
            type_vocab_size=1, initializer_range=cfg.init_std, layer_norm_eps=cfg.norm.eps,
            tie_word_embeddings=cfg.tie_embeddings, pad_token_id=None,
        )

    def from_hf_config(self, c: dict) -> dict:
        if c.get("position_embedding_type", "absolute") != "absolute":
            raise refuse("position_embedding_type", c["position_embedding_type"], "'absolute' (learned positions)")
        if c.get("is_decoder") or c.get("add_cross_attention"):
            raise refuse("is_decoder", True, "BERT as an encoder (is_decoder=false) only")
        node = dense_decoder_node(c, d_model="hidden_size", n_layers="num_hidden_layers", n_heads="num_attention_heads",
                                  max_seq_len="max_position_embeddings", eps="layer_norm_eps")
        node.update(type="encoder", dropout=float(c.get("hidden_dropout_prob", 0.0)), embed_norm=True,
                    head_transform=True, head_bias=True, position={"type": "learned"}, block={"type": "sequential"},
                    attention={"type": "mha", "bias": True,
                               "dropout": float(c.get("attention_probs_dropout_prob", 0.0))})
        node["norm"].update(type="layernorm", placement="post", bias=True)
        node["ffn"] = {**gelu_or_relu(c, "hidden_act"), "bias": True, "hidden": int(c["intermediate_size"])}
        return node

    def prepare_hf(self, hf_sd: dict[str, Tensor], c: dict) -> dict[str, Tensor]:
        """Fold token type 0 into the position table (HF adds it to every position when no types are given)."""
        out = dict(hf_sd)
        types = out.pop(f"{E}.token_type_embeddings.weight", None)
        if types is not None:
            out[f"{E}.position_embeddings.weight"] = out[f"{E}.position_embeddings.weight"] + types[0]
        return out

    def to_hf(self, model) -> dict[str, Tensor]:
        cfg = model.cfg
        zeros = model.embed.weight.new_zeros
        sd = {f"{E}.word_embeddings.weight": model.embed.weight,
              f"{E}.position_embeddings.weight": model.positions.table.weight,
              f"{E}.token_type_embeddings.weight": zeros(1, cfg.d_model)}  # no segments: one type, adding nothing
        sd.update(layernorm_sd(f"{E}.LayerNorm", model.embed_norm))
        for i, blk in enumerate(model.blocks):
            p = f"bert.encoder.layer.{i}"
            w = mha_rows(blk.attn.wqkv.weight, cfg)
            b = mha_rows(blk.attn.wqkv.bias, cfg) if blk.attn.wqkv.bias is not None else \
                [zeros(t.shape[0]) for t in w]
            for name, wi, bi in zip(("query", "key", "value"), w, b):
                sd[f"{p}.attention.self.{name}.weight"] = wi
                sd[f"{p}.attention.self.{name}.bias"] = bi
            sd.update(linear_with_bias_sd(f"{p}.attention.output.dense", blk.attn.wo))
            sd.update(layernorm_sd(f"{p}.attention.output.LayerNorm", blk.attn_norm))
            sd.update(linear_with_bias_sd(f"{p}.intermediate.dense", blk.ffn.up))
            sd.update(linear_with_bias_sd(f"{p}.output.dense", blk.ffn.down))
            sd.update(layernorm_sd(f"{p}.output.LayerNorm", blk.ffn_norm))
        t = "cls.predictions"
        sd.update(linear_with_bias_sd(f"{t}.transform.dense", model.head_transform.dense))
        sd.update(layernorm_sd(f"{t}.transform.LayerNorm", model.head_transform.norm))
        bias = model.head_bias if model.head_bias is not None else zeros(cfg.vocab_size)
        sd[f"{t}.bias"] = sd[f"{t}.decoder.bias"] = bias  # one parameter in HF (the decoder's bias is tied to it)
        if not cfg.tie_embeddings:
            sd[f"{t}.decoder.weight"] = model.lm_head.weight
        return sd
