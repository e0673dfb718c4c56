"""Coverage of the lr interval (``analysis.lr_choice``) by simulation: tuning grids whose optimal lr is known.

Each simulated grid is a tuning stage's: six lrs a factor 2 apart (1e-3 .. 3.2e-2), one run per lr whose final
loss is a convex valley in ln lr around the true optimum (drawn log-uniformly between the grid's second and
second-to-last lr) plus Gaussian seed noise. Two valleys: a parabola (the model the fit assumes; curvature 0.1 nats
per ln(lr)^2, as flat as the committed grids' optima) and an asymmetric one (the same parabola with 0.6x its
curvature below the optimum and 1.4x above it, as a loss that rises faster towards divergence: a shape the fit does
not follow). Two sources of the seed sd: given (the report's case: the seeded runs' pooled sd) or estimated from the
fit's residuals (the tuning stage's case). A hit: the interval holds the true optimum (an open side holds
everything beyond the grid's end).

    python -m analysis.lr_coverage --replicates 1000
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from analysis import lr_choice

GRID = [1e-3 * 2 ** k for k in range(6)]
CURVATURE = 0.1
SD = 0.01  # nats: the seed sd of the committed reports' seeded runs is 0.01-0.04


def valley(lr: float, opt: float, skew: bool) -> float:
    """The true final loss at ``lr``: 3 + c ln(lr / opt)^2, c scaled by 0.6 below the optimum and 1.4 above it
    when ``skew``."""
    x = math.log(lr / opt)
    c = CURVATURE * ((0.6 if x < 0 else 1.4) if skew else 1.0)
    return 3.0 + c * x * x


def coverage(rng: np.random.Generator, n: int, sd: float = SD, give_sd: bool = True, skew: bool = False,
             level: float = lr_choice.LEVEL) -> float:
    """The share of ``n`` simulated grids whose ``level`` interval holds the true optimal lr."""
    hits = 0
    for _ in range(n):
        opt = math.exp(rng.uniform(math.log(GRID[1]), math.log(GRID[-2])))
        losses = [valley(lr, opt, skew) + sd * rng.standard_normal() for lr in GRID]
        res = lr_choice.choose(GRID, losses, noise_sd=sd if give_sd else None, level=level)
        if res["low"] is None:
            continue  # no interval (a fit that does not curve upwards): a miss
        low = 0.0 if res["open_low"] else res["low"]
        high = math.inf if res["open_high"] else res["high"]
        hits += low <= opt <= high
    return hits / n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.lr_coverage", description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicates", type=int, default=1000, help="simulated grids per row (default 1000)")
    ap.add_argument("--seed", type=int, default=1, help="numpy seed (default 1)")
    args = ap.parse_args(argv)
    n = args.replicates
    tol = math.sqrt(lr_choice.LEVEL * (1 - lr_choice.LEVEL) / n)
    print(f"nominal {lr_choice.LEVEL:.0%} interval, {n} grids per row, binomial sd {tol:.3f}")
    print("| valley | seed sd | measured coverage |\n|---|---|---|")
    for skew in (False, True):
        for give_sd in (True, False):
            cov = coverage(np.random.default_rng(args.seed), n, give_sd=give_sd, skew=skew)
            print(f"| {'asymmetric (0.6x / 1.4x)' if skew else 'parabola'} | "
                  f"{'given' if give_sd else 'from the residuals'} | {cov:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
