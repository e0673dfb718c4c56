"""Mistral <-> archlab: sliding-window decoders -> ``MistralForCausalLM``.

Mistral is the LLaMA architecture (RMSNorm, RoPE, SwiGLU, GQA) without biases, every layer attending to a
window of ``sliding_window`` positions (itself included: key j is seen by query i when 0 <= i - j < W),
which is archlab's ``attention.type: sliding_window`` with every layer local (``global_every: 0``). The
weights are laid out as LLaMA's. A config without a window (``sliding_window: null``) is full attention:
it is imported as ``attention.type: mha`` (and exports as LLaMA).
"""

from __future__ import annotations

from typing import Optional

from archlab.config.schema import ModelConfig
from archlab.hf.adapter import ADAPTERS, common_reasons, component_reasons
from archlab.hf.adapters.llama import LLAMA_EXPRESSES, LlamaAdapter, llama_config_kwargs, llama_node


@ADAPTERS.register("mistral")
class MistralAdapter(LlamaAdapter):
    family = "mistral"
    hf_class_name = "MistralForCausalLM"
    expresses = {**LLAMA_EXPRESSES, "attention.type": ("sliding_window",)}

    def matches(self, cfg: ModelConfig) -> Optional[str]:
        why = component_reasons(cfg, self.expresses) or common_reasons(cfg)
        if why is not None:
            return why
        a = cfg.attention
        if a.global_every:
            return f"attention.global_every={a.global_every}: every Mistral layer uses the sliding window"
        if a.bias or cfg.ffn.bias:
            return "attention.bias / ffn.bias: Mistral's projections have no biases"
        return None

    def to_hf_config(self, cfg: ModelConfig):
        from transformers import MistralConfig

        return MistralConfig(**llama_config_kwargs(cfg), intermediate_size=cfg.ffn_hidden,
                             sliding_window=cfg.attention.window)

    def from_hf_config(self, c: dict) -> dict:
        node = llama_node(c)
        node["attention"]["bias"] = False
        if c.get("sliding_window") is not None:
            node["attention"].update(type="sliding_window", window=int(c["sliding_window"]), global_every=0)
        node["ffn"] = {"type": "swiglu", "hidden": int(c["intermediate_size"]), "bias": False}
        return node
