"""Hugging Face ``transformers`` folders, both ways: one adapter per family (``archlab/hf/adapters/``).

- export: ``export_hf(model, folder)`` / ``to_hf_model(model)``, the family found from the architecture
  (``find_adapter``: the first adapter that expresses the model exactly, else every family's reason);
- import: ``from_hf(folder, out)`` turns a local HF folder (config.json, safetensors, tokenizer.json) into
  an archlab run folder, the family found from config.json's ``model_type`` (``archlab.hf.load``).
"""

from archlab.hf import adapters  # noqa: F401  (register the adapters)
from archlab.hf.adapter import ADAPTERS, ConfigRefused, HFAdapter, find_adapter
from archlab.hf.export import export_hf, to_hf_model
from archlab.hf.load import from_hf

__all__ = ["ADAPTERS", "ConfigRefused", "HFAdapter", "export_hf", "find_adapter", "from_hf", "to_hf_model"]
