"""The router trace a run wrote (``train.router_trace_every``) read back as stacked arrays.

Shape legend: P traced steps, T traced tokens per step, L MoE layers, K experts per token, E experts.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from analysis.runs import RunError
from archlab.io import read_jsonl
from archlab.train.router_trace import INDEX, STEPS, TRACE_DIR

TRACE_LEGEND = {
    "steps": "(P,) the traced optimizer steps",
    "skipped": "(P,) bool: that step's batch was skipped (non-finite loss)",
    "seconds": "(P,) host seconds the trainer spent collecting and writing that step's trace",
    "token_index": "(P, T) row n = b*S + s of the flattened (B, S) first micro-batch on rank 0",
    "row": "(P, T) the sequence b of that row in the micro-batch",
    "position": "(P, T) the position s of that row in its sequence",
    "token_id": "(P, T) the input token id",
    "experts": "(P, T, L, K) int64 chosen expert ids, in top-k order",
    "weights": "(P, T, L, K) float32 gate weights as applied",
    "dropped": "(P, T, L, K) bool: slot dropped by capacity",
    "logits": "(P, T, L, E) float32 raw router logits",
    "expert_bias": "(P, L, E) float32 aux-loss-free selection bias (runs that use it)",
}


def read_trace(run_dir) -> dict:
    """The router trace of a run (``router_trace/`` written with ``train.router_trace_every``), every
    traced step stacked: the arrays of :data:`TRACE_LEGEND` (P traced steps, T tokens per step, L
    MoE layers, K, E), plus ``layers`` (names "layer<i>", the L axis), ``num_experts``, ``top_k``,
    ``seq_len``, ``legend`` (that shape legend) and ``index`` (index.json as written).
    RunError when the run has no trace or a file is missing."""

    folder = Path(run_dir) / TRACE_DIR
    try:
        index = json.loads((folder / INDEX).read_text())
    except (OSError, ValueError):
        raise RunError(f"{run_dir}: no router trace ({TRACE_DIR}/{INDEX}); train with train.router_trace_every=N") \
            from None
    by_step = {int(e["step"]): e for e in read_jsonl(folder / STEPS) if "step" in e and "file" in e}  # last wins
    entries = [by_step[s] for s in sorted(by_step)]
    if not entries:
        raise RunError(f"{folder / STEPS}: no traced step listed")
    per_step: dict[str, list] = {}
    for e in entries:
        path = folder / e["file"]
        if not path.is_file():
            raise RunError(f"{path}: listed in {INDEX} but missing")
        with np.load(path) as z:
            for k in z.files:
                per_step.setdefault(k, []).append(z[k])
    out = {k: np.stack(v) for k, v in per_step.items()}
    out["experts"] = out["experts"].astype(np.int64)
    S = int(index["seq_len"])
    out["row"], out["position"] = out["token_index"] // S, out["token_index"] % S
    out["steps"] = np.asarray([e["step"] for e in entries], dtype=np.int64)
    out["skipped"] = np.asarray([bool(e.get("skipped", False)) for e in entries])
    out["seconds"] = np.asarray([float(e.get("seconds", math.nan)) for e in entries])
    out.update({"layers": list(index["layers"]), "num_experts": int(index["num_experts"]),
                "top_k": int(index["top_k"]), "seq_len": S, "legend": dict(TRACE_LEGEND), "index": index})
    return out


def trace_summary(trace: dict) -> dict:
    """What summary.json says about a router trace: steps, tokens, and its measured host cost."""
    P, T, L, K = trace["experts"].shape
    secs = trace["seconds"][np.isfinite(trace["seconds"])]
    return {"steps": int(P), "first_step": int(trace["steps"][0]), "last_step": int(trace["steps"][-1]),
            "tokens_per_step": int(T), "layers": trace["layers"], "top_k": int(K),
            "num_experts": int(trace["num_experts"]),
            "mean_seconds_per_traced_step": float(secs.mean()) if len(secs) else None,
            "dropped_slot_fraction": float(trace["dropped"].mean())}
