"""T5 <-> archlab: encoder-decoders (``model.type: encoder_decoder``) -> ``T5ForConditionalGeneration``.

T5: one token table shared by both stacks and the LM head, pre-LN RMSNorm (``T5LayerNorm``), attention without
biases whose scores are not scaled, a relative position bias per stack (held by its first layer, shared by
all), a ReLU MLP without biases, the decoder's output scaled by d_model^-1/2 before the tied head. archlab
expresses it as an encoder-decoder with ``norm.type: rmsnorm``, ``placement: pre``, ``position.type: relative``,
``ffn.type: relu``, no biases and tied embeddings.

archlab scales scores by ``attention.scale`` (default 1/sqrt(d_head)), T5 by 1, so an export writes the query
projections multiplied by the scale (q k^T s = (s q) k^T) and an import sets ``attention.scale: 1.0`` (the
weights unchanged). GQA/MQA key/value heads are repeated into H heads (T5 has MHA only). The decoder's start
id is archlab's (:func:`archlab.objectives.span_corruption.start_id`, the vocabulary's last row), T5's
``decoder_start_token_id``: a config with another start id is refused.
"""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from archlab.config.schema import ModelConfig
from archlab.hf.adapter import ADAPTERS, HFAdapter, component_reasons, expand_kv, refuse, require
from archlab.objectives.span_corruption import start_id

T5_MAX_SEQ_LEN = 512  # T5 has no position table: the length archlab builds caches for


@ADAPTERS.register("t5")
class T5Adapter(HFAdapter):
    family = "t5"
    hf_class_name = "T5ForConditionalGeneration"
    expresses = {"type": ("encoder_decoder",), "norm.type": ("rmsnorm",), "position.type": ("relative",),
                 "ffn.type": ("relu",), "block.type": ("sequential",), "attention.type": ("mha",)}

    def matches(self, cfg: ModelConfig) -> Optional[str]:
        why = component_reasons(cfg, self.expresses)
        if why is not None:
            return why
        if cfg.norm.placement != "pre":
            return f"norm.placement={cfg.norm.placement}: T5 is pre-LN"
        if cfg.attention.bias or cfg.ffn.bias:
            return "attention.bias / ffn.bias: T5's projections have no biases"
        if cfg.attention.qk_norm:
            return "attention.qk_norm=true: T5 has no per-head q/k norm"
        if not cfg.tie_embeddings:
            return "tie_embeddings=false: transformers' T5 always ties its LM head to the shared token table"
        return None

    def to_hf_config(self, cfg: ModelConfig):
        from transformers import T5Config

        return T5Config(
            vocab_size=cfg.vocab_size, d_model=cfg.d_model, d_kv=cfg.d_head, d_ff=cfg.ffn_hidden,
            num_layers=cfg.n_layers, num_decoder_layers=cfg.n_layers, num_heads=cfg.n_heads,
            relative_attention_num_buckets=cfg.position.relative_buckets,
            relative_attention_max_distance=cfg.position.relative_max_distance,
            dropout_rate=cfg.dropout, layer_norm_epsilon=cfg.norm.eps, feed_forward_proj="relu",
            decoder_start_token_id=start_id(cfg.vocab_size), initializer_factor=1.0,
        )

    def from_hf_config(self, c: dict) -> dict:
        require(c, "feed_forward_proj", ("relu",), "feed_forward_proj='relu' (T5 v1.0's MLP) only")
        require(c, "tie_word_embeddings", (True,), "tie_word_embeddings=true (the head tied to the shared table)")
        d, heads, layers = int(c["d_model"]), int(c["num_heads"]), int(c["num_layers"])
        if int(c["d_kv"]) * heads != d:
            raise refuse("d_kv", c["d_kv"], f"d_kv = d_model / num_heads ({d // heads}) only")
        if int(c.get("num_decoder_layers") or layers) != layers:
            raise refuse("num_decoder_layers", c["num_decoder_layers"], f"as many as num_layers ({layers})")
        vocab = int(c["vocab_size"])
        if c.get("decoder_start_token_id") != start_id(vocab):
            raise refuse("decoder_start_token_id", c.get("decoder_start_token_id"),
                         f"the vocabulary's last id ({start_id(vocab)}), archlab's decoder start")
        return {"type": "encoder_decoder", "vocab_size": vocab, "d_model": d, "n_layers": layers, "n_heads": heads,
                "max_seq_len": int(c.get("n_positions") or T5_MAX_SEQ_LEN), "tie_embeddings": True,
                "dropout": float(c.get("dropout_rate", 0.0)),
                "norm": {"type": "rmsnorm", "placement": "pre", "eps": float(c.get("layer_norm_epsilon", 1e-6))},
                "position": {"type": "relative", "relative_buckets": int(c["relative_attention_num_buckets"]),
                             "relative_max_distance": int(c["relative_attention_max_distance"])},
                "attention": {"type": "mha", "bias": False, "scale": 1.0},
                "ffn": {"type": "relu", "bias": False, "hidden": int(c["d_ff"])}, "block": {"type": "sequential"}}

    def to_hf(self, model) -> dict[str, Tensor]:
        cfg = model.cfg
        sd = {"shared.weight": model.embed.weight, "encoder.embed_tokens.weight": model.embed.weight,
              "decoder.embed_tokens.weight": model.embed.weight}
        for side, blocks, positions, norm in (("encoder", model.encoder_blocks, model.encoder_positions,
                                               model.encoder_norm),
                                              ("decoder", model.blocks, model.positions, model.final_norm)):
            sd[f"{side}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] = positions.table.weight
            sd[f"{side}.final_layer_norm.weight"] = norm.weight
            for i, blk in enumerate(blocks):
                p = f"{side}.block.{i}.layer"
                sd.update(_self_attention(f"{p}.0.SelfAttention", blk.attn, cfg))
                sd[f"{p}.0.layer_norm.weight"] = blk.attn_norm.weight
                ff = 1
                if side == "decoder":
                    sd.update(_cross_attention(f"{p}.1.EncDecAttention", blk.cross, cfg))
                    sd[f"{p}.1.layer_norm.weight"] = blk.cross_norm.weight
                    ff = 2
                sd[f"{p}.{ff}.DenseReluDense.wi.weight"] = blk.ffn.up.weight
                sd[f"{p}.{ff}.DenseReluDense.wo.weight"] = blk.ffn.down.weight
                sd[f"{p}.{ff}.layer_norm.weight"] = blk.ffn_norm.weight
        return sd


def _self_attention(prefix: str, attn, cfg: ModelConfig) -> dict[str, Tensor]:
    """Fused [q; k; v] rows -> q (scaled by the score scale), k, v; K/V heads repeated into H."""
    h, g, dh = cfg.n_heads, cfg.kv_heads, cfg.d_head
    q, k, v = attn.wqkv.weight.split([h * dh, g * dh, g * dh], dim=0)
    return {f"{prefix}.q.weight": q * attn.scale, f"{prefix}.k.weight": expand_kv(k, cfg),
            f"{prefix}.v.weight": expand_kv(v, cfg), f"{prefix}.o.weight": attn.wo.weight}


def _cross_attention(prefix: str, cross, cfg: ModelConfig) -> dict[str, Tensor]:
    k, v = cross.wkv.weight.split([cfg.kv_heads * cfg.d_head] * 2, dim=0)
    return {f"{prefix}.q.weight": cross.wq.weight * cross.scale, f"{prefix}.k.weight": expand_kv(k, cfg),
            f"{prefix}.v.weight": expand_kv(v, cfg), f"{prefix}.o.weight": cross.wo.weight}
