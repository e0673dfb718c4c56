"""analysis.scaling.design.check on synthetic grids: each problem named with a change that would fix it."""

from __future__ import annotations

import re

import numpy as np
import pytest

from analysis.scaling.design.check import MARGIN, check_grid
from analysis.scaling.design.spec import Law
from analysis.scaling.fits.allocation import FlopsPerToken

UNIGRAM = 6.3
# the CPU study's law in non-embedding N (C = 6 N D), the count these grids are written in
CPU_LAW = Law(E=2.357, A=26.42, alpha=0.346, B=6860.0, beta=0.634)


def test_the_advised_token_count_brings_a_point_just_below_the_margin():
    c = check_grid("x", ["small", "big"], [6224.0, 9.2e4], [2.0e5, 2.0e5], [None, None], unigram=UNIGRAM, law=CPU_LAW)
    near = next(p for p in c.problems if p.kind == "near unigram")
    assert "1 of 2 points" in near.message and "small (" in near.message and "big (" not in near.message
    advised = float(re.search(r"N = 6.22e\+03: D >= ([0-9.e+]+) tokens", near.message).group(1))
    assert CPU_LAW.loss(6224.0, advised) == pytest.approx(UNIGRAM - MARGIN, abs=0.01)
    assert CPU_LAW.loss(6224.0, 2.0e5) > UNIGRAM - MARGIN > CPU_LAW.loss(9.2e4, 2.0e5)
    # E + A / N^alpha alone is too high
    tiny = check_grid("x", ["t"], [10.0], [1e9], [None], unigram=UNIGRAM, law=CPU_LAW)
    assert "no D is enough, grow the model" in tiny.problems[0].message


def test_budget_and_token_group_problems():
    N = [6224.0, 12792.0, 23200.0, 36680.0, 50928.0]
    tags = [1e11, 1e11, 3e11, 3e11, 3e11]  # 2 sizes at 1e11; 3e11's optimum 1.55e4 lies below its sizes
    D = [t / (6 * n) for n, t in zip(N, tags)]
    kinds = [p.kind for p in check_grid("x", [str(n) for n in N], N, D, tags, unigram=UNIGRAM, law=CPU_LAW).problems]
    assert kinds[:2] == ["too few sizes", "not bracketed"] and "too few points" in kinds
    # token budgets: sizes x tokens give each point its own compute, no group of 3 within 10%
    NN, DD = np.meshgrid([6224.0, 23200.0, 92480.0], [1e6, 4e6])
    c = check_grid("x", [str(i) for i in range(6)], NN.ravel(), DD.ravel(), [None] * 6, unigram=UNIGRAM, sims=4,
                   law=CPU_LAW)
    assert "no IsoFLOP group" in [p.kind for p in c.problems]


def test_a_good_grid_passes_and_states_the_expected_width():
    sizes = {3e10: [1576, 6224, 12792], 1e11: [1576, 6224, 12792, 23200], 3e11: [6224, 12792, 23200, 36680]}
    N = [float(n) for b in sizes for n in sizes[b]]
    tags = [b for b in sizes for _ in sizes[b]]
    D = [t / (6 * n) for n, t in zip(N, tags)]
    c = check_grid("x", [str(i) for i in range(len(N))], N, D, tags, decay_fraction=0.2, unigram=UNIGRAM, sims=12,
                   law=CPU_LAW)
    assert c.problems == [] and c.design is not None
    width, ok, n = c.widths["approach 3 a"]
    assert ok == n == 12 and 0 < width < 0.5
    assert "expected 95% interval width of a: approach 3 a" in "\n".join(c.lines())


def test_budgets_in_measured_flops_use_each_sizes_flops_per_token():
    """With each size's training FLOPs per token, a FLOPs budget's predicted optimum is the law's at C = F(N) D:
    a budget bracketed under C = 6 N D is reported one-sided when F is 5x larger (the optimum moves down)."""
    N = [6224.0, 12792.0, 23200.0, 36680.0, 50928.0]
    tag = 3e11
    D6 = [tag / (6 * n) for n in N]
    assert not [p for p in check_grid("x", [str(n) for n in N], N, D6, [tag] * 5, unigram=UNIGRAM, law=CPU_LAW,
                                      sims=4).problems if p.kind == "not bracketed"]
    fpt = FlopsPerToken.proportional(30.0)
    D30 = [tag / (30 * n) for n in N]
    assert CPU_LAW.n_opt(tag, fpt)[0] < N[0] < CPU_LAW.n_opt(tag)[0]
    kinds = [p.kind for p in check_grid("x", [str(n) for n in N], N, D30, [tag] * 5, unigram=UNIGRAM, law=CPU_LAW,
                                        sims=4, fpt=fpt).problems]
    assert "not bracketed" in kinds
