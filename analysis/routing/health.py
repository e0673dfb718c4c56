"""Dead and starved experts of an MoE run over a window of training steps, per layer, by expert id.

An expert is dead in a window when no token was routed to it, and starved when it got some but under
``fraction`` (default :data:`archlab.nn.moe.stats.STARVED_FRACTION`, 10%) of the uniform share, the mean over
experts: it is alive in name but trains on too few tokens to learn. "Dead experts 0" alone hides a layer
where some experts get 0-50 tokens a step against a mean of 768. The window: the routing records whose
steps lie in the last ``window`` training steps (default: the last fifth of the recorded steps, at least
the last record), their token counts summed.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from archlab.nn.moe.stats import STARVED_FRACTION

WINDOW_SHARE = 0.2  # default window: this share of the recorded training steps, at the end


def expert_health(series: dict[str, dict], fraction: float = STARVED_FRACTION,
                  window: Optional[float] = None) -> dict[str, dict]:
    """Per layer with token counts (``tokens_per_expert``, (T, E)): the window's first and last step, its
    records, each expert's tokens per step, the dead and starved expert ids and the smallest load as a
    share of uniform."""
    out = {}
    for layer, s in series.items():
        c_TE = s.get("tokens_per_expert")
        if c_TE is None or c_TE.ndim != 2 or not len(c_TE):
            continue
        steps = s["step"]
        span = window if window is not None else WINDOW_SHARE * float(steps[-1])
        sel = steps > steps[-1] - span
        sel[-1] = True
        first = int(np.flatnonzero(sel)[0])
        start = float(steps[first - 1]) if first > 0 else 0.0  # a record covers the steps since the previous one
        c_E = c_TE[sel].sum(axis=0)
        mean = float(c_E.mean())
        n_steps = max(1.0, float(steps[-1]) - start)
        out[layer] = {
            "window_steps": [start, float(steps[-1])], "records": int(sel.sum()), "fraction": fraction,
            "mean_tokens_per_step": mean / n_steps,
            "tokens_per_step": (c_E / n_steps).tolist(),
            "dead": [int(e) for e in np.flatnonzero(c_E == 0)],
            "starved": [int(e) for e in np.flatnonzero((c_E > 0) & (c_E < fraction * mean))],
            "min_share_of_uniform": float(c_E.min() / mean) if mean > 0 else 0.0,
        }
    return out


def routed_load(experts_NK: np.ndarray, num_experts: int, fraction: float = STARVED_FRACTION) -> dict:
    """One layer's load over routed text (``experts_NK``: each token's K chosen experts): the slots each expert
    got, its share of the uniform load, and the dead and starved experts by the rule of :func:`expert_health`
    (no slot; under ``fraction`` of the mean)."""
    c_E = np.bincount(experts_NK.reshape(-1), minlength=num_experts).astype(float)
    mean = float(c_E.mean())
    return {"slots_per_expert": c_E.astype(int).tolist(), "tokens": int(experts_NK.shape[0]), "fraction": fraction,
            "share_of_uniform": (c_E / mean if mean > 0 else c_E).tolist(),
            "dead": [int(e) for e in np.flatnonzero(c_E == 0)],
            "starved": [int(e) for e in np.flatnonzero((c_E > 0) & (c_E < fraction * mean))],
            "min_share_of_uniform": float(c_E.min() / mean) if mean > 0 else 0.0}


def routed_load_table(load: dict[str, dict]) -> list[str]:
    """Markdown lines: per layer the dead and starved experts over the routed text, by expert id."""
    d0 = next(iter(load.values()))
    lines = [f"Load over these {d0['tokens']} tokens: dead (no slot) and starved (under {d0['fraction']:.0%} of the "
             "uniform share) experts, by expert id:", "",
             "| layer | slots per expert (min / mean / max) | dead experts | starved experts | least-loaded expert "
             "(share of uniform) |", "|---|---|---|---|---|"]
    for layer, d in load.items():
        c = d["slots_per_expert"]
        lines.append(f"| {layer} | {min(c)} / {sum(c) / len(c):.1f} / {max(c)} | {_ids(d['dead'])} | "
                     f"{_ids(d['starved'])} | {d['min_share_of_uniform']:.2f} |")
    return lines


def _ids(ids: list) -> str:
    return f"{len(ids)}: " + ", ".join(str(e) for e in ids) if ids else "0"


def health_table(health: dict[str, dict]) -> list[str]:
    """Markdown lines: per layer the dead and starved experts by id over the window."""
    if not health:
        return ["(no token counts per expert in the routing records: dead and starved experts not known)"]
    d0 = next(iter(health.values()))
    lines = [f"Dead (no token) and starved (under {d0['fraction']:.0%} of the uniform share) experts over steps "
             f"{d0['window_steps'][0]:.0f}-{d0['window_steps'][1]:.0f} ({d0['records']} record(s)), by expert id:", "",
             "| layer | mean tokens per expert per step | dead experts | starved experts | least-loaded expert "
             "(share of uniform) |", "|---|---|---|---|---|"]
    for layer, d in health.items():
        lines.append(f"| {layer} | {d['mean_tokens_per_step']:.1f} | {_ids(d['dead'])} | {_ids(d['starved'])} | "
                     f"{d['min_share_of_uniform']:.2f} |")
    return lines
