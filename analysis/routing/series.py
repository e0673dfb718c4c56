"""An MoE run's routing records over training (routing.jsonl, moe rows of metrics.jsonl) as arrays per
MoE layer: load per expert, MaxVio, router entropy, dropped tokens, expert telemetry, and their summary."""

from __future__ import annotations

import re
from typing import Optional

import numpy as np

from analysis.runs import Run
from archlab.nn.moe.stats import STARVED_FRACTION

_LAYER_KEY = re.compile(r"^moe/(layer\d+)/(.+)$")


def _layer_sort_key(name: str) -> int:
    return int(name[len("layer"):])


def training_series(run: Run) -> dict[str, dict]:
    """Per MoE layer, the logged routing statistics against the step.

    Reads routing.jsonl (falling back to metrics.jsonl rows) for flat keys ``moe/layer<i>/<stat>``
    as written by ``archlab.nn.moe.routing_stats``. Returns layer -> {"step": (T,), stat: (T,) or
    (T, E) array}, only stats present in every row of that layer.
    """
    rows = run.routing_rows or [r for r in run.metrics if r.get("kind", "train") == "train"]
    per_layer: dict[str, dict[str, list]] = {}
    for row in rows:
        step = row.get("step")
        if step is None:
            continue
        found: dict[str, dict] = {}
        for key, value in row.items():
            m = _LAYER_KEY.match(key)
            if m:
                found.setdefault(m.group(1), {})[m.group(2)] = value
        for layer, stats in found.items():
            d = per_layer.setdefault(layer, {"step": []})
            d["step"].append(step)
            for k, v in stats.items():
                d.setdefault(k, []).append(v)
    series = {}
    for layer in sorted(per_layer, key=_layer_sort_key):
        d = per_layer[layer]
        T = len(d["step"])
        out = {"step": np.asarray(d["step"], dtype=float)}
        for k, vals in d.items():
            if k == "step" or len(vals) != T:
                continue
            try:
                out[k] = np.asarray(vals, dtype=float)
            except (TypeError, ValueError):
                continue
        series[layer] = out
    return series


def global_series(run: Run) -> dict[str, np.ndarray]:
    """The across-layer numbers of the routing records against the step: flat keys ``moe/<stat>``
    (``maxvio``, ``maxvio_p50`` ..., ``dead_experts``, ``dropped_tokens``, ``window_steps``) as
    {"step": (T,), stat: (T,)}, only stats present in every record."""
    rows = [r for r in (run.routing_rows or [r for r in run.metrics if r.get("kind", "train") == "train"])
            if r.get("step") is not None]
    out: dict[str, np.ndarray] = {"step": np.asarray([r["step"] for r in rows], dtype=float)}
    keys = {k for r in rows for k in r if k.startswith("moe/") and not _LAYER_KEY.match(k)}
    for key in sorted(keys):
        vals = [r.get(key) for r in rows]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
            out[key[len("moe/"):]] = np.asarray(vals, dtype=float)
    return out


def window_steps(series: dict[str, dict], totals: dict[str, np.ndarray]) -> Optional[np.ndarray]:
    """(T,) optimizer steps each routing record covers: ``moe/window_steps`` as logged, else (runs
    from before it was logged) the step differences, the first record counting from step 0."""
    if "window_steps" in totals and len(totals["window_steps"]):
        return np.maximum(totals["window_steps"], 1)
    steps = next((s["step"] for s in series.values()), None)
    if steps is None or not len(steps):
        return None
    return np.maximum(np.diff(steps, prepend=0.0), 1)


def maxvio_percentiles(series: dict[str, dict],
                       totals: Optional[dict[str, np.ndarray]] = None) -> dict[str, np.ndarray]:
    """Percentiles of the per-layer MaxVio across MoE layers against the step: {"step", "p50",
    "p90", "p95", "max"}, each (T,). As logged (``moe/maxvio_p50`` ...) where the records have them,
    else computed from the layers' MaxVio with the same rule (linear interpolation between order
    statistics, ``archlab.nn.moe.stats.layer_percentiles``). Empty without MaxVio records."""
    names = ("p50", "p90", "p95", "max")
    if totals and all(f"maxvio_{n}" in totals for n in names):
        return {"step": totals["step"], **{n: totals[f"maxvio_{n}"] for n in names}}
    layers = [s for s in series.values() if "maxvio" in s and s["maxvio"].ndim == 1]
    if not layers or len({len(s["step"]) for s in layers}) != 1:
        return {}
    v_LT = np.stack([s["maxvio"] for s in layers])
    q = np.percentile(v_LT, [50, 90, 95], axis=0)  # numpy's default: linear interpolation
    return {"step": layers[0]["step"], "p50": q[0], "p90": q[1], "p95": q[2], "max": v_LT.max(axis=0)}


def load_matrix(s: dict) -> Optional[np.ndarray]:
    """(T, E) share of routed slots per expert, from load fractions or token counts."""
    if "load_fraction" in s and s["load_fraction"].ndim == 2:
        return s["load_fraction"]
    if "tokens_per_expert" in s and s["tokens_per_expert"].ndim == 2:
        c = s["tokens_per_expert"]
        return c / np.maximum(c.sum(axis=1, keepdims=True), 1)
    return None


def expert_telemetry(s: dict) -> dict[str, np.ndarray]:
    """One layer's per-record tokens-per-expert numbers: ``min``, ``max``, ``std`` (population),
    ``mean``, ``dead`` (experts with zero tokens) and ``starved`` (under ``STARVED_FRACTION`` of the
    mean), each (T,) and counted over each record's window; as logged where the records have them,
    else from the logged ``tokens_per_expert`` lists (runs from before they were logged). Also
    ``dropped_tokens`` where logged."""
    out: dict[str, np.ndarray] = {}
    c_TE = s.get("tokens_per_expert")
    if c_TE is not None and c_TE.ndim == 2:
        out.update({"min": c_TE.min(axis=1), "max": c_TE.max(axis=1), "std": c_TE.std(axis=1),
                    "mean": c_TE.mean(axis=1), "dead": (c_TE == 0).sum(axis=1).astype(float),
                    "starved": ((c_TE > 0) & (c_TE < STARVED_FRACTION * c_TE.mean(axis=1, keepdims=True)))
                    .sum(axis=1).astype(float)})
    for key, name in (("tokens_per_expert_min", "min"), ("tokens_per_expert_max", "max"),
                      ("tokens_per_expert_std", "std"), ("dead_experts", "dead"), ("starved_experts", "starved"),
                      ("dropped_tokens", "dropped_tokens")):
        if key in s and s[key].ndim == 1:
            out[name] = s[key]
    return out


def training_summary(series: dict[str, dict]) -> dict:
    out = {}
    for layer, s in series.items():
        d = {"records": int(len(s["step"])), "first_step": float(s["step"][0]), "last_step": float(s["step"][-1])}
        for k in ("maxvio", "router_entropy", "dropped_fraction", "cv", "dead_experts", "dropped_tokens"):
            if k in s and s[k].ndim == 1:
                d[f"{k}_first"], d[f"{k}_last"] = float(s[k][0]), float(s[k][-1])
        load = load_matrix(s)
        if load is not None:
            d["final_load"] = load[-1].tolist()
        if "bias" in s and s["bias"].ndim == 2:
            d["final_bias"] = s["bias"][-1].tolist()
        out[layer] = d
    return out
