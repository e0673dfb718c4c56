"""OLMoE <-> archlab: LLaMA + a q/k RMSNorm over the whole projections + every layer a softmax top-k MoE block
(renormalisation optional) -> ``OlmoeForCausalLM``.

Shape legend: D model dim, H query heads, G key/value heads, Dh head dim.

OLMoE normalises the whole query projection (``q_norm``, H*Dh = D wide) and the whole key projection
(``k_norm``, G*Dh wide) before splitting them into heads: archlab's ``attention.qk_norm: true`` with
``attention.qk_norm_over: projection``. The MoE layout is Mixtral's (``mixtral.py``): ``gate_up_proj`` (E, 2F, D),
``down_proj`` (E, D, F), a bias-free ``gate``, no shared experts, every layer MoE; ``norm_topk_prob`` is
``moe.router.renormalize`` (OLMoE-1B-7B: false). ``router_aux_loss_coef`` is archlab's ``aux_loss_coeff / K``
(as for Mixtral). The HF class has no router z-loss: ``moe.balance.z_loss_coeff`` trains archlab's model and is
not written (an import sets none).

Refused by name on import: ``clip_qkv`` (OLMoE's clamp of q, k and v; archlab has none), an activation
other than SiLU, a ``head_dim`` other than D/H, a RoPE scaling archlab lacks.
"""

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


@ADAPTERS.register("olmoe")
class OlmoeAdapter(HFAdapter):
    family = "olmoe"
    hf_class_name = "OlmoeForCausalLM"
    expresses = MOE_EXPRESSES

    def matches(self, cfg: ModelConfig) -> Optional[str]:
        a = cfg.attention
        if a.type != "mha":  # the q/k norm keys are mha's
            return component_reasons(cfg, self.expresses)
        if not a.qk_norm:
            return "attention.qk_norm=false: OLMoE always normalises q and k"
        if a.qk_norm_over != "projection":
            return (f"attention.qk_norm_over={a.qk_norm_over}: OLMoE normalises the whole query and key "
                    "projections (qk_norm_over=projection)")
        return moe_reasons(cfg, allow_dense_layers=False) or dense_reasons(cfg, qk_norm=False)

    def to_hf_config(self, cfg: ModelConfig):
        from transformers import OlmoeConfig

        m = cfg.moe
        kwargs = moe_config_kwargs(cfg)
        kwargs.pop("head_dim")  # not an OLMoE field: its head dim is hidden_size / num_attention_heads
        return OlmoeConfig(**kwargs, intermediate_size=m.expert_hidden, num_experts=m.num_experts,
                           norm_topk_prob=m.router.renormalize, attention_bias=cfg.attention.bias, clip_qkv=None)

    def from_hf_config(self, c: dict) -> dict:
        if c.get("clip_qkv") is not None:
            raise refuse("clip_qkv", c["clip_qkv"], "clip_qkv=null only (archlab does not clamp q, k and v)")
        node = llama_node(c)
        node["attention"]["qk_norm"] = True
        node["attention"]["qk_norm_over"] = "projection"
        node["ffn"] = {"type": "swiglu", "bias": False}
        node["moe"] = moe_node(c, "num_experts", "intermediate_size")
        node["moe"]["router"]["renormalize"] = bool(c.get("norm_topk_prob", False))
        return node

    def to_hf(self, model) -> dict[str, Tensor]:
        return moe_decoder_sd(model, qk_norm=True)
