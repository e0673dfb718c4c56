"""LLaMA <-> archlab: pre-LN RMSNorm, RoPE (none|linear|yarn scaling), SwiGLU, GQA -> ``LlamaForCausalLM``.

Fused ``wqkv`` rows split into q/k/v_proj, fused ``gate_up`` rows into gate/up_proj; biases map onto HF's
``attention_bias`` / ``mlp_bias``. The LLaMA layout (names, the config's shared fields) is reused by
Mistral, Mixtral, Qwen3-MoE and DeepSeek-V3 (``llama_*`` below).
"""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from archlab.config.schema import ModelConfig
from archlab.hf.adapter import (
    ADAPTERS,
    HFAdapter,
    common_reasons,
    component_reasons,
    dense_decoder_node,
    linear_sd,
    refuse,
    require,
    rope_from_hf,
    rope_parameters,
    split_qkv,
)

LLAMA_EXPRESSES = {"type": ("decoder",), "attention.type": ("mha",), "norm.type": ("rmsnorm",),
                   "position.type": ("rope",), "position.rope_scaling.type": ("none", "linear", "yarn"),
                   "ffn.type": ("swiglu",), "block.type": ("sequential",)}


def llama_config_kwargs(cfg: ModelConfig) -> dict:
    """The config fields every LLaMA-layout HF class (Llama, Mistral, Mixtral, Qwen3-MoE) shares."""
    return dict(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.kv_heads, head_dim=cfg.d_head, hidden_act="silu",
        max_position_embeddings=cfg.max_seq_len, rms_norm_eps=cfg.norm.eps, rope_parameters=rope_parameters(cfg),
        attention_dropout=cfg.attention.dropout, initializer_range=cfg.init_std,
        tie_word_embeddings=cfg.tie_embeddings, use_cache=True,
    )


def llama_node(c: dict) -> dict:
    """The recipe's ``model`` node for the fields every LLaMA-layout config shares (attention bias and the
    MLP are the family's)."""
    require(c, "hidden_act", ("silu",), "hidden_act='silu' (SwiGLU) for this family")
    heads, d = int(c["num_attention_heads"]), int(c["hidden_size"])
    if c.get("head_dim") not in (None, d // heads):
        raise refuse("head_dim", c["head_dim"], f"head_dim = hidden_size / num_attention_heads ({d // heads}) only")
    if c.get("pretraining_tp", 1) != 1:
        raise refuse("pretraining_tp", c["pretraining_tp"], "pretraining_tp=1 only")
    node = dense_decoder_node(c, d_model="hidden_size", n_layers="num_hidden_layers", n_heads="num_attention_heads",
                              max_seq_len="max_position_embeddings", eps="rms_norm_eps")
    kv = c.get("num_key_value_heads")
    node.update(type="decoder", n_kv_heads=int(kv) if kv is not None else None, dropout=0.0,
                position=rope_from_hf(c), block={"type": "sequential"},
                attention={"type": "mha", "bias": bool(c.get("attention_bias", False)),
                           "dropout": float(c.get("attention_dropout", 0.0))})
    node["norm"].update(type="rmsnorm", placement="pre")
    return node


def llama_layout_sd(model, block_sd) -> dict[str, Tensor]:
    """The LLaMA layout's tensors: embedding, final norm, head and each layer's two norms, plus
    ``block_sd(prefix, block)`` for the layer's attention and MLP (``prefix`` = ``model.layers.i``)."""
    sd = {"model.embed_tokens.weight": model.embed.weight, "model.norm.weight": model.final_norm.weight,
          "lm_head.weight": model.lm_head.weight}
    for i, blk in enumerate(model.blocks):
        p = f"model.layers.{i}"
        sd[f"{p}.input_layernorm.weight"] = blk.attn_norm.weight
        sd[f"{p}.post_attention_layernorm.weight"] = blk.ffn_norm.weight
        sd.update(block_sd(p, blk))
    return sd


def llama_attention_sd(prefix: str, blk, cfg: ModelConfig) -> dict[str, Tensor]:
    """Fused ``wqkv`` rows (and bias entries) -> q/k/v_proj, ``wo`` -> o_proj."""
    sd: dict[str, Tensor] = {}
    for name, t in (("weight", blk.attn.wqkv.weight), ("bias", blk.attn.wqkv.bias)):
        if t is not None:
            q, k, v = split_qkv(t, cfg)
            sd.update({f"{prefix}.q_proj.{name}": q, f"{prefix}.k_proj.{name}": k, f"{prefix}.v_proj.{name}": v})
    sd.update(linear_sd(f"{prefix}.o_proj", blk.attn.wo))
    return sd


def swiglu_mlp_sd(prefix: str, ffn) -> dict[str, Tensor]:
    """A SwiGLU FFN (``gate_up`` rows [gate ; up], biases if any) -> gate_proj / up_proj / down_proj."""
    sd: dict[str, Tensor] = {}
    for name, t in (("weight", ffn.gate_up.weight), ("bias", ffn.gate_up.bias)):
        if t is not None:
            gate, up = t.chunk(2, dim=0)
            sd.update({f"{prefix}.gate_proj.{name}": gate, f"{prefix}.up_proj.{name}": up})
    sd.update(linear_sd(f"{prefix}.down_proj", ffn.down))
    return sd


@ADAPTERS.register("llama")
class LlamaAdapter(HFAdapter):
    family = "llama"
    hf_class_name = "LlamaForCausalLM"
    expresses = LLAMA_EXPRESSES

    def matches(self, cfg: ModelConfig) -> Optional[str]:
        return component_reasons(cfg, self.expresses) or common_reasons(cfg)

    def to_hf_config(self, cfg: ModelConfig):
        from transformers import LlamaConfig

        return LlamaConfig(**llama_config_kwargs(cfg), intermediate_size=cfg.ffn_hidden,
                           attention_bias=cfg.attention.bias, mlp_bias=cfg.ffn.bias)

    def from_hf_config(self, c: dict) -> dict:
        node = llama_node(c)
        node["ffn"] = {"type": "swiglu", "hidden": int(c["intermediate_size"]), "bias": bool(c.get("mlp_bias", False))}
        return node

    def to_hf(self, model) -> dict[str, Tensor]:
        return llama_layout_sd(model, lambda p, blk: {**llama_attention_sd(f"{p}.self_attn", blk, model.cfg),
                                                      **swiglu_mlp_sd(f"{p}.mlp", blk.ffn)})
