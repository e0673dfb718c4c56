"""The peak FLOP/s that model FLOPs utilisation (MFU) is measured against.

Per device when ``train.peak_flops`` is not set. GPUs: vendor bf16 dense tensor-core figures.
CPU: a nominal 1 TFLOP/s, the order of a recent many-core AVX-512 socket in fp32; it is a stated
convention, not a measurement. The value used is recorded in env.json ("peak_flops",
"peak_flops_source").
"""

from __future__ import annotations

import torch

PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12, "A10": 125e12}
CPU_PEAK_FLOPS = 1e12


def peak_flops(cfg, device: torch.device) -> tuple[float, str]:
    """Peak FLOP/s of one device for MFU: the recipe's train.peak_flops, else the table above."""
    if cfg.train.peak_flops is not None:
        return float(cfg.train.peak_flops), "train.peak_flops"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, value in PEAK_FLOPS.items():
            if key in name:
                return value, f"archlab default for {name} (bf16 dense)"
        return 312e12, f"archlab default for an unknown GPU ({name}): A100 bf16 dense"
    return CPU_PEAK_FLOPS, "archlab nominal CPU peak (1 TFLOP/s); set train.peak_flops for your machine"
