"""The designer's answer for one spec (:class:`Design`: the grid's facts and the spread of each estimate
per family) and its markdown report."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Optional

from analysis.scaling.design.spec import DesignSpec
from analysis.scaling.fits.common import OK, json_safe


@dataclass
class Spread:
    """The spread of one estimate over the simulated studies whose fit succeeded."""

    quantity: str
    true: float
    n_ok: int
    n_sims: int
    median: Optional[float] = None
    bias: Optional[float] = None  # median - true
    interval: Optional[list] = None  # 2.5 and 97.5 percentiles of the estimates
    width: Optional[float] = None
    width_ci: Optional[list] = None  # bootstrap (over simulations) 95% interval of the width
    coverage: Optional[float] = None  # share of the fits' own bootstrap intervals holding the truth
    own_width: Optional[float] = None  # median width of the fits' own bootstrap intervals (what one study reports)
    own_width_range: Optional[list] = None  # their 2.5 and 97.5 percentiles
    estimates: list = field(default_factory=list)

    def to_json(self) -> dict:
        return json_safe(asdict(self))


@dataclass
class Design:
    """The designer's answer for one spec: the grid's facts and, per family, the spread of each estimate."""

    spec: DesignSpec
    grid: dict
    spreads: dict  # family -> quantity -> Spread
    statuses: dict  # family -> approach -> {status: count}
    multipliers: dict  # family (not the reference) -> Spread of the compute multiplier at ref_flops
    ref_flops: float
    seconds: float
    family_grids: dict = field(default_factory=dict)  # family with its own grid or seeds -> its grid facts

    def to_json(self) -> dict:
        s = self.spec
        return json_safe({
            "description": s.description, "grid": self.grid, "seconds": self.seconds, "sims": s.sims, "seed": s.seed,
            "noise": asdict(s.noise), "fit": {"n_polish": s.n_polish, "huber_delta": s.huber_delta,
                                              "budget_tolerance": s.budget_tolerance, "bootstrap": s.bootstrap},
            "families": {name: {"law": asdict(law), "a": law.a,
                                "compute_multiplier": s.multipliers.get(name)} for name, law in s.families.items()},
            "spreads": {f: {q: v.to_json() for q, v in qs.items()} for f, qs in self.spreads.items()},
            "statuses": self.statuses, "ref_flops": self.ref_flops, "family_grids": self.family_grids,
            "multipliers": {f: v.to_json() for f, v in self.multipliers.items()}})

    def table(self) -> str:
        return design_table(self)


def _g(x, fmt: str = ".3g") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return format(x, fmt)


def _duration(seconds: float) -> str:
    for unit, s in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= s:
            return f"{seconds / s:.3g} {unit}"
    return f"{seconds:.3g} s"


def _grid_sentence(g: dict) -> str:
    budgets = g["flops_budgets"]
    bud = (f"{len(budgets)} FLOPs budgets {_g(g['C_range'][0])}-{_g(g['C_range'][1])}" if budgets else
           f"{len(g['token_budgets'])} token budgets {_g(g['D_range'][0])}-{_g(g['D_range'][1])}")
    runs = (f"WSD trunks with cooldown branches (decay fraction {g['cooldown']:g})" if g["cooldown"] is not None
            else "independent runs")
    cpu = f", {_duration(g['cpu_seconds'])} at {_g(g['flops_per_s'])} FLOP/s" if g["cpu_seconds"] else ""
    return (f"{g['n_points']} points, {g['n_sizes']} sizes N = {_g(g['N_range'][0])}-{_g(g['N_range'][1])} "
            f"({g['N_decades']:.2f} decades), {bud} "
            f"(C = {g.get('C_counts', '6ND')} over {g['C_decades']:.2f} decades), "
            f"{g['seeds']} seed(s), {runs}: {g['runs']} runs, {_g(g['train_flops'])} training FLOPs{cpu}.")


def design_table(d: Design) -> str:
    """Markdown: the grid, the assumptions, the spread of each estimate per family, the multipliers."""
    s, g = d.spec, d.grid
    lines = [f"## Scaling-study design{': ' + s.description if s.description else ''}", ""]
    budgets = g["flops_budgets"]
    shared = [f for f in s.families if f not in d.family_grids]
    if shared:
        whose = f" (families {', '.join(shared)})" if d.family_grids else ""
        lines.append(f"Grid{whose}: {_grid_sentence(g)}")
    for f, fg in d.family_grids.items():
        lines.append(f"Grid of {f}: {_grid_sentence(fg)}")
    if d.family_grids:
        runs = len(shared) * g["runs"] + sum(fg["runs"] for fg in d.family_grids.values())
        flops = len(shared) * g["train_flops"] + sum(fg["train_flops"] for fg in d.family_grids.values())
        cpu = f", {_duration(flops / s.flops_per_s)} at {_g(s.flops_per_s)} FLOP/s" if s.flops_per_s else ""
        lines.append(f"All {len(s.families)} families: {runs} runs, {_g(flops)} training FLOPs{cpu}.")
    lines += [f"Noise: sigma = {s.noise.sigma:.3g} of ln L per run"
              + (f", trunk share {s.noise.trunk_share:g}" if g["cooldown"] is not None else "")
              + f". {s.sims} simulated studies per family (seed {s.seed}), {d.seconds:.1f} s."]
    if g["data_tokens"]:
        past = g["points_past_max_epochs"]
        lines.append(f"Data: {_g(g['data_tokens'])} unique training tokens; the longest point reads them "
                     f"{g['epochs_max']:.2g} times; {past} point(s) past {g['max_epochs']:g} epochs"
                     + (" (the law assumes fresh data: shrink their D or grow the corpus)." if past else "."))
    lines.append("")
    for name, law in s.families.items():
        k = s.multipliers.get(name)
        lines.append(f"- law `{name}`: E = {law.E:.4g}, A = {law.A:.5g}, alpha = {law.alpha:.4g}, B = {law.B:.5g}, "
                     f"beta = {law.beta:.4g} (a = {law.a:.3f})" + (f", compute multiplier {k:g}" if k else ""))
    lines.append("")
    if budgets:
        lines += ["| budget C (FLOPs) | sizes | N range | law's N_opt | bracketed |", "|---|---|---|---|---|"]
        lines += [f"| {_g(b['flops'])} | {b['n_sizes']} | {_g(b['N_min'])}-{_g(b['N_max'])} | {_g(b['N_opt'])} | "
                  f"{'yes' if b['bracketed'] else 'NO'} |" for b in budgets]
        lines.append("")
    boot = s.bootstrap > 0
    lines += ["width: 97.5th - 2.5th percentile of the simulated point estimates, the 95% interval the study "
              "should expect; width 95%: its bootstrap interval over the simulations (more sims narrow it).", ""]
    head = "| family | estimate | true | median | bias | 95% of estimates | width | width 95% | fits ok |"
    lines += [head + (" own CI: median width | own CI covers |" if boot else ""), "|---" * (9 + 2 * boot) + "|"]
    for f, qs in d.spreads.items():
        for q, v in qs.items():
            iv = f"[{_g(v.interval[0])}, {_g(v.interval[1])}]" if v.interval else "-"
            wc = f"[{_g(v.width_ci[0], '.2g')}, {_g(v.width_ci[1], '.2g')}]" if v.width_ci else "-"
            row = (f"| {f} | {q} | {v.true:.3f} | {_g(v.median)} | {_g(v.bias, '+.3f')} | {iv} | "
                   f"**{_g(v.width)}** | {wc} | {v.n_ok}/{v.n_sims} |")
            lines.append(row + (f" {_g(v.own_width)} | {_g(v.coverage, '.0%')} |" if boot else ""))
    lines.append("")
    for f, st in d.statuses.items():
        for approach, counts in st.items():
            bad = {k: c for k, c in counts.items() if k != OK}
            if bad:
                lines.append(f"- {f}, {approach}: failed in " + ", ".join(f"{c} ({k})" for k, c in bad.items())
                             + " of the simulated studies; the spread is over the others")
    if d.multipliers:
        lines += [""] if lines[-1] else []
        lines += [f"Compute multiplier at C = {d.ref_flops:.3g} FLOPs (approach 3 fits of both families; "
                  "width = 97.5th / 2.5th percentile):", "",
                  "| family | true k | median | 95% of estimates | width (ratio) | fits ok |", "|---" * 6 + "|"]
        for f, v in d.multipliers.items():
            iv = f"[{_g(v.interval[0])}, {_g(v.interval[1])}]" if v.interval else "-"
            lines.append(f"| {f} | {v.true:.3g} | {_g(v.median)} | {iv} | **{_g(v.width)}x** | {v.n_ok}/{v.n_sims} |")
    return "\n".join(lines).rstrip() + "\n"
