"""analysis.paired_tests against known answers: Holm by hand, the seeds TOST needs by hand and in simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from analysis import paired_tests


def test_holm_by_hand():
    # sorted: 0.005 <= 0.05/4 = 0.0125 reject; 0.01 <= 0.05/3 = 0.0167 reject; 0.03 > 0.05/2 = 0.025 stop,
    # so 0.04 is not rejected although 0.04 <= 0.05/1. Adjusted: 4*0.005 = 0.02; max(0.02, 3*0.01) = 0.03;
    # max(0.03, 2*0.03) = 0.06; max(0.06, 1*0.04) = 0.06.
    res = paired_tests.holm([0.01, 0.04, 0.03, 0.005], alpha=0.05)
    assert [r["reject"] for r in res] == [True, False, False, True]
    assert [r["p_adj"] for r in res] == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert [r["rank"] for r in res] == [2, 4, 3, 1]
    assert [r["threshold"] for r in res] == pytest.approx([0.05 / 3, 0.05, 0.025, 0.0125])


def test_holm_skips_none():
    res = paired_tests.holm([0.01, None, 0.04, 0.03, 0.005], alpha=0.05)
    assert [r["reject"] for r in res] == [True, False, False, False, True]
    assert res[1] == {"p": None, "p_adj": None, "reject": False, "rank": None, "threshold": None}
    assert [r["p_adj"] for r in res if r["p"] is not None] == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert paired_tests.holm([None, None]) == [{"p": None, "p_adj": None, "reject": False, "rank": None,
                                        "threshold": None}] * 2
    assert paired_tests.holm([0.9, 0.8])[0]["p_adj"] == 1.0  # min(1, 2 * 0.8) then max with it


def test_seeds_needed_by_hand():
    sd, margin = 0.01, (-0.01, 0.01)
    n = paired_tests.seeds_needed(sd, margin)

    def power(n):  # mean 0: P(-0.01 + c se < mean_hat < 0.01 - c se) = 2 Phi(0.01 / se - c) - 1
        se, c = sd / math.sqrt(n), stats.t.ppf(0.95, n - 1)
        return 2 * stats.norm.cdf(0.01 / se - c) - 1
    assert power(n) >= 0.8 > power(n - 1)
    assert n == 10  # normal quantiles alone: (1.645 + 1.2816)^2 = 8.56 -> 9, t adds one
    assert paired_tests.tost_power(n, sd, margin) == pytest.approx(power(n))
    # large n: the normal formula n = ((z_0.95 + z_0.9) sd / delta)^2 = 856.4
    assert abs(paired_tests.seeds_needed(1.0, (-0.1, 0.1)) - 857) <= 2
    # off-centre: power(n) = Phi((0.1 - c se - 0.05) / se) - Phi((-0.1 + c se - 0.05) / se), the nearer end
    # dominating: with normal quantiles n ~ ((z_0.95 + z_0.8) sd / (delta - |mean|))^2 = 6.18 * 4 = 24.7
    def off_centre(n):
        se, c = 0.1 / math.sqrt(n), stats.t.ppf(0.95, n - 1)
        return stats.norm.cdf((0.05 - c * se) / se) - stats.norm.cdf((-0.15 + c * se) / se)
    n = paired_tests.seeds_needed(0.1, (-0.1, 0.1), mean=0.05)
    assert off_centre(n) >= 0.8 > off_centre(n - 1)
    assert abs(n - (1.6449 + 0.8416) ** 2 * 4) <= 3
    assert paired_tests.seeds_needed(0.01, margin, mean=0.01) is None  # on the margin: never equivalent
    assert paired_tests.seeds_needed(0.0, margin) == 2


def test_seeds_needed_gives_the_power_in_simulation():
    sd, margin = 1.0, (-1.0, 1.0)
    n = paired_tests.seeds_needed(sd, margin)
    x = np.random.default_rng(0).normal(0.0, sd, (20000, n))
    m, se = x.mean(axis=1), x.std(axis=1, ddof=1) / math.sqrt(n)
    c = stats.t.ppf(0.95, n - 1)
    rejected = (m - c * se > margin[0]) & (m + c * se < margin[1])
    assert rejected.mean() == pytest.approx(0.8, abs=0.06)


# --------------------------------------------------------------------------------------------
# validation sampling error
# --------------------------------------------------------------------------------------------
