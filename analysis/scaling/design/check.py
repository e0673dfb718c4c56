"""A planned scaling grid checked before it trains: the problems that would leave the study without fits
(points near the unigram entropy, budgets without three usable sizes or with their optimum outside them,
token budgets without an IsoFLOP group, an expected interval of a too wide), each named with what to change.

The planning law :data:`CPU_LAW` is what the LLaMA CPU study measured (docs/scaling/design/llama-found.yaml);
a study of another corpus, tokenizer or family states its own. The checks: docs/methods/scaling-design.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from analysis.runs import LEARN_MARGIN
from analysis.scaling.design.result import Design
from analysis.scaling.design.simulate import simulate
from analysis.scaling.design.spec import DesignSpec, Law, Noise, Plan
from analysis.scaling.fits.allocation import FlopsPerToken
from analysis.scaling.fits.common import OK
from analysis.scaling.fits.isoflop import group_budgets

# approach 3 fitted to the LLaMA CPU study's 53 points (both seeds) with N = total parameters, the study's
# convention (docs/scaling.md); in non-embedding N it read 2.357 + 26.42 / N^0.346 + 6860 / D^0.634
# (docs/scaling/design/llama-found.yaml)
CPU_LAW = Law(E=2.472, A=1780.0, alpha=0.656, B=6873.0, beta=0.636)
MARGIN = 2 * LEARN_MARGIN  # nats above which a point's predicted loss counts as near the unigram entropy
MAX_A_WIDTH = 0.5  # an interval of a wider than this says little more than "somewhere in 0.25-0.75"
MIN_SIZES = 3  # sizes an IsoFLOP parabola needs
BUDGET_TOLERANCE = 0.1  # analysis.scaling's --budget-tolerance: token-budget points within 10% of one C group


@dataclass
class Problem:
    """One thing that would cost the study a fit: ``kind`` (a short name) and what to change."""

    kind: str
    message: str


@dataclass
class GridCheck:
    """The check of one family's grid: its problems and the simulated design (None when not simulated)."""

    name: str
    n_points: int
    problems: list = field(default_factory=list)
    design: Optional[Design] = None
    widths: dict = field(default_factory=dict)  # "approach 3 a" / "approach 2 a" -> (width, fits ok, sims)
    notes: list = field(default_factory=list)

    def lines(self) -> list[str]:
        head = f"{self.name}: {self.n_points} scaling points"
        out = [head + (f", {len(self.problems)} problem(s):" if self.problems else ", no problem found")]
        out += [f"  - {p.kind}: {p.message}" for p in self.problems]
        out += [f"  {n}" for n in self.notes]
        return out


def _g(x: float) -> str:
    return f"{x:.3g}"


def _min_tokens(law: Law, N: float, target: float) -> Optional[float]:
    """The D at which the law's L(N, D) falls to ``target``; None when no D does (N too small)."""
    rest = target - law.E - law.A * N ** (-law.alpha)
    return (law.B / rest) ** (1.0 / law.beta) if rest > 0 else None


def _near_unigram(names, N, D, law: Law, unigram: float, margin: float) -> tuple[np.ndarray, Optional[Problem]]:
    L = law.loss(N, D)
    near = L > unigram - margin
    if not near.any():
        return near, None
    advice = []
    for n in sorted(set(N[near].tolist())):
        d = _min_tokens(law, n, unigram - margin)
        advice.append(f"N = {_g(n)}: D >= {_g(d)} tokens" if d else f"N = {_g(n)}: no D is enough, grow the model")
    shown = ", ".join(f"{names[i]} ({_g(L[i])})" for i in np.flatnonzero(near)[:6])
    more = f" and {int(near.sum()) - 6} more" if near.sum() > 6 else ""
    return near, Problem("near unigram", (
        f"{int(near.sum())} of {len(N)} points are predicted within {margin:g} nats of the unigram entropy "
        f"{unigram:.3f} (predicted loss in brackets): {shown}{more}; analysis.scaling leaves such runs out. "
        f"Give them more tokens ({'; '.join(advice)}) or drop them"))


def _budget_problems(N, tags, law: Law, fpt: Optional[FlopsPerToken] = None) -> list[Problem]:
    out = []
    for b in sorted({t for t in tags if t is not None}):
        sizes = sorted(set(N[[t == b for t in tags]].tolist()))
        n_opt = float(law.n_opt(b, fpt)[0])
        where = f"sizes around the predicted optimum N_opt = {_g(n_opt)}"
        if len(sizes) < MIN_SIZES:
            out.append(Problem("too few sizes", f"FLOPs budget {_g(b)} has {len(sizes)} usable size(s) "
                               f"({', '.join(_g(n) for n in sizes)}); an IsoFLOP parabola (approach 2) needs "
                               f">= {MIN_SIZES}: add {where} (from {_g(n_opt / 3)} to {_g(n_opt * 3)})"))
        elif not sizes[0] <= n_opt <= sizes[-1]:
            side = "below" if n_opt < sizes[0] else "above"
            out.append(Problem("not bracketed", f"FLOPs budget {_g(b)}: the predicted optimum N_opt = {_g(n_opt)} "
                               f"lies {side} its sizes ({_g(sizes[0])}-{_g(sizes[-1])}), so its IsoFLOP minimum is "
                               f"not bracketed: add sizes {side} ({_g(n_opt / 2)}-{_g(n_opt * 2)}) or move the "
                               "budget"))
    return out


def _token_groups_problem(N, D, tags, fpt: Optional[FlopsPerToken] = None) -> Optional[Problem]:
    free = np.array([t is None for t in tags])
    if not free.any() or any(t is not None for t in tags):
        return None  # FLOPs budgets exist: approach 2 reads them
    C = (6.0 * N[free] if fpt is None else fpt(N[free])) * D[free]
    groups = group_budgets(C, tolerance=BUDGET_TOLERANCE)
    best = max(len(set(N[free][g].tolist())) for g in groups)
    if best >= MIN_SIZES:
        return None
    return Problem("no IsoFLOP group", (
        f"token budgets ({', '.join(_g(d) for d in sorted(set(D[free].tolist())))}) give each size its own "
        f"compute: no {BUDGET_TOLERANCE:.0%}-wide compute budget holds {MIN_SIZES} sizes (at most {best}), so "
        "approach 2 (IsoFLOP) has nothing to fit: train at FLOPs budgets (flops: [C...], or cooldown: {flops: "
        "[...]} or cooldown.budgets with sizes around each budget's optimum; python -m analysis.scaling design "
        "--propose C_MIN C_MAX plans one)"))


def check_grid(name: str, names: Sequence[str], N: Sequence[float], D: Sequence[float],
               tags: Sequence[Optional[float]], *, seeds: int = 1, decay_fraction: Optional[float] = None,
               law: Law = CPU_LAW, noise: Noise = Noise(), unigram: Optional[float] = None, margin: float = MARGIN,
               max_a_width: float = MAX_A_WIDTH, sims: int = 40, seed: int = 0, n_polish: int = 10,
               fpt: Optional[FlopsPerToken] = None) -> GridCheck:
    """Check one family's planned points (``names[i]``: N[i] parameters, D[i] tokens, FLOPs budget ``tags[i]``
    or None; ``seeds`` runs per point; WSD branches of one trunk per size with ``decay_fraction``; ``fpt``: each
    size's training FLOPs per token, so that C = F(N) D; None: C = 6 N D)."""
    N, D = np.asarray(N, dtype=float), np.asarray(D, dtype=float)
    tags = list(tags)
    out = GridCheck(name=name, n_points=len(N))
    usable = np.ones(len(N), dtype=bool)
    if unigram is not None:
        near, problem = _near_unigram(list(names), N, D, law, unigram, margin)
        usable = ~near
        if problem:
            out.problems.append(problem)
    N_u, D_u, tags_u = N[usable], D[usable], [t for t, u in zip(tags, usable) if u]
    out.problems += _budget_problems(N_u, tags_u, law, fpt)
    token_problem = _token_groups_problem(N_u, D_u, tags_u, fpt)
    if token_problem:
        out.problems.append(token_problem)
    if len(np.unique(N_u)) < 2 or len(np.unique(D_u)) < 2 or len(N_u) < 6:
        out.problems.append(Problem("too few points", (
            f"{len(N_u)} usable points over {len(np.unique(N_u))} size(s) and {len(np.unique(D_u))} token count(s): "
            "approach 3 (L(N, D), 5 parameters) needs >= 6 points over >= 2 sizes and >= 2 token counts; "
            "add sizes and budgets")))
        return out
    plan = Plan(N=N_u, D=D_u, budget=tags_u, seeds=seeds, decay_fraction=decay_fraction, fpt=fpt)
    spec = DesignSpec(plan=plan, families={name: law}, noise=noise, sims=sims, seed=seed, n_polish=n_polish)
    out.design = simulate(spec)
    spreads = out.design.spreads[name]
    for q in ("approach 3 a", "approach 2 a"):
        v = spreads[q]
        out.widths[q] = (v.width, v.n_ok, v.n_sims)
        approach = q.rsplit(" ", 1)[0]
        if v.n_ok < v.n_sims / 2:
            counts = out.design.statuses[name][approach]
            why = ", ".join(f"{c} {k}" for k, c in counts.items() if k != OK)
            out.problems.append(Problem(f"{approach} fails", (
                f"the {approach} fit of a succeeded in {v.n_ok} of {v.n_sims} simulated studies ({why}): "
                "add sizes around each budget's optimum and budgets over a wider compute range")))
        elif v.width is not None and v.width > max_a_width and (approach == "approach 3" or not out.problems):
            out.problems.append(Problem("a too wide", (
                f"the expected 95% interval of a by {approach} is {v.width:.2f} wide (over {v.n_ok} simulated "
                f"studies; wider than {max_a_width:g}): add sizes (a wider N range) or budgets (a wider C range), "
                "or seeds; python -m analysis.scaling design --propose C_MIN C_MAX plans a grid that narrows it")))
    widths = ", ".join(f"{q} {w:.2f} ({ok}/{n} fits)" if w is not None else f"{q} - ({ok}/{n} fits)"
                       for q, (w, ok, n) in out.widths.items())
    out.notes.append(f"expected 95% interval width of a: {widths} (true a = {law.a:.2f} under the planning law, "
                     f"noise {noise.sigma:g} of ln L per run, {sims} simulated studies)")
    return out


def check_text(checks: Sequence[GridCheck], law: Law, unigram: Optional[float], source: str = "") -> str:
    """The checks as lines for the terminal: the assumptions, then each family's problems. ``source``: where
    the unigram entropy came from."""
    src = source if unigram is not None else "not known: near-unigram points not checked"
    lines = [f"design check (analysis.scaling.design.check): planning law L = {law.E:g} + {law.A:g} / N^{law.alpha:g} "
             f"+ {law.B:g} / D^{law.beta:g} (N total parameters, D tokens, C measured training FLOPs; set "
             f"check.law for another setting); unigram entropy {'-' if unigram is None else f'{unigram:.3f}'} ({src})"]
    for c in checks:
        lines += c.lines()
    return "\n".join(lines)
