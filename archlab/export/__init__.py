"""Former home of the Hugging Face export: the names it had, now in :mod:`archlab.hf`."""

from archlab.hf import ADAPTERS as EXPORTERS
from archlab.hf import HFAdapter as HFExporter
from archlab.hf import export_hf, to_hf_model
from archlab.hf import find_adapter as find_exporter

__all__ = ["EXPORTERS", "HFExporter", "export_hf", "find_exporter", "to_hf_model"]
