"""Run folders as points of a scaling study: N (the kinds of parameter count), D, C and the final loss of
each finished run; runs that are seeds of one point averaged; runs that cannot be points left out with
the reason; cooldown branches grouped by trunk (the bootstrap's independent units).

Which runs are points and what N counts: docs/methods/scaling.md.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional

import numpy as np
from omegaconf import OmegaConf

from analysis.runs import LEARN_MARGIN, SWEEP_MANIFEST
from archlab.train.checkpoint import CKPT_DIR

N_KINDS = {  # --n-kind -> what N counts, as named in every table and figure (docs/methods/scaling.md)
    "non_embedding": "non-embedding parameters, LM head excluded",  # Kaplan's N, tied or untied alike
    "with_head": "non-embedding parameters + LM head",  # the head's D x V matmul counted, tied or untied alike
    "untied_head": "non-embedding parameters, untied LM head only",  # archlab.costs' non_embedding: tied != untied
    "active": "active non-embedding parameters, LM head excluded",  # one token's: MoE's K routed + shared experts
    "total": "total parameters",  # embeddings and an untied head included (default: Chinchilla, Pearce & Song 2024)
}
N_COUNTS = {"non_embedding": "non_embedding_no_head", "with_head": "non_embedding_with_head",
            "untied_head": "non_embedding", "active": "active_no_head", "total": "total"}  # archlab.costs.param_counts
# recipe keys ignored when recognising the seeds of one point: the seed itself, and keys that
# name, place or log a run without changing what it learns
SEED_KEYS = ("train.seed",)
BOOKKEEPING_KEYS = ("name", "description", "extra", "train.run_name", "train.out_dir", "train.resume",
                    "train.log_every", "train.ckpt_every", "train.keep_last", "train.tensorboard",
                    "train.trackers", "train.tracker_project", "train.router_trace_every",
                    "train.routing_every", "train.peak_flops", "train.compile", "data.cache_dir",
                    "train.branch_from", "train.ckpt_steps")  # a cooldown branch's trunk folder and its checkpoints


@dataclass
class Point:
    """One finished run (or the mean of a seed group) as a point of its family's scaling curves."""

    run: str  # the run (a seed group: its first run by seed)
    family: str
    is_moe: bool
    flops: float  # training FLOPs spent: tokens seen x training FLOPs per token
    loss: float  # final validation loss (nats/token) at the training context length; a seed group's mean
    tokens: float
    params_total: int
    params_active: int
    flops_per_token: float
    params: dict = field(default_factory=dict)  # every count of archlab.costs.param_counts
    seed: Optional[int] = None  # train.seed
    group: str = ""  # seed-group key: the recipe without SEED_KEYS and BOOKKEEPING_KEYS, and the tokens
    budget: Optional[float] = None  # the sweep's FLOPs budget of this point (its manifest), if any
    budget_compute: str = ""  # what that budget counts: "measured" training FLOPs | "6nd" | "" (no sweep budget)
    n_seeds: int = 1
    loss_std: float = 0.0  # std of the loss over the seeds (ddof 1; 0 for one seed)
    seed_runs: list = field(default_factory=list)
    seed_losses: list = field(default_factory=list)
    units: list = field(default_factory=list)  # independent units of its runs: a branch's trunk folder, else the run
    shape: str = ""  # its sweep ladder (a depth/width rule): the sizes of one ladder share a FLOPs-per-token curve


def n_of_counts(counts: dict, kind: str) -> float:
    """N of kind ``kind`` (a key of ``N_KINDS``) from a run's ``archlab.costs.param_counts`` dict."""
    if kind not in N_KINDS:
        raise ValueError(f"n_kind {kind!r}: valid are {', '.join(N_KINDS)}")
    return float(counts[N_COUNTS[kind]])


def n_params(p: Point, kind: str) -> float:
    """The N of a point (a key of ``N_KINDS``)."""
    return n_of_counts(p.params, kind)


def trunk_of(run) -> Optional[str]:
    """The run folder a cooldown branch started from (summary.json ``branch_from``, else the recipe's
    ``train.branch_from``: a checkpoint ``<trunk>/checkpoints/step_...``), None for other runs."""
    src = (run.summary or {}).get("branch_from") or run.recipe.train.get("branch_from")
    if not src:
        return None
    path = Path(str(src))
    return str(path.parent.parent if path.parent.name == CKPT_DIR else path)


def cluster_labels(points: list[Point]) -> list[int]:
    """One label per point; points share a label when their runs share a trunk, directly or through
    other points (a seed group of branches joins the trunks of all its seeds). A run that is not a
    branch is its own unit. These are the independent units that the bootstrap resamples."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for p in points:
        units = p.units or [p.run]
        for u in units[1:]:
            parent[find(u)] = find(units[0])
    roots: dict[str, int] = {}
    return [roots.setdefault(find((p.units or [p.run])[0]), len(roots)) for p in points]


def seed_key(recipe, tokens: Optional[float]) -> str:
    """Runs with equal keys are seeds of one point: same resolved recipe but for ``SEED_KEYS`` and
    ``BOOKKEEPING_KEYS``, and the same tokens seen."""
    try:
        d = OmegaConf.to_container(recipe, resolve=True)
    except Exception:  # an interpolation that does not resolve outside its run: compare it unresolved
        d = OmegaConf.to_container(recipe, resolve=False)
    for key in SEED_KEYS + BOOKKEEPING_KEYS:
        *path, last = key.split(".")
        node = d
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    blob = json.dumps([d, None if tokens is None else round(tokens)], sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:12]


def _manifest_points(folder: Path, cache: dict) -> dict[str, dict]:
    """run name -> its point in the sweep manifest in ``folder`` (empty if none or unreadable), read once per
    folder."""
    if folder not in cache:
        try:
            points = json.loads((folder / SWEEP_MANIFEST).read_text()).get("points", [])
            cache[folder] = {str(p["name"]): p for p in points if isinstance(p, dict) and "name" in p}
        except (OSError, ValueError, TypeError, AttributeError):
            cache[folder] = {}
    return cache[folder]


def _sweep_budget(point: dict) -> tuple[Optional[float], str]:
    """(FLOPs budget, what it counts: "measured" training FLOPs or "6nd") of a sweep manifest point
    (``tools.sweep``'s ``cooldown.compute``); (None, "") when it has no FLOPs budget."""
    if point.get("budget_kind") == "flops" and point.get("budget"):
        return float(point["budget"]), str((point.get("cooldown") or {}).get("compute", "measured"))
    return None, ""


def _sweep_ladder(point: dict) -> str:
    """A sweep manifest point's ladder (one recipe's depth/width rule: its sizes share one FLOPs-per-token
    curve); "" when it has none."""
    return str(point["ladder"]) if point.get("ladder") else ""


BUDGET_CONVENTIONS = {"measured": "measured training FLOPs", "6nd": "C = 6 N D (N: non-embedding without the head)",
                      "": "training FLOPs within the budget tolerance (no sweep budget)"}


def budget_convention(points: list[Point]) -> str:
    """What the IsoFLOP budgets of these points count, in words (one line per convention found)."""
    kinds = sorted({p.budget_compute for p in points})
    return "; ".join(f"{BUDGET_CONVENTIONS.get(k, k)} ({sum(p.budget_compute == k for p in points)} points)"
                     for k in kinds)


def collect(runs, keep_unlearned: bool = False) \
        -> tuple[list[Point], list[dict], dict[str, list[tuple[str, np.ndarray, np.ndarray, np.ndarray]]]]:
    """(points of finished runs, excluded runs with reasons, validation curves per family).

    Curves: family -> [(run, tokens_T, flops_T, loss_T)] from each usable run's validation rows.
    ``keep_unlearned``: a run that did not get ``LEARN_MARGIN`` below its unigram entropy stays a point
    (for smoke tests of tiny runs), listed in the excluded list with status "near-unigram (kept)".
    """
    points, excluded, curves, manifests = [], [], {}, {}
    for r in runs:
        if r.status != "finished":
            excluded.append({"run": str(r.path), "status": r.status, "reason": r.reason})
            continue
        if (r.summary or {}).get("role") == "stable":
            excluded.append({"run": str(r.path), "status": "not-a-scaling-point",
                             "reason": "a WSD stable trunk (constant lr to the end): its cooldown branches are the "
                                       "scaling points"})
            continue
        unigram = (r.summary or {}).get("unigram_entropy_train")
        if unigram is not None and math.isfinite(unigram) and float(r.final_val_loss) > unigram - LEARN_MARGIN:
            excluded.append({"run": str(r.path), "status": "near-unigram (kept)" if keep_unlearned else "near-unigram",
                             "reason": f"final validation loss {float(r.final_val_loss):.3f} is not {LEARN_MARGIN} "
                                       f"nats below the training split's unigram entropy {unigram:.3f}: it learned no "
                                       "more than token frequencies, not a point on a scaling law"
                                       + ("; kept as a point (--keep-unlearned)" if keep_unlearned else "")})
            if not keep_unlearned:
                continue
        tokens = r.tokens_seen
        seed = r.recipe.train.get("seed")
        entry = _manifest_points(r.path.parent, manifests).get(r.name, {})
        budget, compute = _sweep_budget(entry)
        ladder = _sweep_ladder(entry)
        trunk = trunk_of(r)
        points.append(Point(run=r.name, family=r.family, is_moe=r.is_moe, flops=r.training_flops(tokens),
                            loss=float(r.final_val_loss), tokens=tokens, params_total=r.params["total"],
                            params_active=r.params["active"], flops_per_token=r.flops_per_token,
                            params=dict(r.params), seed=None if seed is None else int(seed),
                            group=seed_key(r.recipe, tokens),
                            budget=budget, budget_compute=compute,
                            seed_runs=[r.name], seed_losses=[float(r.final_val_loss)],
                            units=[trunk or str(r.path)], shape=ladder))
        rows = [v for v in r.val_rows if v.get("tokens") and math.isfinite(v["loss"])]
        if rows:
            t = np.array([v["tokens"] for v in rows], dtype=float)
            curves.setdefault(r.family, []).append((r.name, t, t * r.flops_per_token,
                                                    np.array([v["loss"] for v in rows], dtype=float)))
    return points, excluded, curves


def _mean_curve(cs: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]], name: str):
    """Seeds' validation curves averaged on the first one's tokens (interpolated in ln tokens where
    the evaluation steps differ; tokens beyond a seed's curve keep the others' mean)."""
    _, t, c, _ = cs[0]
    stack = []
    for _, ti, _, li in cs:
        if len(ti) == len(t) and np.allclose(ti, t):
            stack.append(li)
        else:
            y = np.interp(np.log(t), np.log(ti), li)
            stack.append(np.where((t >= ti.min()) & (t <= ti.max()), y, np.nan))
    with np.errstate(invalid="ignore"):
        loss = np.nanmean(np.asarray(stack), axis=0)
    return name, t, c, loss


def average_seeds(points: list[Point], curves: dict) -> tuple[list[Point], dict, dict[str, list[list[float]]]]:
    """(one point per seed group with the mean loss, the seed-averaged curves, family -> the seed
    groups' losses for :func:`pooled_std`). A group is named after its first run by seed."""
    groups: dict[tuple[str, str], list[Point]] = {}
    for p in points:
        groups.setdefault((p.family, p.group or p.run), []).append(p)
    by_run = {c[0]: c for cs in curves.values() for c in cs}
    out, out_curves, losses = [], {}, {}
    for (fam, _), ps in groups.items():
        ps = sorted(ps, key=lambda p: (p.seed is None, p.seed if p.seed is not None else 0, p.run))
        L = np.array([p.loss for p in ps])
        first = ps[0]
        out.append(replace(first, loss=float(L.mean()), loss_std=float(L.std(ddof=1)) if len(L) > 1 else 0.0,
                           n_seeds=len(ps), seed_runs=[p.run for p in ps], seed_losses=L.tolist(),
                           units=sorted({u for p in ps for u in (p.units or [p.run])}),
                           tokens=float(np.mean([p.tokens for p in ps])), flops=float(np.mean([p.flops for p in ps]))))
        losses.setdefault(fam, []).append(L.tolist())
        cs = [by_run[p.run] for p in ps if p.run in by_run]
        if cs:
            out_curves.setdefault(fam, []).append(_mean_curve(cs, first.run))
    return out, out_curves, losses
