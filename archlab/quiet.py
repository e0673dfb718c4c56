"""Third-party start-up lines kept out of the tools' output.

DeepSpeed, imported by transformers and accelerate, warns "Setting accelerator to CPU. If you have GPU
or other accelerator, we were unable to detect it." on every machine without a GPU. Naming the
accelerator it would pick anyway (``DS_ACCELERATOR=cpu``, unless the environment names one) leaves
its choice unchanged and the line out.
"""

from __future__ import annotations

import os


def quiet_third_party() -> None:
    """Called once by the ``tools`` and ``analysis`` packages on import."""
    if "DS_ACCELERATOR" in os.environ:
        return
    import torch

    if not torch.cuda.is_available():  # DeepSpeed's own rule: no CUDA device -> cpu
        os.environ["DS_ACCELERATOR"] = "cpu"
