"""Seed noise: the pooled std of the seed groups (the noise floor) and the designer's noise model (sigma of
ln L per run, the share that the branches of one WSD trunk have in common) from seed pairs."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Optional, Sequence

import numpy as np

from analysis.scaling.fits.common import NO_SEEDS, OK, json_safe


@dataclass
class NoiseFloor:
    """Pooled standard deviation of the loss over seed groups (runs that differ only in train.seed):
    sqrt(sum (n_i - 1) s_i^2 / sum (n_i - 1)), in nats/token."""

    status: str
    message: str = ""
    std: Optional[float] = None
    dof: int = 0
    n_groups: int = 0  # groups with >= 2 finite seeds
    n_runs: int = 0

    def to_json(self) -> dict:
        return json_safe(asdict(self))


def pooled_std(groups: Sequence[Sequence[float]]) -> NoiseFloor:
    """Noise floor from seed groups (each a sequence of losses of one point); non-finite losses are left out."""
    ss, dof, n_groups, n_runs = 0.0, 0, 0, 0
    for g in groups:
        x = np.asarray(g, dtype=float)
        x = x[np.isfinite(x)]
        n_runs += len(x)
        if len(x) >= 2:
            ss += float(((x - x.mean()) ** 2).sum())
            dof += len(x) - 1
            n_groups += 1
    if dof == 0:
        return NoiseFloor(status=NO_SEEDS, n_runs=n_runs,
                          message="no point was trained with more than one seed: noise floor unknown")
    return NoiseFloor(status=OK, std=math.sqrt(ss / dof), dof=dof, n_groups=n_groups, n_runs=n_runs)


@dataclass
class DesignNoise:
    """The designer's noise model measured from seed pairs (``analysis.scaling design``'s ``noise:``):
    sigma = std of ln L of one run, from the pairs' differences d = ln L_2 - ln L_1 (E d = 0, Var d =
    2 sigma^2); trunk_share = the share of sigma^2 that the branches of one WSD trunk have in common,
    1 - (within-trunk variance of d) / (variance of d), from the trunks with >= 2 branches' pairs."""

    status: str
    message: str = ""
    sigma: Optional[float] = None
    n_pairs: int = 0
    trunk_share: Optional[float] = None
    n_trunks: int = 0  # trunks with >= 2 branches' pairs

    def to_json(self) -> dict:
        return json_safe(asdict(self))


def design_noise(pairs: Sequence[tuple[object, float, float]]) -> DesignNoise:
    """:class:`DesignNoise` from (trunk label, loss of seed 1, loss of seed 2) triples, one per point
    trained with two seeds (losses in nats; the label groups the branches of one pair of trunks)."""
    rows = [(c, math.log(b) - math.log(a)) for c, a, b in pairs
            if a > 0 and b > 0 and math.isfinite(a) and math.isfinite(b)]
    if not rows:
        return DesignNoise(status=NO_SEEDS, message="no point was trained with two seeds: noise not measured")
    d = np.array([x for _, x in rows])
    out = DesignNoise(status=OK, sigma=float(math.sqrt(np.mean(d ** 2) / 2.0)), n_pairs=len(d))
    by: dict = {}
    for c, x in rows:
        by.setdefault(c, []).append(x)
    groups = [np.asarray(g) for g in by.values() if len(g) >= 2]
    dof = sum(len(g) - 1 for g in groups)
    if dof and np.mean(d ** 2) > 0:
        within = sum(float(((g - g.mean()) ** 2).sum()) for g in groups) / dof
        out.trunk_share = float(min(1.0, max(0.0, 1.0 - within / np.mean(d ** 2))))
        out.n_trunks = len(groups)
    else:
        out.message = "no trunk has two branches trained with both seeds: trunk share not measured"
    return out
