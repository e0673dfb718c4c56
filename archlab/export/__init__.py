"""Export to Hugging Face ``transformers`` formats (one registered exporter per family)."""

from archlab.export.hf import EXPORTERS, HFExporter, export_hf, find_exporter, to_hf_model

__all__ = ["EXPORTERS", "HFExporter", "export_hf", "find_exporter", "to_hf_model"]
