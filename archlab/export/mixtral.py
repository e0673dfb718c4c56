"""Export MoE decoders to Hugging Face ``transformers``: Mixtral and Qwen3-MoE.

Shape legend: D model dim, E experts, F expert hidden dim.

Both HF classes are the LLaMA architecture with a softmax top-k MoE block whose experts are
stacked 3-D weights: ``gate_up_proj`` (E, 2F, D) with [gate; up] rows and ``down_proj``
(E, D, F). archlab stores the transposes, ``w_up`` (E, D, 2F) and ``w_down`` (E, F, D).

- ``MixtralForCausalLM``: every layer MoE, K kept weights renormalised, no qk-norm.
- ``Qwen3MoeForCausalLM``: per-head q/k RMSNorm, renormalisation optional
  (``norm_topk_prob``), dense layers allowed (``mlp_only_layers``).

Neither has shared experts, a selection bias, group-limited routing, a route scale or capacity
dropping; a recipe using one of those has no exact HF counterpart here. HF computes its
auxiliary loss K times larger than archlab's (see archlab.nn.moe.balance), so the exported
``router_aux_loss_coef`` is archlab's ``aux_loss_coeff / K``. HF Mixtral's training jitter acts
on the experts' input as well; the exported models are for inference (jitter 0).
"""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from archlab.config.schema import ModelConfig
from archlab.export.hf import (
    EXPORTERS,
    HFExporter,
    LlamaExporter,
    llama_attention_sd,
    llama_config_kwargs,
    llama_layout_sd,
    swiglu_mlp_sd,
)
from archlab.model.decoder import Decoder
from archlab.nn.moe.router import router_class


def _moe_reasons(cfg: ModelConfig, allow_dense_layers: bool) -> Optional[str]:
    """Why the MoE layers of ``cfg`` cannot be a plain softmax top-k HF block, or None."""
    m = cfg.moe
    if m is None:
        return "it has no MoE layers"
    why = router_class(cfg).export_reason("mixtral", f"moe.router.type={m.router.type}")
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


def _llama_reasons(cfg: ModelConfig) -> Optional[str]:
    """The LLaMA-architecture checks shared by both classes (from the LLaMA exporter)."""
    dense = ModelConfig(**{**cfg.__dict__, "moe": None})
    return LlamaExporter().matches(dense)


def _moe_sd(prefix: str, moe) -> dict[str, Tensor]:
    return {
        f"{prefix}.gate.weight": moe.router.gate.weight,
        f"{prefix}.experts.gate_up_proj": moe.experts.w_up.transpose(1, 2),  # (E, 2F, D)
        f"{prefix}.experts.down_proj": moe.experts.w_down.transpose(1, 2),  # (E, D, F)
    }


def _decoder_sd(model: Decoder, qk_norm: bool) -> dict[str, Tensor]:
    def block_sd(p: str, blk) -> dict[str, Tensor]:
        sd = llama_attention_sd(f"{p}.self_attn", blk, model.cfg)
        if qk_norm:
            sd[f"{p}.self_attn.q_norm.weight"] = blk.attn.q_norm.weight
            sd[f"{p}.self_attn.k_norm.weight"] = blk.attn.k_norm.weight
        sd.update(_moe_sd(f"{p}.mlp", blk.ffn) if blk.is_moe else swiglu_mlp_sd(f"{p}.mlp", blk.ffn))
        return sd

    return llama_layout_sd(model, block_sd)


def _common_kwargs(cfg: ModelConfig) -> dict:
    m = cfg.moe
    return dict(**llama_config_kwargs(cfg, LlamaExporter().rope_parameters(cfg)), num_experts_per_tok=m.top_k,
                output_router_logits=False, router_aux_loss_coef=m.balance.aux_loss_coeff / m.top_k)


@EXPORTERS.register("mixtral")
class MixtralExporter(HFExporter):
    """Mixtral-style (LLaMA + 8x top-2 softmax experts, renormalised) -> MixtralForCausalLM."""

    hf_class_name = "MixtralForCausalLM"

    def matches(self, cfg: ModelConfig) -> Optional[str]:
        why = _moe_reasons(cfg, allow_dense_layers=False) or _llama_reasons(cfg)
        if why is None and not cfg.moe.router.renormalize:
            why = "moe.router.renormalize=false: Mixtral always renormalises the top-k weights"
        if why is None and cfg.attention.bias:
            why = "attention.bias=true: Mixtral's projections have no bias"
        return why

    def hf_config(self, cfg: ModelConfig):
        from transformers import MixtralConfig

        return MixtralConfig(**_common_kwargs(cfg), intermediate_size=cfg.moe.expert_hidden,
                             num_local_experts=cfg.moe.num_experts, sliding_window=None, router_jitter_noise=0.0)

    def state_dict(self, model: Decoder) -> dict[str, Tensor]:
        return _decoder_sd(model, qk_norm=False)


@EXPORTERS.register("qwen3_moe")
class Qwen3MoeExporter(HFExporter):
    """LLaMA + per-head q/k RMSNorm + softmax top-k experts, dense layers allowed
    -> Qwen3MoeForCausalLM."""

    hf_class_name = "Qwen3MoeForCausalLM"

    def matches(self, cfg: ModelConfig) -> Optional[str]:
        if not cfg.attention.qk_norm:
            return "attention.qk_norm=false: Qwen3 always normalises q and k per head"
        plain_attention = type(cfg.attention)(**{**cfg.attention.__dict__, "qk_norm": False})
        plain = ModelConfig(**{**cfg.__dict__, "attention": plain_attention})
        why = _moe_reasons(cfg, allow_dense_layers=True) or _llama_reasons(plain)
        if why is None and cfg.ffn.bias:
            why = "ffn.bias=true: Qwen3-MoE's dense MLP has no bias"
        return why

    def hf_config(self, cfg: ModelConfig):
        from transformers import Qwen3MoeConfig

        m = cfg.moe
        return Qwen3MoeConfig(**_common_kwargs(cfg), intermediate_size=cfg.ffn_hidden,
                              moe_intermediate_size=m.expert_hidden, num_experts=m.num_experts,
                              norm_topk_prob=m.router.renormalize, attention_bias=cfg.attention.bias,
                              decoder_sparse_step=1, use_sliding_window=False,
                              mlp_only_layers=[i for i in range(cfg.n_layers) if not cfg.is_moe_layer(i)])

    def state_dict(self, model: Decoder) -> dict[str, Tensor]:
        return _decoder_sd(model, qk_norm=True)
