"""Coverage of the CEG interval by simulation: studies whose compute-equivalent gain is known.

Each simulated study is one comparison as ``tools.experiment`` runs it: the reference trains one WSD trunk
per seed with cooldown branches at 1/4, 1/2, 1 and 2x the budget (its seeded run is the 1x branch), the arm
trains seeds at the budget, and its true loss is the reference's at g x the budget (true CEG g). Losses are
the true curve plus noise of sd ``sigma`` at the budget, growing with the excess loss L - E at smaller
computes; a share of a trunk's noise is common to its branches (``trunk_share``). Two regimes: the arm's
seeds independent of the reference's, or sharing a per-seed component with the reference's seed (same seed,
same data order: correlation ``rho`` with its budget run). The laws and seed noise are those of the committed
reports (the reference's fitted curve, and the pooled sd of the seeded runs within arms). Two stress cases:
``noise="t3"`` draws every noise term from a Student-t with 3 df scaled to the same sd; ``truth="misspecified"``
makes the true curve a power law with curvature in log compute, ln(L - E) = ln A' - alpha u + kappa u^2
(u = ln(C / c0), kappa = 0.05: the local exponent drifts by 0.1 across the branches), which the fitter's power law
does not follow.

``python -m analysis.ceg_coverage`` prints the table quoted in docs/experiments/README.md.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, replace

import numpy as np

from analysis import compute_curve, fair, verdicts

FRACTIONS = (0.25, 0.5, 1.0, 2.0)
BUDGET = 4.2e12


NOISES = ("normal", "t3")
TRUTHS = ("power-law", "misspecified")
KAPPA = 0.05  # the misspecified truth's curvature of ln(L - E) in ln compute


@dataclass(frozen=True)
class Law:
    """L(C) = E + A' (C / c0)^-alpha exp(kappa ln(C / c0)^2) with the seed sd of the reference's seeded runs at the
    budget (kappa = 0: the power law the fitter assumes)."""
    name: str
    E: float
    A_c0: float
    alpha: float
    c0: float
    sigma: float
    kappa: float = 0.0

    def loss(self, c):
        u = np.log(np.asarray(c) / self.c0)
        return self.E + self.A_c0 * np.exp(-self.alpha * u + self.kappa * u * u)


LAWS = {
    # each committed report's fitted reference curve (c0 is 0.71x the budget in all three) and the pooled sd of its
    # seeded runs within arms (report.json: groups' loss sd)
    "attention-kv": Law("attention-kv (MHA)", 2.510, 1.310, 0.445, 0.707 * BUDGET, 0.024),
    "optimizers": Law("optimizers-and-objectives (LLaMA + AdamW)", 2.552, 1.283, 0.439, 0.708 * BUDGET, 0.027),
    "balancing": Law("balancing (unbalanced Mixtral)", 2.708, 1.451, 0.519, 0.710 * BUDGET, 0.046),
}


def truth(law: Law, kind: str) -> Law:
    """The law itself ("power-law") or the same law with curvature ``KAPPA`` ("misspecified")."""
    if kind not in TRUTHS:
        raise ValueError(f"truth {kind!r}: one of {', '.join(TRUTHS)}")
    return law if kind == "power-law" else replace(law, name=f"{law.name}, curved", kappa=KAPPA)


def draw(rng: np.random.Generator, noise: str, size=None):
    """Unit-variance noise: normal, or Student-t with 3 df scaled by 1 / sqrt(3) (its variance is 3)."""
    if noise == "normal":
        return rng.standard_normal(size)
    if noise == "t3":
        return rng.standard_t(3, size) / math.sqrt(3.0)
    raise ValueError(f"noise {noise!r}: one of {', '.join(NOISES)}")


def simulate(rng: np.random.Generator, law: Law, n_seeds: int, regime: str, g: float,
             trunk_share: float = 0.5, rho: float = 0.5, noise: str = "normal") -> tuple[dict, dict, dict]:
    """(reference curves {seed: [(C, L)]}, reference seeded losses, arm losses) of one simulated study."""
    cs = np.array([f * BUDGET for f in FRACTIONS])
    scale = (law.loss(cs) - law.E) / (law.loss(BUDGET) - law.E)
    curves, ref, arm = {}, {}, {}
    for s in range(n_seeds):
        trunk = draw(rng, noise)
        shake = law.sigma * scale * (math.sqrt(trunk_share) * trunk
                                     + math.sqrt(1 - trunk_share) * draw(rng, noise, len(cs)))
        ls = law.loss(cs) + shake
        curves[s] = list(zip(cs.tolist(), ls.tolist()))
        ref[s] = float(ls[FRACTIONS.index(1.0)])
        own = draw(rng, noise)
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
             method: str = "paired", noise: str = "normal") -> dict:
    """Share of simulated studies whose interval holds ln g, with its binomial sd and the median interval width
    (in CEG ratio)."""
    rng = np.random.default_rng(seed)
    fn = paired_interval if method == "paired" else bootstrap_interval
    hits, widths, undefined = 0, [], 0
    for _ in range(n_sims):
        est, lo, hi = fn(*simulate(rng, law, n_seeds, regime, g, noise=noise))
        if not (math.isfinite(lo) or math.isfinite(hi)) and math.isnan(est):
            undefined += 1
        hits += int(lo <= math.log(g) <= hi)
        if math.isfinite(lo) and math.isfinite(hi):
            widths.append(math.exp(hi - lo))
    cov = hits / n_sims
    return {"law": law.name, "seeds": n_seeds, "regime": regime, "sims": n_sims, "g": g, "method": method,
            "noise": noise, "coverage": cov, "sd": math.sqrt(cov * (1 - cov) / n_sims),
            "median_width_ratio": float(np.median(widths)) if widths else None, "undefined": undefined}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="Coverage of the 95% CEG interval in simulated studies with a known "
                                "CEG (module docstring): a markdown table.")
    p.add_argument("--sims", type=int, default=1000, help="simulated studies per cell (default 1000)")
    p.add_argument("--laws", nargs="+", default=["attention-kv", "balancing"], choices=list(LAWS))
    p.add_argument("--seeds", nargs="+", type=int, default=[3, 5])
    p.add_argument("--method", nargs="+", default=["paired"], choices=["paired", "bootstrap"])
    p.add_argument("--noise", nargs="+", default=["normal"], choices=NOISES,
                   help="seed noise: normal, and/or t3 (Student-t, 3 df, the same sd)")
    p.add_argument("--truth", nargs="+", default=["power-law"], choices=TRUTHS,
                   help="the true curve: the fitted power law, and/or misspecified (curved in log compute)")
    p.add_argument("--g", type=float, default=1.25, help="the true CEG (default 1.25)")
    a = p.parse_args(argv)
    if a.sims < 1 or min(a.seeds) < 2:
        p.error("--sims at least 1 and --seeds at least 2 each (a t interval needs 2 seeds)")
    print("| law | truth | noise | method | seeds | regime | coverage of 95% (binomial sd) | median interval "
          "(hi/lo ratio) | studies |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in a.laws:
        for kind in a.truth:
            for noise in a.noise:
                for method in a.method:
                    for n in a.seeds:
                        for regime in ("independent", "shared"):
                            r = coverage(truth(LAWS[name], kind), n, regime, a.sims, g=a.g, method=method,
                                         noise=noise)
                            w = "-" if r["median_width_ratio"] is None else f"{r['median_width_ratio']:.3f}"
                            print(f"| {name} | {kind} | {noise} | {method} | {n} | {regime} | {r['coverage']:.3f} "
                                  f"({r['sd']:.3f}) | {w} | {r['sims']} |", flush=True)


if __name__ == "__main__":
    main()
