"""Mixtral <-> archlab: LLaMA + every layer a softmax top-k MoE block -> ``MixtralForCausalLM``.

Shape legend: D model dim, E experts, F expert hidden dim.

Mixtral (and Qwen3-MoE, ``qwen3_moe.py``) stack each layer's experts as 3-D weights: ``gate_up_proj``
(E, 2F, D) with [gate; up] rows and ``down_proj`` (E, D, F); archlab stores the transposes, ``w_up`` (E, D, 2F)
and ``w_down`` (E, F, D). Neither class has shared experts, a selection bias, group-limited routing, a route
scale or capacity dropping. HF computes its auxiliary loss K times larger than archlab's (see
archlab.nn.moe.balance), so ``router_aux_loss_coef`` is archlab's ``aux_loss_coeff / K``. HF Mixtral's
training jitter acts on the experts' input as well; an export is for inference (jitter 0), an import
trains without it.
"""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from archlab.config.schema import ModelConfig
from archlab.hf.adapter import ADAPTERS, HFAdapter, component_reasons, refuse
from archlab.hf.adapters.llama import (
    LLAMA_EXPRESSES,
    LlamaAdapter,
    llama_attention_sd,
    llama_config_kwargs,
    llama_layout_sd,
    llama_node,
    swiglu_mlp_sd,
)

MOE_EXPRESSES = {**LLAMA_EXPRESSES, "moe.router.type": ("softmax_topk",)}


def moe_reasons(cfg: ModelConfig, allow_dense_layers: bool) -> Optional[str]:
    """Why the MoE layers of ``cfg`` cannot be a plain softmax top-k HF block, or None."""
    m = cfg.moe
    if m is None:
        return "it has no MoE layers"
    why = component_reasons(cfg, {"moe.router.type": ("softmax_topk",)})
    if why is not None:
        return why
    if m.router.route_scale != 1.0:
        return f"moe.router.route_scale={m.router.route_scale}: the HF router has no route scale"
    if m.router.n_groups != 1:
        return "moe.router.n_groups > 1: the HF router has no group-limited routing"
    if m.balance.bias_update_rate > 0:
        return "moe.balance.bias_update_rate > 0: the HF router has no selection bias"
    if m.n_shared_experts:
        return "moe.n_shared_experts > 0: the HF block has no shared experts"
    if m.capacity_factor is not None:
        return "moe.capacity_factor is set: HF routing is dropless"
    if not allow_dense_layers and (m.first_k_dense or m.every != 1):
        return "dense layers between MoE layers (first_k_dense/every): every layer of this class is MoE"
    return None


def dense_reasons(cfg: ModelConfig, **changes) -> Optional[str]:
    """The LLaMA checks of ``cfg`` without its MoE (and with ``changes`` to the attention)."""
    attention = type(cfg.attention)(**{**cfg.attention.__dict__, **changes})
    return LlamaAdapter().matches(ModelConfig(**{**cfg.__dict__, "moe": None, "attention": attention}))


def moe_sd(prefix: str, moe) -> dict[str, Tensor]:
    return {
        f"{prefix}.gate.weight": moe.router.gate.weight,
        f"{prefix}.experts.gate_up_proj": moe.experts.w_up.transpose(1, 2),  # (E, 2F, D)
        f"{prefix}.experts.down_proj": moe.experts.w_down.transpose(1, 2),  # (E, D, F)
    }


def moe_decoder_sd(model, qk_norm: bool) -> dict[str, Tensor]:
    def block_sd(p: str, blk) -> dict[str, Tensor]:
        sd = llama_attention_sd(f"{p}.self_attn", blk, model.cfg)
        if qk_norm:
            sd[f"{p}.self_attn.q_norm.weight"] = blk.attn.q_norm.weight
            sd[f"{p}.self_attn.k_norm.weight"] = blk.attn.k_norm.weight
        sd.update(moe_sd(f"{p}.mlp", blk.ffn) if blk.is_moe else swiglu_mlp_sd(f"{p}.mlp", blk.ffn))
        return sd

    return llama_layout_sd(model, block_sd)


def moe_config_kwargs(cfg: ModelConfig) -> dict:
    m = cfg.moe
    return dict(**llama_config_kwargs(cfg), num_experts_per_tok=m.top_k, output_router_logits=False,
                router_aux_loss_coef=m.balance.aux_loss_coeff / m.top_k)


def moe_node(c: dict, num_experts: str, expert_hidden: str) -> dict:
    """The recipe's ``moe`` node of a softmax top-k HF MoE block."""
    k = int(c["num_experts_per_tok"])
    experts = c[num_experts] if num_experts in c else c["num_local_experts"]  # Qwen3-MoE's alias in transformers 5
    return {"num_experts": int(experts), "top_k": k, "expert_hidden": int(c[expert_hidden]),
            "router": {"type": "softmax_topk", "renormalize": True},
            "balance": {"aux_loss_coeff": float(c.get("router_aux_loss_coef", 0.0)) * k},
            "capacity_factor": None}


@ADAPTERS.register("mixtral")
class MixtralAdapter(HFAdapter):
    family = "mixtral"
    hf_class_name = "MixtralForCausalLM"
    expresses = MOE_EXPRESSES

    def matches(self, cfg: ModelConfig) -> Optional[str]:
        why = moe_reasons(cfg, allow_dense_layers=False) or dense_reasons(cfg)
        if why is None and not cfg.moe.router.renormalize:
            why = "moe.router.renormalize=false: Mixtral always renormalises the top-k weights"
        if why is None and cfg.attention.bias:
            why = "attention.bias=true: Mixtral's projections have no bias"
        return why

    def to_hf_config(self, cfg: ModelConfig):
        from transformers import MixtralConfig

        return MixtralConfig(**moe_config_kwargs(cfg), intermediate_size=cfg.moe.expert_hidden,
                             num_local_experts=cfg.moe.num_experts, sliding_window=None, router_jitter_noise=0.0)

    def from_hf_config(self, c: dict) -> dict:
        if c.get("sliding_window") is not None:
            raise refuse("sliding_window", c["sliding_window"], "sliding_window=null (full attention) for Mixtral")
        node = llama_node(c)
        node["attention"]["bias"] = False
        node["ffn"] = {"type": "swiglu", "bias": False}
        node["moe"] = moe_node(c, "num_local_experts", "intermediate_size")
        return node

    def to_hf(self, model) -> dict[str, Tensor]:
        return moe_decoder_sd(model, qk_norm=False)
