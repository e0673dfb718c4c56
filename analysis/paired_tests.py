"""The pieces the verdicts' paired tests share (``analysis.verdicts``: one t and TOST inference per comparison on
per-seed paired values): a ratio that reads se = 0 as certainty, Holm's correction over a family, and the seeds
TOST needs.

:func:`holm`: over a family of k p-values, Holm's step-down: sorted p_(1) <= ... <= p_(k), reject p_(i)
while p_(i) <= alpha / (k - i + 1), stop at the first that is not; adjusted p_adj_(i) =
max_{j <= i} min(1, (k - j + 1) p_(j)), so p_adj <= alpha exactly for the rejected ones. It controls the
family-wise error at alpha with no assumption on dependence.

:func:`seeds_needed`: the smallest n for which TOST concludes equivalence with the given power when the
true difference is ``mean``, with d taken as normal with the known sd / sqrt(n) and the critical value
t_{1-alpha, n-1} (the randomness of s is ignored, so it errs slightly low for n < 5):

    power(n) = Phi((m_hi - c se - mean) / se) - Phi((m_lo + c se - mean) / se),   c = t_{1-alpha, n-1}.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

from scipy import stats

ALPHA = 0.05


def ratio(num: float, se: float) -> float:
    """num / se with se = 0 read as a certainty: +-inf, or 0 when num is 0 too."""
    if se > 0:
        return num / se
    return 0.0 if num == 0 else math.copysign(math.inf, num)


def holm(pvalues: Sequence[Optional[float]], alpha: float = ALPHA) -> list[dict]:
    """Holm-Bonferroni step-down over the family, in the input order: [{p, p_adj, reject, rank, threshold}].
    None entries are not counted in k, are never rejected and get p_adj, rank and threshold None."""
    idx = sorted((i for i, p in enumerate(pvalues) if p is not None), key=lambda i: pvalues[i])
    k = len(idx)
    out = [{"p": p, "p_adj": None, "reject": False, "rank": None, "threshold": None} for p in pvalues]
    running, rejecting = 0.0, True
    for r, i in enumerate(idx, start=1):
        p = float(pvalues[i])
        threshold = alpha / (k - r + 1)
        rejecting = rejecting and p <= threshold
        running = max(running, min(1.0, (k - r + 1) * p))
        out[i].update(p_adj=running, reject=rejecting, rank=r, threshold=threshold)
    return out


def tost_power(n: int, sd: float, margin: tuple[float, float], mean: float = 0.0, alpha: float = ALPHA) -> float:
    """Approximate power of TOST with n seeds (module docstring: normal mean, t critical value)."""
    if n < 2:
        return 0.0
    m_lo, m_hi = margin
    se = sd / math.sqrt(n)
    c = float(stats.t.ppf(1 - alpha, n - 1))
    lo, hi = m_lo + c * se, m_hi - c * se
    if hi <= lo:
        return 0.0
    if se == 0:
        return 1.0 if lo < mean < hi else 0.0
    return max(0.0, float(stats.norm.cdf((hi - mean) / se) - stats.norm.cdf((lo - mean) / se)))


def seeds_needed(sd: float, margin: tuple[float, float], mean: float = 0.0, alpha: float = ALPHA,
                 power: float = 0.8, n_max: int = 10**7) -> Optional[int]:
    """Smallest number of seeds n >= 2 for which TOST concludes equivalence within ``margin`` with the given
    power when the true mean difference is ``mean`` and the per-seed sd is ``sd``; None when ``mean`` is
    not strictly inside the margin (never concluded) or n would exceed ``n_max``."""
    m_lo, m_hi = margin
    if not (m_lo < mean < m_hi) or not (sd >= 0 and math.isfinite(sd)):
        return None
    if tost_power(2, sd, margin, mean, alpha) >= power:
        return 2
    lo, hi = 2, 4
    while tost_power(hi, sd, margin, mean, alpha) < power:
        lo, hi = hi, hi * 2
        if hi > n_max:
            return None
    while hi - lo > 1:  # power(lo) < target <= power(hi)
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if tost_power(mid, sd, margin, mean, alpha) >= power else (mid, hi)
    return hi
