"""Coverage of the lr interval (``analysis.lr_choice``) by simulation: tuning grids whose optimal lr is known.

Each simulated grid is a tuning stage's: six lrs a factor 2 apart (1e-3 .. 3.2e-2), one run per lr whose final
loss is a convex valley in ln lr around the true optimum (drawn log-uniformly between the grid's second and
second-to-last lr) plus seed noise. Three cases: a parabola (curvature 0.1 nats per ln(lr)^2, as flat as the
committed grids' optima) with Gaussian noise; an asymmetric valley (0.6x that curvature below the optimum, 1.4x
above it, as a loss that rises faster towards divergence) with Gaussian noise; the asymmetric valley with
heavy-tailed noise (Student-t, 3 degrees of freedom, scaled to the same sd). Two sources of the seed sd: given (the
report's case: the seeded runs' pooled sd) or estimated from the fit's residuals (the tuning stage's case). A hit:
the interval holds the true optimum (an open side holds everything beyond the grid's end). Each row prints both
methods of ``lr_choice.choose`` (the earlier "fieller", the current "profile") with the binomial sd of each coverage
and the median width of the interval in ln lr (clipped to the grid; the share with an open side beside it).

    python -m analysis.lr_coverage --replicates 500
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from analysis import lr_choice

GRID = [1e-3 * 2 ** k for k in range(6)]
CURVATURE = 0.1
SD = 0.01  # nats: the seed sd of the committed reports' seeded runs is 0.01-0.05
CASES = {"parabola": (False, "normal"), "asymmetric": (True, "normal"), "asymmetric-t3": (True, "t3")}
NOISES = ("normal", "t3")


def valley(lr, opt: float, skew: bool):
    """The true final loss at ``lr``: 3 + c ln(lr / opt)^2, c scaled by 0.6 below the optimum and 1.4 above it
    when ``skew``."""
    x = np.log(np.asarray(lr) / opt)
    c = CURVATURE * (np.where(x < 0, 0.6, 1.4) if skew else 1.0)
    return 3.0 + c * x * x


def seed_noise(rng: np.random.Generator, size: int, sd: float, noise: str) -> np.ndarray:
    """``size`` draws of seed noise of sd ``sd``: normal, or Student-t with 3 df scaled to that sd (its variance
    is 3 before scaling)."""
    if noise == "normal":
        return sd * rng.standard_normal(size)
    if noise == "t3":
        return sd * rng.standard_t(3, size) / math.sqrt(3.0)
    raise ValueError(f"noise {noise!r}: one of {', '.join(NOISES)}")


def simulate(rng: np.random.Generator, n: int, sd: float = SD, give_sd: bool = True, skew: bool = False,
             noise: str = "normal", method: str = "profile", level: float = lr_choice.LEVEL) -> dict:
    """{coverage, sd (binomial, at the measured coverage), width (median ln(high / low), clipped to the grid),
    open (share with an open side), n} over ``n`` simulated grids."""
    hits, widths, opened = 0, [], 0
    for _ in range(n):
        opt = math.exp(rng.uniform(math.log(GRID[1]), math.log(GRID[-2])))
        losses = valley(GRID, opt, skew) + seed_noise(rng, len(GRID), sd, noise)
        res = lr_choice.choose(GRID, list(losses), noise_sd=sd if give_sd else None, level=level, method=method,
                               rng=rng)
        if res["low"] is None:
            widths.append(math.inf)
            continue  # no interval (a fit that does not curve upwards): a miss
        low = 0.0 if res["open_low"] else res["low"]
        high = math.inf if res["open_high"] else res["high"]
        hits += low <= opt <= high
        opened += res["open_low"] or res["open_high"]
        widths.append(math.log(res["high"] / res["low"]))
    cov = hits / n
    return {"coverage": cov, "sd": math.sqrt(cov * (1 - cov) / n),
            "width": float(np.median(widths)), "open": opened / n, "n": n}


def coverage(rng: np.random.Generator, n: int, sd: float = SD, give_sd: bool = True, skew: bool = False,
             level: float = lr_choice.LEVEL, noise: str = "normal", method: str = "profile") -> float:
    """The share of ``n`` simulated grids whose ``level`` interval holds the true optimal lr."""
    return simulate(rng, n, sd, give_sd, skew, noise, method, level)["coverage"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.lr_coverage", description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicates", type=int, default=500, help="simulated grids per cell (default 500)")
    ap.add_argument("--seed", type=int, default=1, help="numpy seed (default 1)")
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    args = ap.parse_args(argv)
    if args.replicates < 1:
        ap.error(f"--replicates {args.replicates}: at least 1 (500 gives a binomial sd near 0.018)")
    n = args.replicates
    print(f"nominal {lr_choice.LEVEL:.0%} interval, {n} grids per cell, seed sd {SD} nats; coverage (binomial sd), "
          "median width in ln lr clipped to the grid [share open]")
    print("| valley | seed sd | fieller: coverage | width | profile: coverage | width |\n|---|---|---|---|---|---|")
    for case in args.cases:
        skew, noise = CASES[case]
        for give_sd in (True, False):
            cells = [simulate(np.random.default_rng(args.seed), n, give_sd=give_sd, skew=skew, noise=noise,
                              method=m) for m in ("fieller", "profile")]
            text = " | ".join(f"{r['coverage']:.3f} ({r['sd']:.3f}) | {r['width']:.2f} [{r['open']:.2f}]"
                              for r in cells)
            print(f"| {case} | {'given' if give_sd else 'estimated'} | {text} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
