"""Export parallel-block decoders (``model.block.type: parallel``) to ``GPTJForCausalLM`` and ``GPTNeoXForCausalLM``.

Shape legend: D model dim, H heads, G key/value heads, Dh head dim, V vocabulary.

Both are pre-LN LayerNorm, RoPE on the whole head, GELU(tanh)/ReLU MLP, MHA (GQA/MQA key/value heads are
repeated into H heads: exact, larger) and write a bias archlab does not have as zeros (exact):

- GPT-J: one norm feeds both branches (``block.shared_norm: true``, PaLM's layout too), no attention
  biases, RoPE base 10000, pairs of adjacent channels (2i, 2i+1) rotated where archlab rotates (i, i + Dh/2):
  the q and k rows of each head are permuted to match (q.k is unchanged by a permutation applied to both);
  its LM head has a bias (zeros).
- GPT-NeoX (``use_parallel_residual=True``): two norms of the same input (``block.shared_norm: false``),
  one fused projection whose rows are per head [q_h; k_h; v_h] where archlab's are [q; k; v].
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from archlab.config.schema import ModelConfig
from archlab.export.hf import (
    EXPORTERS,
    HFExporter,
    _common_reasons,
    _expand_kv,
    _layernorm,
    _split_qkv,
    component_reasons,
)
from archlab.model.decoder import Decoder
from archlab.nn.ffn import ffn_class

GPTJ_ROPE_BASE = 10000.0  # GPT-J's sinusoid table hard-codes it


def _parallel_reasons(cfg: ModelConfig, family: str, shared_norm: bool) -> Optional[str]:
    why = component_reasons(cfg, family) or _common_reasons(cfg)
    if why is not None:
        return why
    if cfg.block.shared_norm != shared_norm:
        return (f"block.shared_norm={cfg.block.shared_norm}: this class's parallel layer has "
                f"{'one shared norm' if shared_norm else 'two norms'}")
    return None


def _mha_rows(t: Tensor, cfg: ModelConfig) -> tuple[Tensor, Tensor, Tensor]:
    """Fused [q; k; v] rows (or bias entries) -> q, k, v of H heads each (G key/value heads repeated)."""
    q, k, v = _split_qkv(t, cfg)
    return q, _expand_kv(k, cfg), _expand_kv(v, cfg)


def _linear_with_bias(prefix: str, linear: torch.nn.Linear) -> dict[str, Tensor]:
    bias = linear.bias if linear.bias is not None else linear.weight.new_zeros(linear.out_features)
    return {f"{prefix}.weight": linear.weight, f"{prefix}.bias": bias}


@EXPORTERS.register("gptj")
class GPTJExporter(HFExporter):
    hf_class_name = "GPTJForCausalLM"

    def matches(self, cfg: ModelConfig) -> Optional[str]:
        why = _parallel_reasons(cfg, "gptj", shared_norm=True)
        if why is not None:
            return why
        if cfg.attention.bias:
            return "attention.bias=true: GPT-J's attention projections have no biases"
        if cfg.position.rope_base != GPTJ_ROPE_BASE:
            return f"position.rope_base={cfg.position.rope_base}: GPT-J's RoPE base is {GPTJ_ROPE_BASE:g}"
        return None

    def hf_config(self, cfg: ModelConfig):
        from transformers import GPTJConfig

        return GPTJConfig(
            vocab_size=cfg.vocab_size, n_positions=cfg.max_seq_len, n_embd=cfg.d_model, n_layer=cfg.n_layers,
            n_head=cfg.n_heads, rotary_dim=cfg.d_head, n_inner=cfg.ffn_hidden,
            activation_function=ffn_class(cfg).hf_export["gptj"], resid_pdrop=cfg.dropout, embd_pdrop=cfg.dropout,
            attn_pdrop=cfg.attention.dropout, layer_norm_epsilon=cfg.norm.eps, initializer_range=cfg.init_std,
            tie_word_embeddings=cfg.tie_embeddings, use_cache=True, bos_token_id=None, eos_token_id=None)

    def state_dict(self, model: Decoder) -> dict[str, Tensor]:
        cfg = model.cfg
        half = cfg.d_head // 2
        # GPT-J channel 2i holds archlab's i, channel 2i + 1 archlab's i + Dh/2 (each head)
        pair = torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).flatten()  # (Dh,)
        perm = (torch.arange(cfg.n_heads)[:, None] * cfg.d_head + pair).flatten()  # (H*Dh,)
        sd = {"transformer.wte.weight": model.embed.weight, "lm_head.weight": model.lm_head.weight,
              "lm_head.bias": model.lm_head.weight.new_zeros(cfg.vocab_size)}
        sd.update(_layernorm("transformer.ln_f", model.final_norm))
        for i, blk in enumerate(model.blocks):
            p = f"transformer.h.{i}"
            q, k, v = _mha_rows(blk.attn.wqkv.weight, cfg)
            sd.update(_layernorm(f"{p}.ln_1", blk.attn_norm))
            sd.update({f"{p}.attn.q_proj.weight": q[perm], f"{p}.attn.k_proj.weight": k[perm],
                       f"{p}.attn.v_proj.weight": v, f"{p}.attn.out_proj.weight": blk.attn.wo.weight})
            sd.update(_linear_with_bias(f"{p}.mlp.fc_in", blk.ffn.up))
            sd.update(_linear_with_bias(f"{p}.mlp.fc_out", blk.ffn.down))
        return sd


@EXPORTERS.register("gpt_neox")
class GPTNeoXExporter(HFExporter):
    hf_class_name = "GPTNeoXForCausalLM"

    def matches(self, cfg: ModelConfig) -> Optional[str]:
        return _parallel_reasons(cfg, "gpt_neox", shared_norm=False)

    def hf_config(self, cfg: ModelConfig):
        from transformers import GPTNeoXConfig

        return GPTNeoXConfig(
            vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers,
            num_attention_heads=cfg.n_heads, intermediate_size=cfg.ffn_hidden,
            hidden_act=ffn_class(cfg).hf_export["gpt_neox"], attention_dropout=cfg.attention.dropout,
            hidden_dropout=cfg.dropout, max_position_embeddings=cfg.max_seq_len, initializer_range=cfg.init_std,
            layer_norm_eps=cfg.norm.eps, use_parallel_residual=True, attention_bias=cfg.attention.bias,
            rope_parameters={"rope_type": "default", "rope_theta": cfg.position.rope_base,
                             "partial_rotary_factor": 1.0},
            tie_word_embeddings=cfg.tie_embeddings, use_cache=True, bos_token_id=None, eos_token_id=None)

    def state_dict(self, model: Decoder) -> dict[str, Tensor]:
        cfg = model.cfg
        H, Dh = cfg.n_heads, cfg.d_head

        def per_head(t: Tensor) -> Tensor:  # [q; k; v] rows -> [q_h; k_h; v_h] for each head h
            return torch.stack([x.reshape(H, Dh, *t.shape[1:]) for x in _mha_rows(t, cfg)], dim=1).flatten(0, 2)

        sd = {"gpt_neox.embed_in.weight": model.embed.weight, "lm_head.weight": model.lm_head.weight}
        sd.update(_layernorm("gpt_neox.final_layer_norm", model.final_norm))
        for i, blk in enumerate(model.blocks):
            p = f"gpt_neox.layers.{i}"
            sd.update(_layernorm(f"{p}.input_layernorm", blk.attn_norm))
            sd.update(_layernorm(f"{p}.post_attention_layernorm", blk.ffn_norm))
            sd[f"{p}.attention.query_key_value.weight"] = per_head(blk.attn.wqkv.weight)
            sd[f"{p}.attention.dense.weight"] = blk.attn.wo.weight
            if cfg.attention.bias:
                sd[f"{p}.attention.query_key_value.bias"] = per_head(blk.attn.wqkv.bias)
                sd[f"{p}.attention.dense.bias"] = blk.attn.wo.bias
            sd.update(_linear_with_bias(f"{p}.mlp.dense_h_to_4h", blk.ffn.up))
            sd.update(_linear_with_bias(f"{p}.mlp.dense_4h_to_h", blk.ffn.down))
        return sd
