"""Former home of the Mixtral and Qwen3-MoE export: the names it had, now in :mod:`archlab.hf.adapters`."""

from archlab.hf.adapters.mixtral import MixtralAdapter as MixtralExporter
from archlab.hf.adapters.qwen3_moe import Qwen3MoeAdapter as Qwen3MoeExporter

__all__ = ["MixtralExporter", "Qwen3MoeExporter"]
