"""Export DeepSeek-V3-style decoders to ``DeepseekV3ForCausalLM``.

Shape legend: D model dim, H heads, P qk_nope_head_dim, R qk_rope_head_dim, V v_head_dim,
C kv_lora_rank, Q q_lora_rank, E routed experts, F expert hidden dim.

The HF class is multi-head latent attention (archlab's ``attention.type: mla``), RMSNorm, RoPE,
SwiGLU, the first ``first_k_dense_replace`` layers dense and every later one an MoE block: a
sigmoid router with a selection bias (``e_score_correction_bias``), group-limited routing, the
top-k weights optionally renormalised (``norm_topk_prob``) then scaled (``routed_scaling_factor``),
and one shared-expert MLP. Names and layouts:

- MLA: ``wqkv.q`` -> ``q_proj``; ``wqkv.q_down / q_norm / q_up`` -> ``q_a_proj / q_a_layernorm /
  q_b_proj``; ``wqkv.kv_down / kv_norm / kv_up`` -> ``kv_a_proj_with_mqa / kv_a_layernorm /
  kv_b_proj``; ``wo`` -> ``o_proj``. Same row layouts ([q_P ; q_R] per head, [c ; k_R],
  [k_P ; v] per head) except RoPE's: archlab pairs channel i with i + R/2 ("rotate half"),
  DeepSeek's checkpoints pair 2i with 2i + 1 (``rope_interleave: true``, the HF default), so the
  R rotary rows of the query and of the shared key are permuted on export (row 2i <- i,
  row 2i + 1 <- i + R/2).
- YaRN: DeepSeek scales the whole score by the temperature squared (``mscale = mscale_all_dim =
  1``: RoPE tables unscaled, softmax scale times mscale^2), which ``archlab.nn.attention.mla``
  computes the same way.
- Experts: archlab stores ``w_up`` (E, D, 2F), ``w_down`` (E, F, D); HF the transposes. archlab's
  shared experts are one SwiGLU of width n_shared * shared_hidden; HF's one of width
  ``moe_intermediate_size * n_shared_experts``, so the exported ``n_shared_experts`` is that
  width / F (an exact split of the same hidden units).
- A dense archlab model (no ``moe``) is exported with every layer dense
  (``first_k_dense_replace = n_layers``).

The router: HF ranks a group of experts by the sum of its two best biased scores and keeps the
``topk_group`` best groups, then the top-k biased scores among them, and gates with the unbiased
sigmoid scores, renormalised (+1e-20) when ``norm_topk_prob``, times ``routed_scaling_factor``.
archlab's ``sigmoid_topk`` does the same (its group score is the sum of the two best biased
scores), except that a group of one expert is ranked by that expert alone, where HF's top-2
fails: groups of fewer than 2 experts are refused. The softmax router, capacity dropping,
MoE every n-th layer and a shared-expert width that is not a multiple of F have no HF
counterpart and are refused. Balancing terms (auxiliary losses, the bias update) and router
jitter act in training only; the exported model computes the same logits.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from archlab.config.schema import ModelConfig
from archlab.export.hf import EXPORTERS, HFExporter, _linear, component_reasons, llama_layout_sd, swiglu_mlp_sd
from archlab.model.decoder import Decoder
from archlab.nn.moe.router import router_class
from archlab.nn.mup import width_mult
from archlab.nn.positions import ROPE_SCALINGS, YarnRopeScaling

HF_LATENT_NORM_EPS = 1e-6  # DeepseekV3Attention builds q_a_layernorm / kv_a_layernorm with the default eps


def _moe_reasons(cfg: ModelConfig) -> Optional[str]:
    m = cfg.moe
    if m is None:
        return None
    r = m.router
    why = router_class(cfg).export_reason("deepseek_v3", f"moe.router.type={r.type}")
    if why is not None:
        return why
    if m.num_experts // r.n_groups < 2:
        return (f"moe.router.n_groups={r.n_groups}: HF ranks a group by the sum of its two best scores, "
                f"which needs >= 2 experts per group (num_experts={m.num_experts})")
    if m.capacity_factor is not None:
        return "moe.capacity_factor is set: HF routing is dropless"
    if m.every != 1:
        return f"moe.every={m.every}: every DeepSeek-V3 layer after the first first_k_dense is MoE"
    width = _shared_width(cfg)
    if width % m.expert_hidden:
        return (f"moe.shared_hidden={m.shared_hidden}: HF's shared-expert width is a multiple of "
                f"moe.expert_hidden ({m.expert_hidden}); n_shared_experts * shared_hidden = {width} is not")
    return None


def _shared_width(cfg: ModelConfig) -> int:
    m = cfg.moe
    return m.n_shared_experts * (m.shared_hidden if m.shared_hidden is not None else m.expert_hidden)


def rope_rows(R: int) -> Tensor:
    """Indices taking archlab's RoPE rows (pairs i, i + R/2) to DeepSeek's interleaved ones
    (pairs 2i, 2i + 1): HF row 2i = archlab row i, HF row 2i + 1 = archlab row i + R/2."""
    half = torch.arange(R // 2)
    return torch.stack([half, half + R // 2], dim=1).flatten()


@EXPORTERS.register("deepseek_v3")
class DeepseekV3Exporter(HFExporter):
    """MLA + RMSNorm + RoPE + SwiGLU, dense first layers, sigmoid-routed experts with groups,
    selection bias and shared experts -> DeepseekV3ForCausalLM."""

    hf_class_name = "DeepseekV3ForCausalLM"
    family = "deepseek_v3"
    recipe_family = "deepseek"  # the recipes' ``family``: a refused one is pointed at the exportable recipes
    # DeepseekV3ForCausalLM has latent attention (MLA) only: deepseek tiny..s use grouped-query attention
    exportable_recipes = ("recipes/deepseek/v3-tiny.yaml", "recipes/deepseek/v3-mini.yaml",
                          "recipes/deepseek/v2-lite.yaml")

    def matches(self, cfg: ModelConfig) -> Optional[str]:
        why = component_reasons(cfg, self.family)
        if why is not None:
            return why
        if cfg.norm.placement != "pre":
            return f"norm.placement={cfg.norm.placement}: HF decoders are pre-LN"
        if cfg.norm.eps != HF_LATENT_NORM_EPS:
            return (f"norm.eps={cfg.norm.eps}: DeepSeek-V3's latent norms (q_a_layernorm, kv_a_layernorm) "
                    f"always use eps {HF_LATENT_NORM_EPS}")
        if cfg.attention.scale is not None:
            return f"attention.scale={cfg.attention.scale}: DeepSeek-V3 scales scores by 1/sqrt(qk head dim)"
        if width_mult(cfg) != 1.0:
            return (f"parametrization=mup at width multiplier {width_mult(cfg):g}: HF has no field for muP's "
                    "readout multiplier or attention scale")
        if cfg.ffn.bias:
            return "ffn.bias=true: DeepSeek-V3's MLPs have no bias"
        return _moe_reasons(cfg)

    def rope_parameters(self, cfg: ModelConfig) -> dict:
        pos, sc = cfg.position, cfg.position.rope_scaling
        scaling = ROPE_SCALINGS.get(sc.type)
        params = {"rope_type": scaling.hf_export[self.family], "rope_theta": pos.rope_base,
                  **scaling.hf_parameters(sc, cfg.max_seq_len)}
        if issubclass(scaling, YarnRopeScaling):  # the temperature on the whole score, none in the RoPE tables
            params.update(mscale=1.0, mscale_all_dim=1.0)
        return params

    def hf_config(self, cfg: ModelConfig):
        from transformers import DeepseekV3Config

        a, m = cfg.attention, cfg.moe
        if m is None:  # every layer dense; the MoE fields are then unused
            moe = dict(n_routed_experts=2, num_experts_per_tok=1, moe_intermediate_size=1, n_shared_experts=0,
                       n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=1.0,
                       first_k_dense_replace=cfg.n_layers)
        else:
            moe = dict(n_routed_experts=m.num_experts, num_experts_per_tok=m.top_k,
                       moe_intermediate_size=m.expert_hidden, n_shared_experts=_shared_width(cfg) // m.expert_hidden,
                       n_group=m.router.n_groups, topk_group=m.router.topk_groups,
                       norm_topk_prob=m.router.renormalize, routed_scaling_factor=m.router.route_scale,
                       first_k_dense_replace=m.first_k_dense)
        return DeepseekV3Config(
            vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.ffn_hidden,
            num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_heads,
            q_lora_rank=a.q_lora_rank, kv_lora_rank=a.kv_lora_rank, qk_rope_head_dim=a.qk_rope_head_dim,
            qk_nope_head_dim=a.qk_nope_head_dim, v_head_dim=a.v_head_dim, rope_interleave=True,
            attention_bias=a.bias, attention_dropout=a.dropout, hidden_act="silu",
            max_position_embeddings=cfg.max_seq_len, rms_norm_eps=cfg.norm.eps,
            rope_parameters=self.rope_parameters(cfg), initializer_range=cfg.init_std,
            tie_word_embeddings=cfg.tie_embeddings, use_cache=True, num_mtp_layers=0, **moe,
        )

    def state_dict(self, model: Decoder) -> dict[str, Tensor]:
        return llama_layout_sd(model, lambda p, blk: {
            **self._attention_sd(f"{p}.self_attn", blk.attn),
            **(self._moe_sd(f"{p}.mlp", blk.ffn) if blk.is_moe else swiglu_mlp_sd(f"{p}.mlp", blk.ffn))})

    @staticmethod
    def _attention_sd(prefix: str, attn) -> dict[str, Tensor]:
        w, (P, R, _, C) = attn.wqkv, attn.dims
        perm = rope_rows(R)

        def query_rows(t: Tensor) -> Tensor:  # (H * (P + R), in): each head's R rope rows interleaved
            t = t.view(attn.n_heads, P + R, -1)
            return torch.cat([t[:, :P], t[:, P:][:, perm]], dim=1).flatten(0, 1)

        def latent_rows(t: Tensor) -> Tensor:  # (C + R, ...) rows or bias entries: the shared key's interleaved
            return torch.cat([t[:C], t[C:][perm]])

        sd: dict[str, Tensor] = {}
        if hasattr(w, "q"):
            sd[f"{prefix}.q_proj.weight"] = query_rows(w.q.weight)
        else:
            sd.update(_linear(f"{prefix}.q_a_proj", w.q_down))
            sd[f"{prefix}.q_a_layernorm.weight"] = w.q_norm.weight
            sd[f"{prefix}.q_b_proj.weight"] = query_rows(w.q_up.weight)
        sd[f"{prefix}.kv_a_proj_with_mqa.weight"] = latent_rows(w.kv_down.weight)
        if w.kv_down.bias is not None:
            sd[f"{prefix}.kv_a_proj_with_mqa.bias"] = latent_rows(w.kv_down.bias)
        sd[f"{prefix}.kv_a_layernorm.weight"] = w.kv_norm.weight
        sd[f"{prefix}.kv_b_proj.weight"] = w.kv_up.weight
        sd.update(_linear(f"{prefix}.o_proj", attn.wo))
        return sd

    @staticmethod
    def _moe_sd(prefix: str, moe) -> dict[str, Tensor]:
        bias = moe.router.expert_bias
        sd = {
            f"{prefix}.gate.weight": moe.router.gate.weight,
            f"{prefix}.gate.e_score_correction_bias": bias if bias is not None else moe.router.gate.weight.new_zeros(
                moe.router.num_experts),
            f"{prefix}.experts.gate_up_proj": moe.experts.w_up.transpose(1, 2),  # (E, 2F, D)
            f"{prefix}.experts.down_proj": moe.experts.w_down.transpose(1, 2),  # (E, D, F)
        }
        if moe.shared is not None:
            sd.update(swiglu_mlp_sd(f"{prefix}.shared_experts", moe.shared))
        else:  # HF's shared MLP then has width 0: empty weights
            D = moe.router.gate.weight.shape[1]
            empty = moe.router.gate.weight.new_zeros(0, D)
            sd.update({f"{prefix}.shared_experts.gate_proj.weight": empty,
                       f"{prefix}.shared_experts.up_proj.weight": empty,
                       f"{prefix}.shared_experts.down_proj.weight": empty.T})
        return sd
