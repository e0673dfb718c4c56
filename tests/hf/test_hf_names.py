"""The Hugging Face facts live in the adapters (``archlab/hf/adapters/``): no module of archlab/nn or
archlab/model names an HF family (its ``model_type``), an HF parameter or config key, an HF class, or the
export attributes the components used to carry. archlab's own names that HF happens to share (``rotary_dim``,
``embed_tokens``, the FLOP entries ``q_proj``, ``up_proj``, ``out_proj``) are not on the list."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

FAMILIES = ("gpt2", "gptj", "gpt_neox", "llama", "mistral", "mixtral", "qwen3_moe", "deepseek_v3", "bert", "t5",
            "olmoe", "qwen3_next")
PARAMETERS = ("c_attn", "c_fc", "c_proj", "wte", "wpe", "ln_f", "ln_1", "ln_2", "k_proj", "v_proj", "o_proj",
              "gate_proj", "down_proj", "gate_up_proj", "embed_in", "embeddings.LayerNorm",
              "input_layernorm", "post_attention_layernorm", "final_layer_norm", "query_key_value", "dense_h_to_4h",
              "dense_4h_to_h", "fc_in", "fc_out", "word_embeddings", "position_embeddings", "token_type_embeddings",
              "cls.predictions", "relative_attention_bias", "EncDecAttention", "SelfAttention", "DenseReluDense",
              "e_score_correction_bias", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "q_a_layernorm",
              "kv_a_layernorm", "q_norm.weight", "k_norm.weight", "in_proj_qkvz", "in_proj_ba", "linear_attn",
              "shared_expert_gate")
CONFIG_KEYS = ("hidden_act", "activation_function", "gelu_new", "rope_parameters", "rope_type", "rope_theta",
               "rotary_pct", "rms_norm_eps", "layer_norm_epsilon", "num_key_value_heads", "num_attention_heads",
               "tie_word_embeddings", "intermediate_size", "num_local_experts", "num_experts_per_tok",
               "n_routed_experts", "first_k_dense_replace", "norm_topk_prob", "routed_scaling_factor",
               "mlp_only_layers", "use_parallel_residual", "decoder_start_token_id", "layer_types",
               "partial_rotary_factor")
EXPORT_ATTRIBUTES = ("hf_export", "hf_unsupported", "hf_parameters", "Exportable", "export_reason", "archlab.export",
                     "archlab.hf")
CLASSES = r"\w+(ForCausalLM|ForMaskedLM|ForConditionalGeneration|LMHeadModel)"

FORBIDDEN = re.compile(r"(?<!\w)(" + "|".join(re.escape(w) for w in
                                                 FAMILIES + PARAMETERS + CONFIG_KEYS + EXPORT_ATTRIBUTES)
                       + r")(?![\w])|" + CLASSES)


def hf_names(text: str) -> list[str]:
    return [m.group(0) for m in FORBIDDEN.finditer(text)]


def test_no_component_or_model_module_names_hugging_face():
    found = {str(p.relative_to(ROOT)): hf_names(p.read_text())
             for folder in ("archlab/nn", "archlab/model") for p in sorted((ROOT / folder).rglob("*.py"))}
    found = {path: names for path, names in found.items() if names}
    assert not found, f"Hugging Face names outside archlab/hf: {found}"


def test_the_scan_finds_what_it_looks_for():
    """The words are found where they stand as names (not inside another word)."""
    assert hf_names('hf_export = {"gpt2": "c_attn"}') == ["hf_export", "gpt2", "c_attn"]
    assert hf_names("return LlamaForCausalLM(config)") == ["LlamaForCausalLM"]
    assert hf_names("self.k_proj = nn.Linear(d, d)  # rope_theta") == ["k_proj", "rope_theta"]
    assert hf_names("self.wqkv = nn.Linear(d, 3 * d); a bert-like encoder") == ["bert"]
    assert hf_names("self.wqkv, robert, t5x, lm_head, sliding_window, rotary_dim, LLaMA") == []
