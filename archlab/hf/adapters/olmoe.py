"""OLMoE -> archlab: refused, with the reason.

``OlmoeForCausalLM`` is the LLaMA layout with softmax top-k experts (Mixtral's block, ``norm_topk_prob``)
and a q/k RMSNorm applied to the whole query projection (``q_norm`` over ``hidden_size``) and the whole key
projection (``k_norm`` over ``num_key_value_heads * head_dim``), before the heads are split. archlab's
``attention.qk_norm`` normalises each head separately (a gain and a mean square per head), a different
function for any model with more than one head, and archlab has no whole-projection q/k norm: neither an
OLMoE checkpoint nor an archlab model maps onto the other exactly (``recipes/olmoe/`` trains OLMoE's shape
with per-head QK-norm).
"""

from __future__ import annotations

from typing import Optional

from archlab.config.schema import ModelConfig
from archlab.hf.adapter import ADAPTERS, ConfigRefused, HFAdapter

REASON = ("OLMoE normalises the whole query and key projections (q_norm over hidden_size, k_norm over "
          "num_key_value_heads * head_dim); archlab's attention.qk_norm normalises each head")


@ADAPTERS.register("olmoe")
class OlmoeAdapter(HFAdapter):
    family = "olmoe"
    hf_class_name = "OlmoeForCausalLM"

    def matches(self, cfg: ModelConfig) -> Optional[str]:
        return REASON

    def from_hf_config(self, c: dict) -> dict:
        raise ConfigRefused(f"config.json: model_type='olmoe': {REASON}; archlab supports per-head q/k norm "
                            "only (Qwen3-MoE's), so this checkpoint cannot be imported exactly")
