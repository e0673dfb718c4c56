"""Coverage of the CEG interval by simulation: studies whose compute-equivalent gain is known.

Each simulated study is one comparison as ``tools.experiment`` runs it: the reference trains one WSD trunk
per seed with cooldown branches at 1/4, 1/2, 1 and 2x the budget (its seeded run is the 1x branch), the arm
trains seeds at the budget, and its true loss is the reference's at g x the budget (true CEG g). Losses are
the true curve plus noise of sd ``sigma`` at the budget, growing with the excess loss L - E at smaller
computes; a share of a trunk's noise is common to its branches (``trunk_share``). Two regimes: the arm's
seeds independent of the reference's, or sharing a per-seed component with the reference's seed (same seed,
same data order: correlation ``rho`` with its budget run). The laws and seed noise are those of two committed
reports (the reference's fitted curve and the sd of its seeded runs).

``python -m analysis.ceg_coverage`` prints the table quoted in docs/experiments/README.md.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

import numpy as np

from analysis import compute_curve, fair, verdicts

FRACTIONS = (0.25, 0.5, 1.0, 2.0)
BUDGET = 4.2e12


@dataclass(frozen=True)
class Law:
    """L(C) = E + A' (C / c0)^-alpha with the seed sd of the reference's seeded runs at the budget."""
    name: str
    E: float
    A_c0: float
    alpha: float
    c0: float
    sigma: float

    def loss(self, c):
        return self.E + self.A_c0 * (np.asarray(c) / self.c0) ** -self.alpha


LAWS = {
    # optimizers-and-objectives, LLaMA + AdamW: fitted curve of the committed report, seed sd 0.018 nats
    "optimizers": Law("optimizers-and-objectives (LLaMA + AdamW)", 2.598, 1.214, 0.505, 0.710 * BUDGET, 0.018),
    # evolution, the 2017 baseline: a steeper curve and noisier seeds (sd 0.047 nats)
    "evolution": Law("evolution (2017 baseline)", 2.614, 1.951, 0.616, 1.413 * BUDGET, 0.047),
}


def simulate(rng: np.random.Generator, law: Law, n_seeds: int, regime: str, g: float,
             trunk_share: float = 0.5, rho: float = 0.5) -> tuple[dict, dict, dict]:
    """(reference curves {seed: [(C, L)]}, reference seeded losses, arm losses) of one simulated study."""
    cs = np.array([f * BUDGET for f in FRACTIONS])
    scale = (law.loss(cs) - law.E) / (law.loss(BUDGET) - law.E)
    curves, ref, arm = {}, {}, {}
    for s in range(n_seeds):
        trunk = rng.standard_normal()
        noise = law.sigma * scale * (math.sqrt(trunk_share) * trunk
                                     + math.sqrt(1 - trunk_share) * rng.standard_normal(len(cs)))
        ls = law.loss(cs) + noise
        curves[s] = list(zip(cs.tolist(), ls.tolist()))
        ref[s] = float(ls[FRACTIONS.index(1.0)])
        own = rng.standard_normal()
        if regime == "shared":  # the arm's seed shares the reference seed's budget noise (correlation rho)
            z = (ref[s] - float(law.loss(BUDGET))) / law.sigma
            v = rho * z + math.sqrt(1 - rho * rho) * own
        else:
            v = own
        arm[s] = float(law.loss(g * BUDGET)) + law.sigma * v
    return curves, ref, arm


def paired_interval(curves: dict, ref: dict, arm: dict, level: float = 0.95) -> tuple[float, float, float]:
    """(ln CEG, low, high) of the paired inference (``analysis.verdicts``) of one comparison."""
    fit = compute_curve.fit_compute_curve([p for pts in curves.values() for p in pts])
    comp = {s: BUDGET for s in arm}
    scale, x, why = verdicts.seed_values(fit, arm, ref, comp, comp)
    if scale != verdicts.LN_CEG:
        return math.nan, math.nan, math.nan
    var, m = verdicts.curve_variance(curves, arm, ref, comp, comp, fit)
    res = verdicts.paired_inference(list(x.values()), (math.log(0.9), math.log(1.1)), var, m)
    lo, hi = verdicts.interval(res, 1 - level)
    return res["mean"], lo, hi


def bootstrap_interval(curves: dict, ref: dict, arm: dict, n_boot: int = 400) -> tuple[float, float, float]:
    """(ln CEG, low, high) of ``analysis.fair.compute_equivalent_gain`` (expanded percentile bootstrap)."""
    res = fair.compute_equivalent_gain(curves, arm, BUDGET, n_boot=n_boot)
    if res["ceg"] is None or res["low"] is None or res["high"] is None:
        return math.nan, -math.inf if res["low"] is None else math.log(res["low"]), \
            math.inf if res["high"] is None else math.log(res["high"])
    return math.log(res["ceg"]), math.log(res["low"]), math.log(res["high"])


def coverage(law: Law, n_seeds: int, regime: str, n_sims: int, g: float = 1.25, seed: int = 0,
             method: str = "paired") -> dict:
    """Share of simulated studies whose interval holds ln g, with the median interval width (in CEG ratio)."""
    rng = np.random.default_rng(seed)
    fn = paired_interval if method == "paired" else bootstrap_interval
    hits, widths, undefined = 0, [], 0
    for _ in range(n_sims):
        est, lo, hi = fn(*simulate(rng, law, n_seeds, regime, g))
        if not (math.isfinite(lo) or math.isfinite(hi)) and math.isnan(est):
            undefined += 1
        hits += int(lo <= math.log(g) <= hi)
        if math.isfinite(lo) and math.isfinite(hi):
            widths.append(math.exp(hi - lo))
    return {"law": law.name, "seeds": n_seeds, "regime": regime, "sims": n_sims, "g": g, "method": method,
            "coverage": hits / n_sims, "median_width_ratio": float(np.median(widths)) if widths else None,
            "undefined": undefined}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="Coverage of the 95% CEG interval in simulated studies with a known "
                                "CEG (module docstring): a markdown table.")
    p.add_argument("--sims", type=int, default=2000, help="simulated studies per cell (default 2000)")
    p.add_argument("--laws", nargs="+", default=list(LAWS), choices=list(LAWS))
    p.add_argument("--seeds", nargs="+", type=int, default=[3, 5])
    p.add_argument("--method", nargs="+", default=["paired"], choices=["paired", "bootstrap"])
    p.add_argument("--g", type=float, default=1.25, help="the true CEG (default 1.25)")
    a = p.parse_args(argv)
    print("| law | method | seeds | regime | coverage of 95% | median interval (hi/lo ratio) | studies |")
    print("|---|---|---|---|---|---|---|")
    for name in a.laws:
        for method in a.method:
            for n in a.seeds:
                for regime in ("independent", "shared"):
                    r = coverage(LAWS[name], n, regime, a.sims, g=a.g, method=method)
                    w = "-" if r["median_width_ratio"] is None else f"{r['median_width_ratio']:.3f}"
                    print(f"| {name} | {method} | {n} | {regime} | {r['coverage']:.3f} | {w} | {r['sims']} |",
                          flush=True)


if __name__ == "__main__":
    main()
