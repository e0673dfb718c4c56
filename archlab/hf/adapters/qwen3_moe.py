"""Qwen3-MoE <-> archlab: LLaMA + per-head q/k RMSNorm + softmax top-k experts (renormalisation optional,
the first layers dense) -> ``Qwen3MoeForCausalLM``. The MoE layout is Mixtral's (``mixtral.py``)."""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from archlab.config.schema import ModelConfig
from archlab.hf.adapter import ADAPTERS, HFAdapter, component_reasons, refuse
from archlab.hf.adapters.llama import llama_node
from archlab.hf.adapters.mixtral import (
    MOE_EXPRESSES,
    dense_reasons,
    moe_config_kwargs,
    moe_decoder_sd,
    moe_node,
    moe_reasons,
)


@ADAPTERS.register("qwen3_moe")
class Qwen3MoeAdapter(HFAdapter):
    family = "qwen3_moe"
    hf_class_name = "Qwen3MoeForCausalLM"
    expresses = MOE_EXPRESSES

    def matches(self, cfg: ModelConfig) -> Optional[str]:
        if cfg.attention.type != "mha":  # the q/k norm keys are mha's
            return component_reasons(cfg, self.expresses)
        if not cfg.attention.qk_norm:
            return "attention.qk_norm=false: Qwen3 always normalises q and k per head"
        if cfg.attention.qk_norm_over != "head":
            return (f"attention.qk_norm_over={cfg.attention.qk_norm_over}: Qwen3 normalises q and k per head "
                    "(qk_norm_over=head)")
        why = moe_reasons(cfg, allow_dense_layers=True) or dense_reasons(cfg, qk_norm=False)
        if why is None and cfg.ffn.bias:
            why = "ffn.bias=true: Qwen3-MoE's dense MLP has no bias"
        return why

    def to_hf_config(self, cfg: ModelConfig):
        from transformers import Qwen3MoeConfig

        m = cfg.moe
        return Qwen3MoeConfig(**moe_config_kwargs(cfg), intermediate_size=cfg.ffn_hidden,
                              moe_intermediate_size=m.expert_hidden, num_experts=m.num_experts,
                              norm_topk_prob=m.router.renormalize, attention_bias=cfg.attention.bias,
                              decoder_sparse_step=1, use_sliding_window=False,
                              mlp_only_layers=[i for i in range(cfg.n_layers) if not cfg.is_moe_layer(i)])

    def from_hf_config(self, c: dict) -> dict:
        if c.get("use_sliding_window"):
            raise refuse("use_sliding_window", True, "use_sliding_window=false for Qwen3-MoE")
        dense = sorted(c.get("mlp_only_layers") or [])
        step = int(c.get("decoder_sparse_step", 1))
        if dense != list(range(len(dense))) or step != 1:
            raise refuse("mlp_only_layers", dense, "the first k layers dense (mlp_only_layers=[0..k-1]) and "
                         "decoder_sparse_step=1")
        node = llama_node(c)
        node["attention"]["qk_norm"] = True
        node["ffn"] = {"type": "swiglu", "bias": False, "hidden": int(c["intermediate_size"])}
        node["moe"] = moe_node(c, "num_experts", "moe_intermediate_size")
        node["moe"]["router"]["renormalize"] = bool(c.get("norm_topk_prob", True))
        node["moe"]["first_k_dense"] = len(dense)
        return node

    def to_hf(self, model) -> dict[str, Tensor]:
        return moe_decoder_sd(model, qk_norm=True)
