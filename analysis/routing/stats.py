"""Statistics of captured routing decisions (top-K expert ids per token), pure functions of arrays:
token-id specialisation and top tokens per expert (OLMoE), MaxVio on held-out tokens (Wang et al. 2024),
co-activation and router saturation.

Shape legend: N tokens, K experts per token, E experts, V vocabulary.
"""

from __future__ import annotations

import math

import numpy as np


def specialisation(token_ids_N: np.ndarray, experts_NK: np.ndarray, num_experts: int,
                   min_count: int = 5) -> dict:
    """OLMoE's token-id (vocabulary) specialisation of one layer.

    For token id x with N_x occurrences and N_{x,i} occurrences where expert i is among its K
    chosen experts: spec(x) = max_i N_{x,i} / N_x, in [K/E-ish, 1]; 1 means every occurrence of x
    goes to the same expert. Returns the mean over token ids with N_x >= min_count, the
    occurrence-weighted mean, the number of such ids, and the (V_seen, E) count matrix with its ids.
    """
    ids, inverse, n_x = np.unique(token_ids_N, return_inverse=True, return_counts=True)
    counts_VE = np.zeros((len(ids), num_experts), dtype=np.int64)
    K = experts_NK.shape[1]
    np.add.at(counts_VE, (np.repeat(inverse, K), experts_NK.reshape(-1)), 1)
    spec_V = counts_VE.max(axis=1) / n_x
    keep = n_x >= min_count
    return {
        "mean": float(spec_V[keep].mean()) if keep.any() else math.nan,
        "weighted_mean": float((spec_V[keep] * n_x[keep]).sum() / n_x[keep].sum()) if keep.any() else math.nan,
        "n_token_ids": int(keep.sum()),
        "uniform_baseline": K / num_experts,
        "ids": ids, "n_x": n_x, "counts_VE": counts_VE, "spec_V": spec_V,
    }


def top_tokens(spec: dict, decode, n: int = 8, min_count: int = 5) -> list[list[dict]]:
    """Per expert: the token ids routed to it most often (among ids seen >= min_count times),
    with how often and which share of that id's occurrences."""
    ids, n_x, counts_VE = spec["ids"], spec["n_x"], spec["counts_VE"]
    keep = n_x >= min_count
    out = []
    for e in range(counts_VE.shape[1]):
        c = np.where(keep, counts_VE[:, e], 0)
        order = np.argsort(-c, kind="stable")[:n]
        out.append([{"token_id": int(ids[j]), "text": decode(int(ids[j])), "count": int(c[j]),
                     "share_of_id": float(c[j] / n_x[j])} for j in order if c[j] > 0])
    return out


def maxvio_of_choices(experts_NK: np.ndarray, num_experts: int, batch_tokens: int) -> dict[str, float]:
    """MaxVio (Wang et al. 2024: max over experts of load / mean load - 1) of one layer's routing
    decisions on held-out tokens: ``global`` over all N tokens, ``batch`` the mean over consecutive
    batches of ``batch_tokens`` tokens (their MaxVio_batch; a shorter tail is dropped)."""
    load_E = np.bincount(experts_NK.reshape(-1), minlength=num_experts).astype(np.float64)
    n_batches = max(1, experts_NK.shape[0] // batch_tokens)
    per_batch = []
    for b in range(n_batches):
        chunk = experts_NK[b * batch_tokens:(b + 1) * batch_tokens]
        counts = np.bincount(chunk.reshape(-1), minlength=num_experts).astype(np.float64)
        per_batch.append(counts.max() / counts.mean() - 1.0)
    return {"global": float(load_E.max() / load_E.mean() - 1.0), "batch": float(np.mean(per_batch))}


def coactivation(experts_NK: np.ndarray, num_experts: int) -> np.ndarray:
    """(E, E) matrix C[a, b] = N(a, b) / N(a): over tokens that chose expert a, the share that
    also chose b, counting every pair of the K chosen experts. Diagonal 0; rows of experts never
    chosen are NaN."""
    N, K = experts_NK.shape
    onehot_NE = np.zeros((N, num_experts), dtype=np.float64)
    np.put_along_axis(onehot_NE, experts_NK, 1.0, axis=1)
    pairs_EE = onehot_NE.T @ onehot_NE  # [a, b] = tokens with both a and b (diagonal: N(a))
    n_a = np.diag(pairs_EE).copy()
    np.fill_diagonal(pairs_EE, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n_a[:, None] > 0, pairs_EE / n_a[:, None], np.nan)


def saturation(experts_a_NK: np.ndarray, experts_b_NK: np.ndarray) -> float:
    """Mean over tokens of |TopK_a ∩ TopK_b| / K (OLMoE's router saturation)."""
    if experts_a_NK.shape != experts_b_NK.shape:
        raise ValueError(f"saturation needs the same tokens and K: {experts_a_NK.shape} vs {experts_b_NK.shape}")
    K = experts_a_NK.shape[1]
    inter_N = (experts_a_NK[:, :, None] == experts_b_NK[:, None, :]).any(axis=2).sum(axis=1)
    return float(inter_N.mean() / K)
