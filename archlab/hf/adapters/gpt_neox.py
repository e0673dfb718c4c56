"""GPT-NeoX <-> archlab: the parallel block with two norms -> ``GPTNeoXForCausalLM`` (``use_parallel_residual``).

Shape legend: D model dim, H heads, Dh head dim.

Pre-LN LayerNorm, RoPE on the whole head, GELU/ReLU MLP (``ffn.approximate`` none: ``hidden_act: gelu``, Pythia's;
tanh: gelu_new), two norms of the same input
(``block.shared_norm: false``), MHA only (GQA/MQA key/value heads repeated into H heads), a bias archlab
does not have written as zeros. One fused projection whose rows are per head [q_h; k_h; v_h] where archlab's
are [q; k; v].
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from archlab.config.schema import ModelConfig
from archlab.hf.adapter import (
    ADAPTERS,
    HFAdapter,
    hf_activation,
    layernorm_sd,
    linear_with_bias_sd,
    mha_rows,
    refuse,
    rope_from_hf,
)
from archlab.hf.adapters.gptj import PARALLEL_EXPRESSES, parallel_node, parallel_reasons


@ADAPTERS.register("gpt_neox")
class GPTNeoXAdapter(HFAdapter):
    family = "gpt_neox"
    hf_class_name = "GPTNeoXForCausalLM"
    expresses = PARALLEL_EXPRESSES

    def matches(self, cfg: ModelConfig) -> Optional[str]:
        return parallel_reasons(cfg, shared_norm=False)

    def to_hf_config(self, cfg: ModelConfig):
        from transformers import GPTNeoXConfig

        return GPTNeoXConfig(
            vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers,
            num_attention_heads=cfg.n_heads, intermediate_size=cfg.ffn_hidden,
            hidden_act=hf_activation(cfg), attention_dropout=cfg.attention.dropout,
            hidden_dropout=cfg.dropout, max_position_embeddings=cfg.max_seq_len, initializer_range=cfg.init_std,
            layer_norm_eps=cfg.norm.eps, use_parallel_residual=True, attention_bias=cfg.attention.bias,
            rope_parameters={"rope_type": "default", "rope_theta": cfg.position.rope_base,
                             "partial_rotary_factor": 1.0},
            tie_word_embeddings=cfg.tie_embeddings, use_cache=True, bos_token_id=None, eos_token_id=None)

    def from_hf_config(self, c: dict) -> dict:
        if not c.get("use_parallel_residual", True):
            raise refuse("use_parallel_residual", False, "use_parallel_residual=true (the parallel block) only")
        params = c.get("rope_parameters") or {}
        partial = params.get("partial_rotary_factor", c.get("partial_rotary_factor", c.get("rotary_pct", 1.0)))
        if partial != 1.0:
            raise refuse("partial_rotary_factor", partial, "RoPE on the whole head only (1.0)")
        position = rope_from_hf(c)
        if position["rope_scaling"]["type"] != "none":
            raise refuse("rope_parameters.rope_type", params.get("rope_type"), "rope_type='default' for GPT-NeoX")
        node = parallel_node(c, d_model="hidden_size", n_layers="num_hidden_layers", n_heads="num_attention_heads",
                             max_seq_len="max_position_embeddings", eps="layer_norm_eps", act="hidden_act",
                             shared_norm=False)
        node["ffn"]["hidden"] = int(c["intermediate_size"])
        node.update(dropout=float(c.get("hidden_dropout", 0.0)), position=position,
                    attention={"type": "mha", "bias": bool(c.get("attention_bias", True)),
                               "dropout": float(c.get("attention_dropout", 0.0))})
        return node

    def to_hf(self, model) -> dict[str, Tensor]:
        cfg = model.cfg
        H, Dh = cfg.n_heads, cfg.d_head

        def per_head(t: Tensor) -> Tensor:  # [q; k; v] rows -> [q_h; k_h; v_h] for each head h
            return torch.stack([x.reshape(H, Dh, *t.shape[1:]) for x in mha_rows(t, cfg)], dim=1).flatten(0, 2)

        sd = {"gpt_neox.embed_in.weight": model.embed.weight, "lm_head.weight": model.lm_head.weight}
        sd.update(layernorm_sd("gpt_neox.final_layer_norm", model.final_norm))
        for i, blk in enumerate(model.blocks):
            p = f"gpt_neox.layers.{i}"
            sd.update(layernorm_sd(f"{p}.input_layernorm", blk.attn_norm))
            sd.update(layernorm_sd(f"{p}.post_attention_layernorm", blk.ffn_norm))
            sd[f"{p}.attention.query_key_value.weight"] = per_head(blk.attn.wqkv.weight)
            sd[f"{p}.attention.dense.weight"] = blk.attn.wo.weight
            if cfg.attention.bias:
                sd[f"{p}.attention.query_key_value.bias"] = per_head(blk.attn.wqkv.bias)
                sd[f"{p}.attention.dense.bias"] = blk.attn.wo.bias
            sd.update(linear_with_bias_sd(f"{p}.mlp.dense_h_to_4h", blk.ffn.up))
            sd.update(linear_with_bias_sd(f"{p}.mlp.dense_4h_to_h", blk.ffn.down))
        return sd
