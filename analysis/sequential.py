"""Seeds where a claim needs them: a group-sequential design over seeds, its stopping rule fixed before the runs.

A spec's ``seeds: {min: 3, max: 9, step: 2, spending: pocock}`` trains seeds 0..min-1, reads every verdict, and
gives the comparisons still unresolved ``step`` more seeds (both of their arms), until each is resolved or
``max`` is reached. Look k (n_k seeds, information fraction t_k = n_k / max) tests at the increment of a
Lan-DeMets alpha-spending function, alpha_k = f(t_k) - f(t_{k-1}):

    pocock:          f(t) = alpha ln(1 + (e - 1) t)
    obrien-fleming:  f(t) = 2 - 2 Phi(Phi^-1(1 - alpha / 2) / sqrt(t))

with Holm over the comparisons still open at that look (``analysis.verdicts.family`` at level alpha_k). A
verdict, once reached, is final. The sum of the per-look levels is alpha, so by the union bound over looks each
error rate (a difference claimed where there is none, equivalence claimed outside the margin) stays at most
alpha whatever the correlation between looks, and each look's t test is exact at its own df (the heavier tails
of 2-df looks are why the levels are not the normal-theory boundaries). ``python -m analysis.sequential``
checks the realised rates by simulation with known answers. Pocock is the default: with 2 df at the first
look, O'Brien-Fleming's first level (3e-4 at t = 1/3) can almost never be crossed, so it saves few runs.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import asdict, dataclass
from typing import Optional, Sequence

import numpy as np

from analysis import ceg_coverage, compute_curve, verdicts
from archlab.errors import RecipeError

KEYS = ("min", "max", "step", "spending")
SPENDING = ("pocock", "obrien-fleming")


def spent(t: float, alpha: float, kind: str) -> float:
    """Cumulative type-I error spent at information fraction ``t`` (module docstring)."""
    from scipy import stats

    if t <= 0:
        return 0.0
    t = min(1.0, t)
    if kind == "pocock":
        return alpha * math.log(1 + (math.e - 1) * t)
    if kind == "obrien-fleming":
        return float(2 - 2 * stats.norm.cdf(stats.norm.ppf(1 - alpha / 2) / math.sqrt(t)))
    raise ValueError(f"spending {kind!r}: one of {', '.join(SPENDING)}")


@dataclass(frozen=True)
class Design:
    """Seeds 0..min-1 first, then ``step`` more per look for what is unresolved, up to ``max``."""

    min: int
    max: int
    step: int
    spending: str = "pocock"
    alpha: float = verdicts.ALPHA

    @property
    def stages(self) -> list[int]:
        """Seeds after each look: min, min + step, ..., max."""
        out = list(range(self.min, self.max, self.step))
        return out + [self.max]

    def levels(self) -> list[float]:
        """The per-look levels alpha_k (they sum to alpha)."""
        f = [spent(n / self.max, self.alpha, self.spending) for n in self.stages]
        return [b - a for a, b in zip([0.0] + f[:-1], f)]

    def seeds(self, look: int) -> list[int]:
        """The seeds a comparison has at look ``look`` (0-based)."""
        return list(range(self.stages[look]))

    def describe(self) -> str:
        levels = ", ".join(f"{n} seeds at {a:.4f}" for n, a in zip(self.stages, self.levels()))
        return (f"group-sequential over seeds ({self.spending} alpha spending, total {self.alpha:g}): looks at "
                f"{levels}")


def check(value, where: str = "seeds") -> Optional[Design]:
    """A design from a spec's ``seeds:`` mapping (None for a list of seeds); errors name the key."""
    if not isinstance(value, dict):
        return None
    unknown = sorted(set(value) - set(KEYS))
    if unknown:
        raise RecipeError(f"{where}: unknown keys {unknown}; valid: {', '.join(KEYS)} "
                          "(e.g. seeds: {min: 3, max: 9, step: 2, spending: pocock})")
    lo, hi, step = value.get("min"), value.get("max"), value.get("step", 2)
    for key, v in (("min", lo), ("max", hi), ("step", step)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise RecipeError(f"{where}.{key}={v!r}: a positive integer")
    if lo < 2:
        raise RecipeError(f"{where}.min={lo}: at least 2 (a t interval needs 2 seeds); 3 is usual")
    if hi <= lo:
        raise RecipeError(f"{where}.max={hi}: must exceed min={lo} (for a fixed number of seeds write "
                          f"seeds: {list(range(lo))})")
    spending = value.get("spending", "pocock")
    if spending not in SPENDING:
        raise RecipeError(f"{where}.spending={spending!r}: one of {', '.join(SPENDING)}")
    return Design(lo, hi, step, spending)


def as_dict(design: Design) -> dict:
    return {**asdict(design), "stages": design.stages, "levels": design.levels()}


def _restricted(c: dict, seeds: Sequence[int]) -> dict:
    keep = set(seeds)
    return {**c, **{k: {s: v for s, v in c[k].items() if s in keep}
                    for k in ("arm_losses", "other_losses", "arm_compute", "other_compute")}}


def family(design: Design, fit: Optional[dict], ref_curves: dict, comparisons: list[dict], margin: dict) -> list[dict]:
    """The family read look by look (module docstring): each comparison's result from the look that resolved it,
    or from the last look it reached, with ``look`` (1-based), ``alpha_look``, ``stopped`` and ``design``.
    A comparison whose arms stopped at a look has no seeds beyond it, so this replays the run's own decisions."""
    levels = design.levels()
    final: dict[int, dict] = {}
    open_idx = list(range(len(comparisons)))
    for k, (n, a_k) in enumerate(zip(design.stages, levels)):
        seeds = design.seeds(k)
        new = range(design.stages[k - 1], n) if k else range(n)
        reached = [i for i in open_idx if _trained(comparisons[i], new)]
        if not reached:
            break
        res = verdicts.family(fit, ref_curves, [_restricted(comparisons[i], seeds) for i in reached], margin,
                              alpha=a_k)
        for i, r in zip(reached, res):
            r.update(look=k + 1, alpha_look=a_k, stage_seeds=n)
            final[i] = r
        last = k == len(levels) - 1
        for i, r in zip(reached, res):
            if r["class"] != "unresolved":
                r["stopped"] = f"resolved at look {k + 1} ({len(r['seeds'])} seeds)"
            elif last:
                r["stopped"] = f"cap: {design.max} seeds, unresolved"
        open_idx = [i for i, r in zip(reached, res) if r["class"] == "unresolved" and not last]
    for i, r in final.items():
        r.setdefault("stopped", f"not continued past look {r['look']} ({len(r['seeds'])} seeds; more are planned)")
    return [final[i] for i in range(len(comparisons)) if i in final]


def _trained(c: dict, seeds: Sequence[int]) -> bool:
    """Both arms have a finished run among the look's new seeds (a comparison not continued has none; a look
    whose runs diverged or failed is read on the seeds that finished)."""
    return any(s in c["arm_losses"] for s in seeds) and any(s in c["other_losses"] for s in seeds)


def next_seeds(design: Design, results: list[dict]) -> dict[str, list[int]]:
    """{arm: seeds to add} for the comparisons still open after their latest look (both arms of each)."""
    out: dict[str, set] = {}
    for r in results:
        if r["class"] != "unresolved" or r["look"] >= len(design.stages):
            continue
        have, want = design.stages[r["look"] - 1], design.stages[r["look"]]
        for arm in (r["arm"], r["against"]):
            out.setdefault(arm, set()).update(range(have, want))
    return {a: sorted(s) for a, s in out.items()}


# --------------------------------------------------------------------------------------------
# error rates by simulation
# --------------------------------------------------------------------------------------------

def simulate(design: Design, law, g: float, n_sims: int, regime: str = "independent", curve_seeds: int = 3,
             seed: int = 0, noise: str = "normal") -> dict:
    """Share of simulated studies (one comparison, true CEG ``g``) ending better / worse / equivalent /
    unresolved, with the mean seeds used; the curve from ``curve_seeds`` reference trunks as the ceg stage
    trains them (``analysis.ceg_coverage.simulate``: ``noise`` "normal" or "t3"; a misspecified curve is a
    ``law`` from ``ceg_coverage.truth``)."""
    rng = np.random.default_rng(seed)
    ln_margin = (math.log(0.9), math.log(1.1))
    counts = {"better": 0, "worse": 0, "equivalent": 0, "unresolved": 0}
    seeds_used = []
    for _ in range(n_sims):
        curves, ref, arm = ceg_coverage.simulate(rng, law, design.max, regime, g, noise=noise)
        curves = {s: curves[s] for s in range(curve_seeds)}
        fit = compute_curve.fit_compute_curve([p for pts in curves.values() for p in pts])
        comp = {s: ceg_coverage.BUDGET for s in range(design.max)}
        margin = {verdicts.LN_CEG: ln_margin, verdicts.NATS: (-0.02, 0.02), "from": "CEG in [0.9, 1.1]"}
        c = {"arm": "arm", "against": "ref", "arm_losses": arm, "other_losses": ref, "arm_compute": comp,
             "other_compute": comp}
        r = family(design, fit, curves, [c], margin)[0]
        word = r["class"].split(" ")[0]
        counts["equivalent" if word == "equivalent" else word] += 1
        seeds_used.append(len(r["seeds"]))
    return {"g": g, "regime": regime, "sims": n_sims, "noise": noise, **{k: v / n_sims for k, v in counts.items()},
            "mean_seeds": float(np.mean(seeds_used)), "design": as_dict(design)}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="Error rates and seeds used of the sequential design (module "
                                "docstring), by simulation with a known CEG: a markdown table.")
    p.add_argument("--sims", type=int, default=500, help="simulated studies per cell (default 500)")
    p.add_argument("--min", type=int, default=3)
    p.add_argument("--max", type=int, default=5, help="the seed cap (default 5, as the specs)")
    p.add_argument("--step", type=int, default=2)
    p.add_argument("--spending", nargs="+", default=["pocock"], choices=SPENDING)
    p.add_argument("--law", default="attention-kv", choices=list(ceg_coverage.LAWS))
    p.add_argument("--noise", default="normal", choices=ceg_coverage.NOISES,
                   help="seed noise: normal, or t3 (Student-t, 3 df, the same sd)")
    p.add_argument("--truth", default="power-law", choices=ceg_coverage.TRUTHS,
                   help="the true curve: the fitted power law, or misspecified (curved in log compute)")
    p.add_argument("--g", nargs="+", type=float, default=[1.0, 1.1, 1.25],
                   help="true CEGs: 1 (no difference: 'better'/'worse' are errors), 1.1 (the margin's edge: "
                   "'equivalent' is an error), 1.25 (a real gain)")
    a = p.parse_args(argv)
    if a.sims < 1:
        p.error(f"--sims {a.sims}: at least 1 (500 gives a binomial sd near 0.01 on a 5% rate)")
    law = ceg_coverage.truth(ceg_coverage.LAWS[a.law], a.truth)
    print(f"law: {law.name}, seed sd {law.sigma}; noise {a.noise}; margin CEG [0.9, 1.1]; seeds {a.min} to {a.max}")
    print("| spending | true CEG | regime | better | worse | equivalent | unresolved | mean seeds | studies |")
    print("|---|---|---|---|---|---|---|---|---|")
    for kind in a.spending:
        d = Design(a.min, a.max, a.step, kind)
        for g in a.g:
            for regime in ("independent", "shared"):
                r = simulate(d, law, g, a.sims, regime, noise=a.noise)
                print(f"| {kind} | {g:g} | {regime} | {r['better']:.3f} | {r['worse']:.3f} | {r['equivalent']:.3f} "
                      f"| {r['unresolved']:.3f} | {r['mean_seeds']:.2f} | {a.sims} |", flush=True)


if __name__ == "__main__":
    main()
