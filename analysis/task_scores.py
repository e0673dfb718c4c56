"""The understanding tasks' scores (``train.objective``: tag, span_qa, bound) with intervals that count both
sources of error: the fine-tuning seed and the sampling of the test items.

- :func:`chosen_checkpoint`: early stopping, the kept checkpoint at the validation row of lowest dev loss.
- :func:`run_scores`: a fine-tuned run's test accuracy at that checkpoint, summed per test document (items of one
  document share windows, so documents are the units resampled).
- :func:`combined_interval`: the mean over seeds of a per-seed accuracy (or of a paired difference between two
  arms) with se^2 = (seed variance) / n + (bootstrap variance of the seed mean over test documents), the
  documents resampled jointly for every seed and arm (the same test set), and a t quantile on n - 1 degrees of
  freedom. With the test items fixed, the spread over seeds holds none of the item-sampling error, and the
  bootstrap none of the seeds': the two add.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
from scipy import stats

from archlab.checkpoints import checkpoints
from archlab.errors import RecipeError
from archlab.objectives import objective_for
from archlab.objectives.understanding import UnderstandingObjective
from archlab.train.checkpoint import load_recipe_of, load_weights_into
from archlab.train.run_folder import read_jsonl

RESAMPLES = 2000


def bootstrap(correct_N: np.ndarray, counted_N: np.ndarray, doc_N: np.ndarray, seed: int = 0) -> tuple[float, float]:
    """95% percentile interval of sum(correct) / sum(counted), resampling documents with replacement."""
    docs, inverse = np.unique(doc_N, return_inverse=True)
    c_D = np.bincount(inverse, weights=correct_N, minlength=len(docs))
    n_D = np.bincount(inverse, weights=counted_N, minlength=len(docs))
    picks_RD = np.random.default_rng(seed).integers(0, len(docs), size=(RESAMPLES, len(docs)))
    rates = c_D[picks_RD].sum(1) / np.maximum(1, n_D[picks_RD].sum(1))
    return float(np.percentile(rates, 2.5)), float(np.percentile(rates, 97.5))


def dev_curve(run: Path, key: str) -> list[tuple[int, float]]:
    """(step, dev loss ``key``) of every validation row of a run."""
    return [(int(r["step"]), float(r[key])) for r in read_jsonl(Path(run) / "metrics.jsonl")
            if r.get("kind") == "val" and key in r]


def chosen_checkpoint(run: Path, key: str) -> tuple[Path, int, bool]:
    """(checkpoint at the lowest dev loss among those kept, its step, whether the dev loss was still falling)."""
    curve = dev_curve(run, key)
    if not curve:
        raise RecipeError(f"{run}: no validation rows in metrics.jsonl: not a finished fine-tuning run")
    kept = {int(c.name.split("_")[1]): c for c in checkpoints(Path(run))}
    candidates = [(loss, step) for step, loss in curve if step in kept]
    if not candidates:
        raise RecipeError(f"{run}: no checkpoint at a validation step: set train.ckpt_every=train.eval_every")
    _, step = min(candidates)
    still_falling = min(curve, key=lambda c: c[1])[0] == curve[-1][0]
    return kept[step], step, still_falling


def run_scores(run_dir: str | Path) -> dict:
    """{task, accuracy, docs, correct_D, counted_D, items, step, still_falling, chance, baseline, baseline_rule} of a
    fine-tuned run on the test split at its dev-best checkpoint (per-document sums: what the bootstrap resamples)."""
    cfg = load_recipe_of(Path(run_dir))
    objective = objective_for(cfg)
    if not isinstance(objective, UnderstandingObjective):
        raise RecipeError(f"{run_dir}: train.objective={cfg.train.objective.type} is not an understanding task")
    ckpt, step, falling = chosen_checkpoint(Path(run_dir), objective.eval_loss_key)
    data = objective.prepare_data(cfg)
    model = objective.build_model(cfg)
    load_weights_into(model, ckpt)
    items = data.examples["test"]
    c, n = objective.item_scores(model, items)
    docs, inverse = np.unique(items.doc, return_inverse=True)
    base = data.meta["baselines"]["test"]
    return {"task": objective.task, "accuracy": float(c.sum() / max(1, n.sum())), "items": int(len(c)),
            "docs": docs.tolist(), "correct_D": np.bincount(inverse, weights=c, minlength=len(docs)).tolist(),
            "counted_D": np.bincount(inverse, weights=n, minlength=len(docs)).tolist(), "step": step,
            "still_falling": falling, "chance": base["chance"], "baseline": base["baseline"],
            "baseline_rule": base["baseline_rule"], "model_type": str(cfg.model.type)}


def combined_interval(arm: dict[int, dict], other: Optional[dict[int, dict]] = None, level: float = 0.95,
                      seed: int = 0) -> dict:
    """{mean, low, high, se, seed_var, item_var, n, p} of the seed mean of an arm's accuracy (``other``: of the
    paired difference arm - other over their common seeds), counting seed and item-sampling error (module
    docstring); ``p``: the two-sided t test of mean 0 (a difference's)."""
    seeds = sorted(s for s in arm if other is None or s in other)
    if not seeds:
        return {"mean": None, "low": None, "high": None, "se": None, "seed_var": None, "item_var": None, "n": 0,
                "p": None, "level": level}
    every = [arm[s] for s in seeds] + ([other[s] for s in seeds] if other is not None else [])
    docs = sorted(set.intersection(*[set(r["docs"]) for r in every]))  # one test set: the documents all share
    c_SD, n_SD = _on(arm, seeds, docs)
    oc_SD, on_SD = _on(other, seeds, docs) if other is not None else (None, None)
    rng = np.random.default_rng(seed)
    picks_RD = rng.integers(0, c_SD.shape[1], size=(RESAMPLES, c_SD.shape[1]))

    def per_seed(c, n, picks=None):
        if picks is None:
            return c.sum(1) / np.maximum(1, n.sum(1))  # (n,)
        return c[:, picks].sum(2) / np.maximum(1, n[:, picks].sum(2))  # (n, R)

    values = per_seed(c_SD, n_SD) - (per_seed(oc_SD, on_SD) if other is not None else 0.0)
    boot = per_seed(c_SD, n_SD, picks_RD) - (per_seed(oc_SD, on_SD, picks_RD) if other is not None else 0.0)
    k = len(seeds)
    seed_var = float(values.var(ddof=1)) if k > 1 else 0.0
    item_var = float(boot.mean(0).var(ddof=1))
    se = math.sqrt(seed_var / k + item_var)
    mean = float(values.mean())
    q = float(stats.t.ppf(0.5 + level / 2, k - 1)) if k > 1 else float(stats.norm.ppf(0.5 + level / 2))
    p = None
    if se > 0:
        z = abs(mean) / se
        p = float(2 * (stats.t.sf(z, k - 1) if k > 1 else stats.norm.sf(z)))
    return {"mean": mean, "low": mean - q * se, "high": mean + q * se, "se": se, "seed_var": seed_var,
            "item_var": item_var, "n": k, "p": p, "level": level}


def _on(runs: dict[int, dict], seeds: Sequence[int], docs: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(correct (n, D), counted (n, D)) of ``runs`` on ``docs``."""
    c = np.zeros((len(seeds), len(docs)))
    n = np.zeros((len(seeds), len(docs)))
    for i, s in enumerate(seeds):
        where = {d: k for k, d in enumerate(runs[s]["docs"])}
        c[i] = [runs[s]["correct_D"][where[d]] for d in docs]
        n[i] = [runs[s]["counted_D"][where[d]] for d in docs]
    return c, n


def seeds_needed(d: dict, level: float) -> Optional[int]:
    """Seeds at which an interval of ``d`` (:func:`combined_interval` of a difference) at ``level`` would exclude
    0 if its mean and variances held; None when the item-sampling error alone keeps it from doing so (more test
    items are needed, not seeds)."""
    if d["mean"] is None or d["mean"] == 0:
        return None
    for k in range(max(2, d["n"]), 1001):
        q = float(stats.t.ppf(0.5 + level / 2, k - 1))
        if q * math.sqrt(d["seed_var"] / k + d["item_var"]) < abs(d["mean"]):
            return k
    return None


def decide(comparisons: list[dict], margin: float, alpha: float = 0.05) -> list[dict]:
    """Holm over ``comparisons`` ({arm, other: {seed: run_scores}}, ...): each gets ``interval`` (its paired
    difference at its Holm level) and ``class``: better / worse (the interval excludes 0), equivalent (inside
    +-``margin``), else unresolved with ``seeds_needed`` (:func:`seeds_needed`)."""
    raw = [combined_interval(c["arm_runs"], c["other_runs"]) for c in comparisons]
    m = len(raw)
    order = sorted(range(m), key=lambda i: (raw[i]["p"] is None, raw[i]["p"] or 0.0))
    out = [dict(c) for c in comparisons]
    stopped = False
    for rank, i in enumerate(order):
        level = 1 - alpha / (m - rank)
        iv = combined_interval(comparisons[i]["arm_runs"], comparisons[i]["other_runs"], level=level)
        rejected = not stopped and iv["p"] is not None and iv["p"] <= alpha / (m - rank)
        stopped = stopped or not rejected
        if iv["mean"] is None:
            cls = "no runs"
        elif rejected:
            cls = "better" if iv["mean"] > 0 else "worse"
        elif -margin < iv["low"] and iv["high"] < margin:
            cls = "equivalent"
        else:
            cls = "unresolved"
        out[i].update(interval=iv, **{"class": cls}, seeds_needed=seeds_needed(iv, level) if cls == "unresolved"
                      else None)
        out[i].pop("arm_runs", None)
        out[i].pop("other_runs", None)
    return out
