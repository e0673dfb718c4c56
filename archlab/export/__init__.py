"""Export to Hugging Face ``transformers`` formats (one registered exporter per family).

Importing this package registers every exporter: dense families in ``hf`` (GPT-2, LLaMA) and
sliding-window attention in ``mistral``, MoE families in ``mixtral`` (Mixtral, Qwen3-MoE), MLA in
``deepseek``, the parallel block in ``parallel`` (GPT-J, GPT-NeoX), encoders in ``bert``
(BertForMaskedLM), encoder-decoders in ``t5`` (T5ForConditionalGeneration).
"""

from archlab.export import bert, deepseek, mistral, mixtral, parallel, t5  # noqa: F401  (register the exporters)
from archlab.export.hf import EXPORTERS, HFExporter, export_hf, find_exporter, to_hf_model

__all__ = ["EXPORTERS", "HFExporter", "export_hf", "find_exporter", "to_hf_model"]
