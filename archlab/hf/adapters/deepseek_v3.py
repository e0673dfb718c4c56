"""DeepSeek-V3 <-> archlab: MLA decoders with sigmoid-routed experts -> ``DeepseekV3ForCausalLM``.

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
jitter act in training only; the exported model computes the same logits. An import keeps the selection
bias (``moe.balance.bias_update_rate``: DeepSeek-V3's 0.001, so that archlab holds the bias) and trains
with DeepSeek-V3's sequence-wise auxiliary loss coefficient 1e-4.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from archlab.config.schema import ModelConfig
from archlab.hf.adapter import (
    ADAPTERS,
    HFAdapter,
    component_reasons,
    linear_sd,
    require,
    rope_from_hf,
    rope_parameters,
)
from archlab.hf.adapters.llama import LLAMA_EXPRESSES, llama_layout_sd, swiglu_mlp_sd
from archlab.nn.mup import width_mult

HF_LATENT_NORM_EPS = 1e-6  # DeepseekV3Attention builds q_a_layernorm / kv_a_layernorm with the default eps
BIAS_UPDATE_RATE = 1e-3  # DeepSeek-V3's bias update speed gamma: an import keeps a selection bias
SEQ_AUX_LOSS = 1e-4  # DeepSeek-V3's sequence-wise balance loss weight


def _moe_reasons(cfg: ModelConfig) -> Optional[str]:
    m = cfg.moe
    if m is None:
        return None
    r = m.router
    why = component_reasons(cfg, {"moe.router.type": ("sigmoid_topk",)})
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


@ADAPTERS.register("deepseek_v3")
class DeepseekV3Adapter(HFAdapter):
    """MLA + RMSNorm + RoPE + SwiGLU, dense first layers, sigmoid-routed experts with groups,
    selection bias and shared experts -> DeepseekV3ForCausalLM."""

    family = "deepseek_v3"
    hf_class_name = "DeepseekV3ForCausalLM"
    expresses = {**LLAMA_EXPRESSES, "attention.type": ("mla",)}
    recipe_family = "deepseek"  # the recipes' ``family``: a refused one is pointed at the exportable recipes
    # DeepseekV3ForCausalLM has latent attention (MLA) only: deepseek tiny..s use grouped-query attention
    exportable_recipes = ("recipes/deepseek/v3-tiny.yaml", "recipes/deepseek/v3-mini.yaml",
                          "recipes/deepseek/v2-lite.yaml")

    def matches(self, cfg: ModelConfig) -> Optional[str]:
        why = component_reasons(cfg, self.expresses)
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
        params = rope_parameters(cfg)
        if cfg.position.rope_scaling.type == "yarn":  # the temperature on the whole score, none in the tables
            params.update(mscale=1.0, mscale_all_dim=1.0)
        return params

    def to_hf_config(self, cfg: ModelConfig):
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

    def from_hf_config(self, c: dict) -> dict:
        require(c, "hidden_act", ("silu",), "hidden_act='silu' (SwiGLU) for DeepSeek-V3")
        require(c, "rope_interleave", (True, None), "rope_interleave=true (DeepSeek-V3's checkpoints)")
        require(c, "rms_norm_eps", (HF_LATENT_NORM_EPS,), f"rms_norm_eps={HF_LATENT_NORM_EPS} (the latent norms' "
                "fixed eps) only")
        require(c, "topk_method", ("noaux_tc", None), "topk_method='noaux_tc' (sigmoid, group-limited) only")
        n_layers, dense = int(c["num_hidden_layers"]), int(c.get("first_k_dense_replace", 0))
        node = {"type": "decoder", "vocab_size": int(c["vocab_size"]), "d_model": int(c["hidden_size"]),
                "n_layers": n_layers, "n_heads": int(c["num_attention_heads"]), "n_kv_heads": None,
                "max_seq_len": int(c["max_position_embeddings"]), "dropout": 0.0,
                "tie_embeddings": bool(c.get("tie_word_embeddings", False)),
                "init_std": float(c.get("initializer_range", 0.02)),
                "norm": {"type": "rmsnorm", "placement": "pre", "eps": HF_LATENT_NORM_EPS},
                "position": rope_from_hf(c, extra_ok=("mscale", "mscale_all_dim")),
                "block": {"type": "sequential"},
                "attention": {"type": "mla", "bias": bool(c.get("attention_bias", False)),
                              "dropout": float(c.get("attention_dropout", 0.0)), "q_lora_rank": c.get("q_lora_rank"),
                              "kv_lora_rank": int(c["kv_lora_rank"]), "qk_rope_head_dim": int(c["qk_rope_head_dim"]),
                              "qk_nope_head_dim": int(c["qk_nope_head_dim"]), "v_head_dim": int(c["v_head_dim"])},
                "ffn": {"type": "swiglu", "bias": False, "hidden": int(c["intermediate_size"])}}
        if dense < n_layers:
            shared = int(c.get("n_shared_experts") or 0)
            node["moe"] = {
                "num_experts": int(c["n_routed_experts"]), "top_k": int(c["num_experts_per_tok"]),
                "expert_hidden": int(c["moe_intermediate_size"]), "n_shared_experts": shared,
                "first_k_dense": dense, "capacity_factor": None,
                "router": {"type": "sigmoid_topk", "renormalize": bool(c.get("norm_topk_prob", True)),
                           "route_scale": float(c.get("routed_scaling_factor", 1.0)),
                           "n_groups": int(c.get("n_group") or 1), "topk_groups": int(c.get("topk_group") or 1)},
                "balance": {"bias_update_rate": BIAS_UPDATE_RATE, "seq_aux_loss_coeff": SEQ_AUX_LOSS}}
        return node

    def to_hf(self, model) -> dict[str, Tensor]:
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
            sd.update(linear_sd(f"{prefix}.q_a_proj", w.q_down))
            sd[f"{prefix}.q_a_layernorm.weight"] = w.q_norm.weight
            sd[f"{prefix}.q_b_proj.weight"] = query_rows(w.q_up.weight)
        sd[f"{prefix}.kv_a_proj_with_mqa.weight"] = latent_rows(w.kv_down.weight)
        if w.kv_down.bias is not None:
            sd[f"{prefix}.kv_a_proj_with_mqa.bias"] = latent_rows(w.kv_down.bias)
        sd[f"{prefix}.kv_a_layernorm.weight"] = w.kv_norm.weight
        sd[f"{prefix}.kv_b_proj.weight"] = w.kv_up.weight
        sd.update(linear_sd(f"{prefix}.o_proj", attn.wo))
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
