"""Qwen3-Next <-> archlab: Gated DeltaNet layers (``linear_attention``) and gated full-attention layers
(``full_attention``), placed by ``layer_types`` as archlab's ``model.layers.pattern`` places them, with a dense
SwiGLU MLP in every layer -> ``Qwen3NextForCausalLM``.

Shape legend: D model dim, H query heads, G key/value heads, Dh head dim; Hk, Hv, Dk, Dv the Gated DeltaNet's
key/value heads and head dims, r = Hv / Hk.

- Full attention is archlab's ``mha`` with ``qk_norm`` (per head), ``output_gate`` and ``rotary_fraction``
  (``partial_rotary_factor``): HF's ``q_proj`` holds per head [q_h; gate_h] (2 Dh rows each), archlab's
  ``wqkv`` the q rows and ``wgate`` the gate rows, head-major.
- Gated DeltaNet: HF groups its fused projections by key head, ``in_proj_qkvz`` [q_g, k_g, v_g (r Dv), z_g (r Dv)]
  and ``in_proj_ba`` [b_g (r), a_g (r)]; archlab's ``wqkv`` is [q; k; v; z; beta; alpha], each head-major.
- Every RMSNorm but the Gated DeltaNet's output norm is zero-centred, x * (1 + w): archlab's gain is 1 + w
  (``finish_hf`` writes w, ``prepare_hf`` reads it back; not an index map, so a round trip of those gains is
  exact to one float32 rounding of 1 + w).
- MoE layers are refused: Qwen3-Next's sparse MLP gates its shared expert by sigmoid(x w_s)
  (``shared_expert_gate``), which archlab's shared experts lack.
"""

from __future__ import annotations

import re
from typing import Optional

import torch
from torch import Tensor

from archlab.config.schema import ModelConfig
from archlab.hf.adapter import (
    ADAPTERS,
    HFAdapter,
    dense_decoder_node,
    mup_reason,
    refuse,
    require,
    rope_from_hf,
    rope_parameters,
    split_qkv,
)
from archlab.hf.adapters.llama import llama_layout_sd, swiglu_mlp_sd
from archlab.nn.attention import layer_type
from archlab.nn.attention.gated_deltanet import gdn_dims
from archlab.nn.positions import position_class

HF_KINDS = {"gated_deltanet": "linear_attention", "mha": "full_attention"}  # archlab's attention.type -> layer_types
ARCHLAB_KINDS = {v: k for k, v in HF_KINDS.items()}
ZERO_CENTRED = re.compile(r"(input_layernorm|post_attention_layernorm|^model\.norm|q_norm|k_norm)\.weight$")
ROPE_SCALINGS = ("none", "linear", "yarn")


def layer_kinds(cfg: ModelConfig) -> list[str]:
    """archlab's attention type of each layer."""
    return [layer_type(cfg, i) for i in range(cfg.n_layers)]


def attention_reason(cfg: ModelConfig) -> Optional[str]:
    """Why the full-attention layers of ``cfg`` are not Qwen3-Next's, or None."""
    a = cfg.attention
    if not position_class(cfg).rotates_qk:
        return f"position.type={cfg.position.type}: Qwen3-Next's full attention uses RoPE"
    if cfg.position.rope_scaling.type not in ROPE_SCALINGS:
        return f"position.rope_scaling.type={cfg.position.rope_scaling.type}: HF has none, linear and yarn"
    if not a.qk_norm or a.qk_norm_over != "head":
        return "attention.qk_norm: Qwen3-Next normalises q and k per head (qk_norm=true, qk_norm_over=head)"
    if not a.output_gate:
        return "attention.output_gate=false: Qwen3-Next gates its attention output by sigmoid(x W_g)"
    return None


def pattern(kinds: list[str]) -> list[str]:
    """The shortest period that repeats ``kinds`` over the depth (the whole list if none shorter does)."""
    n = len(kinds)
    return next(kinds[:p] for p in range(1, n + 1) if n % p == 0 and kinds == kinds[:p] * (n // p))


def gdn_sd(prefix: str, attn) -> dict[str, Tensor]:
    """archlab's Gated DeltaNet -> ``linear_attn``: the in projection's rows regrouped by key head."""
    Hk, Hv, Dk, Dv = attn.hk, attn.hv, attn.dk, attn.dv
    r, W = Hv // Hk, attn.wqkv.weight
    D = W.shape[1]
    q, k, v, z, b, a = W.split([Hk * Dk, Hk * Dk, Hv * Dv, Hv * Dv, Hv, Hv])
    qkvz = torch.cat([q.view(Hk, Dk, D), k.view(Hk, Dk, D), v.view(Hk, r * Dv, D), z.view(Hk, r * Dv, D)], dim=1)
    ba = torch.cat([b.view(Hk, r, D), a.view(Hk, r, D)], dim=1)
    return {f"{prefix}.in_proj_qkvz.weight": qkvz.reshape(-1, D), f"{prefix}.in_proj_ba.weight": ba.reshape(-1, D),
            f"{prefix}.conv1d.weight": attn.conv_weight, f"{prefix}.A_log": attn.A_log,
            f"{prefix}.dt_bias": attn.dt_bias, f"{prefix}.norm.weight": attn.norm.weight,
            f"{prefix}.out_proj.weight": attn.wo.weight}


def gated_attention_sd(prefix: str, attn, cfg: ModelConfig) -> dict[str, Tensor]:
    """archlab's gated mha -> ``self_attn``: q and gate rows interleaved per head in ``q_proj``."""
    H, Dh = cfg.n_heads, cfg.d_head
    q, k, v = split_qkv(attn.wqkv.weight, cfg)
    gate = attn.wgate.weight
    D = q.shape[1]
    q_proj = torch.cat([q.view(H, Dh, D), gate.view(H, Dh, D)], dim=1).reshape(2 * H * Dh, D)  # per head [q_h; g_h]
    return {f"{prefix}.q_proj.weight": q_proj, f"{prefix}.k_proj.weight": k, f"{prefix}.v_proj.weight": v,
            f"{prefix}.o_proj.weight": attn.wo.weight, f"{prefix}.q_norm.weight": attn.q_norm.weight,
            f"{prefix}.k_norm.weight": attn.k_norm.weight}


@ADAPTERS.register("qwen3_next")
class Qwen3NextAdapter(HFAdapter):
    family = "qwen3_next"
    hf_class_name = "Qwen3NextForCausalLM"

    def matches(self, cfg: ModelConfig) -> Optional[str]:
        if cfg.type != "decoder":
            return f"model.type={cfg.type}: Qwen3-Next is a causal decoder"
        kinds = layer_kinds(cfg)
        other = sorted(set(kinds) - set(HF_KINDS))
        if other:
            return f"attention.type {', '.join(other)}: Qwen3-Next's layers are gated_deltanet or mha"
        if cfg.moe is not None:
            return ("it has MoE layers: Qwen3-Next's sparse MLP gates its shared expert by sigmoid(x w) "
                    "(shared_expert_gate), archlab's shared experts have no gate; dense layers only")
        checks = [
            (cfg.scale_embeddings, "scale_embeddings=true: Qwen3-Next does not scale the embedding"),
            (cfg.norm.type != "rmsnorm", f"norm.type={cfg.norm.type}: Qwen3-Next uses RMSNorm"),
            (cfg.norm.placement != "pre", f"norm.placement={cfg.norm.placement}: Qwen3-Next is pre-LN"),
            (cfg.block.type != "sequential", f"block.type={cfg.block.type}: Qwen3-Next runs attention, then the MLP"),
            (cfg.ffn.type != "swiglu", f"ffn.type={cfg.ffn.type}: Qwen3-Next's MLP is SwiGLU"),
            (cfg.ffn.type == "swiglu" and cfg.ffn.bias, "ffn.bias=true: Qwen3-Next's MLP has no bias"),
            (cfg.attention.bias, "attention.bias=true: Qwen3-Next's Gated DeltaNet has no bias (and archlab's "
                                 "layers share the key)"),
            (cfg.attention.scale is not None, f"attention.scale={cfg.attention.scale}: Qwen3-Next scales by "
                                              "1/sqrt(head dim)"),
        ]
        why = next((reason for failed, reason in checks if failed), None) or mup_reason(cfg)
        if why is None and "mha" in kinds:
            why = attention_reason(cfg)
        if why is None and "mha" not in kinds and cfg.position.type != "none":
            why = f"position.type={cfg.position.type}: Qwen3-Next's Gated DeltaNet layers read no positions"
        return why

    def to_hf_config(self, cfg: ModelConfig):
        from transformers import Qwen3NextConfig

        kinds = layer_kinds(cfg)
        a = cfg.attention
        kwargs: dict = {}
        if "gated_deltanet" in kinds:
            hk, hv, dk, dv = gdn_dims(cfg)
            kwargs.update(linear_num_key_heads=hk, linear_num_value_heads=hv, linear_key_head_dim=dk,
                          linear_value_head_dim=dv, linear_conv_kernel_dim=a.gdn_conv_kernel)
        rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0}
        if "mha" in kinds:
            rope = {**rope_parameters(cfg), "partial_rotary_factor": a.rotary_fraction}
            kwargs["attention_dropout"] = a.dropout
        return Qwen3NextConfig(
            vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.ffn_hidden,
            num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.kv_heads,
            head_dim=cfg.d_head, hidden_act="silu", max_position_embeddings=cfg.max_seq_len,
            initializer_range=cfg.init_std, rms_norm_eps=cfg.norm.eps, tie_word_embeddings=cfg.tie_embeddings,
            rope_parameters=rope, attention_bias=False, layer_types=[HF_KINDS[k] for k in kinds],
            mlp_only_layers=list(range(cfg.n_layers)), num_experts=0, decoder_sparse_step=1, use_cache=True,
            **kwargs)

    def from_hf_config(self, c: dict) -> dict:
        require(c, "hidden_act", ("silu",), "hidden_act='silu' (SwiGLU, the conv's SiLU) for Qwen3-Next")
        if c.get("attention_bias"):
            raise refuse("attention_bias", c["attention_bias"], "attention_bias=false for Qwen3-Next (archlab's "
                         "Gated DeltaNet and attention layers share attention.bias, and the former has none)")
        n = int(c["num_hidden_layers"])
        sparse = [i for i in range(n) if i not in (c.get("mlp_only_layers") or [])
                  and int(c.get("num_experts") or 0) > 0 and (i + 1) % int(c.get("decoder_sparse_step", 1)) == 0]
        if sparse:
            raise refuse("mlp_only_layers", c.get("mlp_only_layers"), f"dense MLPs only (mlp_only_layers listing all "
                         f"{n} layers, or num_experts=0): Qwen3-Next's sparse MLP gates its shared expert by "
                         "sigmoid(x w) (shared_expert_gate), archlab's shared experts have no gate")
        kinds = [ARCHLAB_KINDS.get(t) for t in c["layer_types"]]
        if None in kinds or len(kinds) != n:
            raise refuse("layer_types", c["layer_types"], f"{n} entries of linear_attention or full_attention")
        node = dense_decoder_node(c, d_model="hidden_size", n_layers="num_hidden_layers",
                                  n_heads="num_attention_heads", max_seq_len="max_position_embeddings",
                                  eps="rms_norm_eps")
        kv = c.get("num_key_value_heads")
        node.update(type="decoder", n_kv_heads=int(kv) if kv is not None else None, dropout=0.0,
                    block={"type": "sequential"}, position={"type": "none"},
                    ffn={"type": "swiglu", "bias": False, "hidden": int(c["intermediate_size"])})
        node["norm"].update(type="rmsnorm", placement="pre")
        attention: dict = {"bias": False}
        if "gated_deltanet" in kinds:
            attention.update(gdn_k_heads=int(c["linear_num_key_heads"]), gdn_v_heads=int(c["linear_num_value_heads"]),
                             gdn_k_head_dim=int(c["linear_key_head_dim"]),
                             gdn_v_head_dim=int(c["linear_value_head_dim"]),
                             gdn_conv_kernel=int(c["linear_conv_kernel_dim"]))
        if "mha" in kinds:
            heads, d = int(c["num_attention_heads"]), int(c["hidden_size"])
            if c.get("head_dim") not in (None, d // heads):
                raise refuse("head_dim", c["head_dim"], f"head_dim = hidden_size / num_attention_heads ({d // heads}) "
                             "only")
            params = c.get("rope_parameters") or {}
            fraction = float(params.get("partial_rotary_factor", c.get("partial_rotary_factor", 1.0)))
            node["position"] = rope_from_hf(c)
            attention.update(qk_norm=True, qk_norm_over="head", output_gate=True, rotary_fraction=fraction,
                             dropout=float(c.get("attention_dropout", 0.0)))
        if len(set(kinds)) == 1:
            attention["type"] = kinds[0]
        else:
            node["layers"] = {"pattern": pattern(kinds)}
        node["attention"] = attention
        return node

    def to_hf(self, model) -> dict[str, Tensor]:
        cfg = model.cfg

        def block_sd(p: str, blk) -> dict[str, Tensor]:
            i = int(p.rsplit(".", 1)[1])
            mixer = (gdn_sd(f"{p}.linear_attn", blk.attn) if layer_type(cfg, i) == "gated_deltanet"
                     else gated_attention_sd(f"{p}.self_attn", blk.attn, cfg))
            return {**mixer, **swiglu_mlp_sd(f"{p}.mlp", blk.ffn)}

        return llama_layout_sd(model, block_sd)

    def finish_hf(self, sd: dict[str, Tensor]) -> dict[str, Tensor]:
        """The zero-centred norms hold w, archlab's gain minus one."""
        return {k: v - 1 if ZERO_CENTRED.search(k) else v for k, v in sd.items()}

    def prepare_hf(self, hf_sd: dict[str, Tensor], c: dict) -> dict[str, Tensor]:
        """The zero-centred norms' w as archlab's gain 1 + w."""
        return {k: v + 1 if ZERO_CENTRED.search(k) else v for k, v in hf_sd.items()}
