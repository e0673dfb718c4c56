"""Export encoder-decoders (``model.type: encoder_decoder``) to ``T5ForConditionalGeneration``.

T5: one token table shared by both stacks and the LM head, pre-LN RMSNorm (``T5LayerNorm``), attention without
biases whose scores are not scaled, a relative position bias per stack (held by its first layer, shared by
all), a ReLU MLP without biases, the decoder's output scaled by d_model^-1/2 before the tied head. archlab
expresses it as an encoder-decoder with ``norm.type: rmsnorm``, ``placement: pre``, ``position.type: relative``,
``ffn.type: relu``, no biases and tied embeddings.

Written so that the logits are equal: archlab scales scores by ``attention.scale`` (default 1/sqrt(d_head)), T5
by 1, so the query projections are written multiplied by the scale (q k^T s = (s q) k^T); GQA/MQA key/value
heads are repeated into H heads (T5 has MHA only); the decoder's start id is archlab's
(:func:`archlab.objectives.span_corruption.start_id`), T5's ``decoder_start_token_id``.
"""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from archlab.config.schema import ModelConfig
from archlab.export.hf import EXPORTERS, HFExporter, _expand_kv, component_reasons
from archlab.nn.ffn import ffn_class
from archlab.objectives.span_corruption import start_id


@EXPORTERS.register("t5")
class T5Exporter(HFExporter):
    hf_class_name = "T5ForConditionalGeneration"
    tied_head_key = "lm_head.weight"

    def matches(self, cfg: ModelConfig) -> Optional[str]:
        why = component_reasons(cfg, "t5")
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

    def hf_config(self, cfg: ModelConfig):
        from transformers import T5Config

        return T5Config(
            vocab_size=cfg.vocab_size, d_model=cfg.d_model, d_kv=cfg.d_head, d_ff=cfg.ffn_hidden,
            num_layers=cfg.n_layers, num_decoder_layers=cfg.n_layers, num_heads=cfg.n_heads,
            relative_attention_num_buckets=cfg.position.relative_buckets,
            relative_attention_max_distance=cfg.position.relative_max_distance,
            dropout_rate=cfg.dropout, layer_norm_epsilon=cfg.norm.eps, feed_forward_proj=ffn_class(cfg).hf_export["t5"],
            decoder_start_token_id=start_id(cfg.vocab_size), initializer_factor=1.0,
        )

    def state_dict(self, model) -> dict[str, Tensor]:
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
    return {f"{prefix}.q.weight": q * attn.scale, f"{prefix}.k.weight": _expand_kv(k, cfg),
            f"{prefix}.v.weight": _expand_kv(v, cfg), f"{prefix}.o.weight": attn.wo.weight}


def _cross_attention(prefix: str, cross, cfg: ModelConfig) -> dict[str, Tensor]:
    k, v = cross.wkv.weight.split([cfg.kv_heads * cfg.d_head] * 2, dim=0)
    return {f"{prefix}.q.weight": cross.wq.weight * cross.scale, f"{prefix}.k.weight": _expand_kv(k, cfg),
            f"{prefix}.v.weight": _expand_kv(v, cfg), f"{prefix}.o.weight": cross.wo.weight}
