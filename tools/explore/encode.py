"""Tensors to compact JSON: a float32 or uint8 array as base64 of its bytes with its shape, which
the page reads back with a typed array (exact float32, and fast to write for 10^5-10^6 values)."""

from __future__ import annotations

import base64

import numpy as np
import torch


def array(t: torch.Tensor, dtype: str = "f32") -> dict:
    """{"shape": [...], "dtype": "f32" | "u8" | "i32", "b64": "..."} of ``t`` (row-major)."""
    np_dtype = {"f32": np.float32, "u8": np.uint8, "i32": np.int32}[dtype]
    a = np.ascontiguousarray(t.detach().cpu().numpy().astype(np_dtype))
    return {"shape": list(a.shape), "dtype": dtype, "b64": base64.b64encode(a.tobytes()).decode("ascii")}


def decode(obj: dict) -> np.ndarray:
    """The array :func:`array` wrote (for tests and the benchmark)."""
    np_dtype = {"f32": np.float32, "u8": np.uint8, "i32": np.int32}[obj["dtype"]]
    return np.frombuffer(base64.b64decode(obj["b64"]), dtype=np_dtype).reshape(obj["shape"])
