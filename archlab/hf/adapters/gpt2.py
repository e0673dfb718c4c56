"""GPT-2 <-> archlab: pre-LN LayerNorm, learned positions, GELU/ReLU MLP -> ``GPT2LMHeadModel``.

GELU: ``ffn.approximate: tanh`` is GPT-2's ``activation_function: gelu_new``, ``none`` the exact ``gelu``.

GPT-2 has MHA only: GQA/MQA key/value heads are repeated into H heads (exact, larger); an import is MHA.
GPT-2 always has biases: a bias archlab does not have is written as zeros (exact); an import has them all.
GPT-2's Conv1D stores weights as (in, out): archlab's (out, in) Linear weights are transposed.
"""

from __future__ import annotations

import torch
from torch import Tensor

from archlab.config.schema import ModelConfig
from archlab.hf.adapter import (
    ADAPTERS,
    HFAdapter,
    common_reasons,
    component_reasons,
    dense_decoder_node,
    gelu_or_relu,
    hf_activation,
    layernorm_sd,
    mha_rows,
    refuse,
)


def conv1d_sd(prefix: str, linear: torch.nn.Linear) -> dict[str, Tensor]:
    """nn.Linear (out, in) -> HF Conv1D (in, out); a missing bias becomes zeros."""
    bias = linear.bias if linear.bias is not None else linear.weight.new_zeros(linear.out_features)
    return {f"{prefix}.weight": linear.weight.T, f"{prefix}.bias": bias}


@ADAPTERS.register("gpt2")
class GPT2Adapter(HFAdapter):
    family = "gpt2"
    hf_class_name = "GPT2LMHeadModel"
    expresses = {"type": ("decoder",), "attention.type": ("mha",), "norm.type": ("layernorm",),
                 "position.type": ("learned",), "ffn.type": ("gelu", "relu"), "block.type": ("sequential",)}

    def matches(self, cfg: ModelConfig):
        return component_reasons(cfg, self.expresses) or common_reasons(cfg)

    def to_hf_config(self, cfg: ModelConfig):
        from transformers import GPT2Config

        return GPT2Config(
            vocab_size=cfg.vocab_size, n_positions=cfg.max_seq_len, n_embd=cfg.d_model,
            n_layer=cfg.n_layers, n_head=cfg.n_heads, n_inner=cfg.ffn_hidden,
            activation_function=hf_activation(cfg), layer_norm_epsilon=cfg.norm.eps,
            resid_pdrop=cfg.dropout, embd_pdrop=cfg.dropout, attn_pdrop=cfg.attention.dropout,
            initializer_range=cfg.init_std, tie_word_embeddings=cfg.tie_embeddings, use_cache=True,
            bos_token_id=None, eos_token_id=None,  # GPT-2's 50256 may lie outside this vocabulary
        )

    def from_hf_config(self, c: dict) -> dict:
        for key, want in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                          ("add_cross_attention", False)):
            if c.get(key, want) != want:
                raise refuse(key, c[key], f"{key}={want} only (GPT-2's standard attention)")
        node = dense_decoder_node(c, d_model="n_embd", n_layers="n_layer", n_heads="n_head",
                                  max_seq_len="n_positions", eps="layer_norm_epsilon")
        node.update(type="decoder", dropout=float(c.get("resid_pdrop", 0.0)),
                    position={"type": "learned"},
                    attention={"type": "mha", "bias": True, "dropout": float(c.get("attn_pdrop", 0.0))},
                    block={"type": "sequential"})
        node["norm"].update(type="layernorm", placement="pre", bias=True)
        node["ffn"] = {**gelu_or_relu(c, "activation_function"), "bias": True,
                       "hidden": int(c.get("n_inner") or 4 * c["n_embd"])}
        return node

    def to_hf(self, model) -> dict[str, Tensor]:
        cfg = model.cfg
        sd = {"transformer.wte.weight": model.embed.weight, "transformer.wpe.weight": model.positions.table.weight,
              "lm_head.weight": model.lm_head.weight}
        sd.update(layernorm_sd("transformer.ln_f", model.final_norm))
        for i, blk in enumerate(model.blocks):
            p = f"transformer.h.{i}"
            sd.update(layernorm_sd(f"{p}.ln_1", blk.attn_norm))
            sd.update(layernorm_sd(f"{p}.ln_2", blk.ffn_norm))
            sd[f"{p}.attn.c_attn.weight"] = torch.cat(mha_rows(blk.attn.wqkv.weight, cfg)).T  # (D, 3D)
            b = blk.attn.wqkv.bias
            sd[f"{p}.attn.c_attn.bias"] = torch.cat(mha_rows(b, cfg)) if b is not None else \
                blk.attn.wqkv.weight.new_zeros(3 * cfg.d_model)
            sd.update(conv1d_sd(f"{p}.attn.c_proj", blk.attn.wo))
            sd.update(conv1d_sd(f"{p}.mlp.c_fc", blk.ffn.up))
            sd.update(conv1d_sd(f"{p}.mlp.c_proj", blk.ffn.down))
        return sd
