"""GPT-J <-> archlab: the parallel block with one shared norm -> ``GPTJForCausalLM``.

Shape legend: D model dim, H heads, Dh head dim, V vocabulary.

Pre-LN LayerNorm, RoPE on the whole head, GELU/ReLU MLP (``ffn.approximate`` tanh: gelu_new, none: gelu), one
norm feeding both branches (``block.shared_norm: true``, PaLM's layout too), no attention biases, RoPE base
10000. MHA only (GQA/MQA key/value heads repeated into H heads: exact, larger). GPT-J rotates pairs of
adjacent channels (2i, 2i+1) where archlab rotates (i, i + Dh/2): the q and k rows of each head are permuted
to match (q.k is unchanged by a permutation applied to both). Its LM head has a bias, written as zeros (an
import refuses a nonzero one).
"""

from __future__ import annotations

from typing import Optional

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
    linear_with_bias_sd,
    mha_rows,
    refuse,
)

GPTJ_ROPE_BASE = 10000.0  # GPT-J's sinusoid table hard-codes it
PARALLEL_EXPRESSES = {"type": ("decoder",), "attention.type": ("mha",), "norm.type": ("layernorm",),
                      "position.type": ("rope",), "position.rope_scaling.type": ("none",),
                      "ffn.type": ("gelu", "relu"), "block.type": ("parallel",)}


def parallel_reasons(cfg: ModelConfig, shared_norm: bool) -> Optional[str]:
    why = component_reasons(cfg, PARALLEL_EXPRESSES) or common_reasons(cfg)
    if why is not None:
        return why
    if cfg.block.shared_norm != shared_norm:
        return (f"block.shared_norm={cfg.block.shared_norm}: this class's parallel layer has "
                f"{'one shared norm' if shared_norm else 'two norms'}")
    return None


def parallel_node(c: dict, *, d_model: str, n_layers: str, n_heads: str, max_seq_len: str, eps: str, act: str,
                  shared_norm: bool) -> dict:
    """The recipe's ``model`` node of a parallel-block decoder (LayerNorm, RoPE, GELU/ReLU MLP with biases)."""
    node = dense_decoder_node(c, d_model=d_model, n_layers=n_layers, n_heads=n_heads, max_seq_len=max_seq_len,
                              eps=eps)
    node.update(type="decoder", block={"type": "parallel", "shared_norm": shared_norm})
    node["norm"].update(type="layernorm", placement="pre", bias=True)
    node["ffn"] = {**gelu_or_relu(c, act), "bias": True}
    return node


@ADAPTERS.register("gptj")
class GPTJAdapter(HFAdapter):
    family = "gptj"
    hf_class_name = "GPTJForCausalLM"
    expresses = PARALLEL_EXPRESSES

    def matches(self, cfg: ModelConfig) -> Optional[str]:
        why = parallel_reasons(cfg, shared_norm=True)
        if why is not None:
            return why
        if cfg.attention.bias:
            return "attention.bias=true: GPT-J's attention projections have no biases"
        if cfg.position.rope_base != GPTJ_ROPE_BASE:
            return f"position.rope_base={cfg.position.rope_base}: GPT-J's RoPE base is {GPTJ_ROPE_BASE:g}"
        return None

    def to_hf_config(self, cfg: ModelConfig):
        from transformers import GPTJConfig

        return GPTJConfig(
            vocab_size=cfg.vocab_size, n_positions=cfg.max_seq_len, n_embd=cfg.d_model, n_layer=cfg.n_layers,
            n_head=cfg.n_heads, rotary_dim=cfg.d_head, n_inner=cfg.ffn_hidden,
            activation_function=hf_activation(cfg), resid_pdrop=cfg.dropout,
            embd_pdrop=cfg.dropout, attn_pdrop=cfg.attention.dropout, layer_norm_epsilon=cfg.norm.eps,
            initializer_range=cfg.init_std, tie_word_embeddings=cfg.tie_embeddings, use_cache=True,
            bos_token_id=None, eos_token_id=None)

    def from_hf_config(self, c: dict) -> dict:
        d_head = c["n_embd"] // c["n_head"]
        if c.get("rotary_dim") not in (None, d_head):
            raise refuse("rotary_dim", c["rotary_dim"], f"RoPE on the whole head only (rotary_dim={d_head})")
        node = parallel_node(c, d_model="n_embd", n_layers="n_layer", n_heads="n_head", max_seq_len="n_positions",
                             eps="layer_norm_epsilon", act="activation_function", shared_norm=True)
        node["ffn"]["hidden"] = int(c.get("n_inner") or 4 * c["n_embd"])
        node.update(dropout=float(c.get("resid_pdrop", 0.0)),
                    position={"type": "rope", "rope_base": GPTJ_ROPE_BASE, "rope_scaling": {"type": "none"}},
                    attention={"type": "mha", "bias": False, "dropout": float(c.get("attn_pdrop", 0.0))})
        return node

    def to_hf(self, model) -> dict[str, Tensor]:
        cfg = model.cfg
        half = cfg.d_head // 2
        # GPT-J channel 2i holds archlab's i, channel 2i + 1 archlab's i + Dh/2 (each head)
        pair = torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).flatten()  # (Dh,)
        perm = (torch.arange(cfg.n_heads)[:, None] * cfg.d_head + pair).flatten()  # (H*Dh,)
        sd = {"transformer.wte.weight": model.embed.weight, "lm_head.weight": model.lm_head.weight,
              "lm_head.bias": model.lm_head.weight.new_zeros(cfg.vocab_size)}
        sd.update(layernorm_sd("transformer.ln_f", model.final_norm))
        for i, blk in enumerate(model.blocks):
            p = f"transformer.h.{i}"
            q, k, v = mha_rows(blk.attn.wqkv.weight, cfg)
            sd.update(layernorm_sd(f"{p}.ln_1", blk.attn_norm))
            sd.update({f"{p}.attn.q_proj.weight": q[perm], f"{p}.attn.k_proj.weight": k[perm],
                       f"{p}.attn.v_proj.weight": v, f"{p}.attn.out_proj.weight": blk.attn.wo.weight})
            sd.update(linear_with_bias_sd(f"{p}.mlp.fc_in", blk.ffn.up))
            sd.update(linear_with_bias_sd(f"{p}.mlp.fc_out", blk.ffn.down))
        return sd
