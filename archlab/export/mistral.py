"""Export sliding-window decoders to ``MistralForCausalLM``.

Mistral is the LLaMA architecture (RMSNorm, RoPE, SwiGLU, GQA) without biases, every layer
attending to a window of ``sliding_window`` positions (itself included: key j is seen by query i
when 0 <= i - j < W), which is archlab's ``attention.type: sliding_window`` with every layer local
(``global_every: 0``). The weights are laid out as LLaMA's.
"""

from __future__ import annotations

from typing import Optional

from archlab.config.schema import ModelConfig
from archlab.export.hf import EXPORTERS, LlamaExporter, llama_config_kwargs


@EXPORTERS.register("mistral")
class MistralExporter(LlamaExporter):
    hf_class_name = "MistralForCausalLM"
    family = "mistral"

    def matches(self, cfg: ModelConfig) -> Optional[str]:
        why = super().matches(cfg)
        if why is not None:
            return why
        a = cfg.attention
        if a.global_every:
            return f"attention.global_every={a.global_every}: every Mistral layer uses the sliding window"
        if a.bias or cfg.ffn.bias:
            return "attention.bias / ffn.bias: Mistral's projections have no biases"
        return None

    def hf_config(self, cfg: ModelConfig):
        from transformers import MistralConfig

        return MistralConfig(**llama_config_kwargs(cfg, self.rope_parameters(cfg)), intermediate_size=cfg.ffn_hidden,
                             sliding_window=cfg.attention.window)
