"""analysis.compute_curve against known answers: the power law recovered from noiseless points, the inverse that
does not extrapolate, the local fit and the fallbacks to it."""

from __future__ import annotations

import math

import pytest

from analysis import compute_curve

E, A_C0, ALPHA, C0 = 3.0, 1.0, 0.3, 1e12  # L(C) = 3 + (C / 1e12)^-0.3: 4.52 at 0.25e12, 3.66 at 4e12
COMPUTES = [0.25e12, 0.5e12, 1e12, 2e12, 4e12]


def loss(c: float) -> float:
    return E + A_C0 * (c / C0) ** -ALPHA


def test_power_law_fit_recovers_parameters_without_noise():
    fit = compute_curve.fit_compute_curve([(c, loss(c)) for _ in range(3) for c in COMPUTES])
    assert fit["kind"] == "power_law" and fit["reason"] == ""
    assert fit["E"] == pytest.approx(E, rel=1e-6) and fit["alpha"] == pytest.approx(ALPHA, rel=1e-6)
    assert fit["A_c0"] == pytest.approx(A_C0, rel=1e-6)
    assert fit["c0"] == pytest.approx(1e12, rel=1e-12)  # geometric mean of 0.25 .. 4 (x 1e12)
    assert fit["A"] == pytest.approx(A_C0 * 1e12 ** ALPHA, rel=1e-5)  # L = E + A C^-alpha
    assert (fit["c_min"], fit["c_max"]) == (0.25e12, 4e12)
    assert fit["l_min"] == pytest.approx(loss(4e12), abs=1e-9)
    assert fit["l_max"] == pytest.approx(loss(0.25e12), abs=1e-9)
    assert fit["rms"] < 1e-9
    assert compute_curve.compute_for_loss(fit, loss(1.7e12)) == pytest.approx(1.7e12, rel=1e-7)


def test_compute_for_loss_does_not_extrapolate():
    fit = compute_curve.fit_compute_curve([(c, loss(c)) for c in COMPUTES])
    assert compute_curve.compute_for_loss(fit, loss(4e12)) == pytest.approx(4e12, rel=1e-7)
    assert compute_curve.compute_for_loss(fit, loss(0.25e12)) == pytest.approx(0.25e12, rel=1e-7)
    assert compute_curve.compute_for_loss(fit, loss(4.4e12)) is None
    assert compute_curve.compute_for_loss(fit, loss(0.2e12)) is None
    assert compute_curve.compute_for_loss(fit, 2.9) is None  # below E


@pytest.mark.parametrize("computes", [[1e12, 4e12], [0.5e12, 1e12, 4e12]])
def test_local_fit_with_two_or_three_points_inverts_a_log_log_line(computes):
    line = [(c, 5.0 * (c / 1e12) ** -0.1) for c in computes]  # ln L linear in ln C
    fit = compute_curve.fit_compute_curve(line)
    assert fit["kind"] == "local" and "distinct computes" in fit["reason"]
    assert fit["E"] is None and fit["rms"] < 1e-12
    for c in (1e12, 1.7e12, 2.9e12, 4e12):
        assert compute_curve.compute_for_loss(fit, 5.0 * (c / 1e12) ** -0.1) == pytest.approx(c, rel=1e-9)
        assert compute_curve.loss_at(fit, c) == pytest.approx(5.0 * (c / 1e12) ** -0.1, rel=1e-12)
    assert compute_curve.compute_for_loss(fit, 5.0 * 5.0 ** -0.1) is None  # beyond c_max


def test_local_fit_averages_seeds_and_pools_violators():
    # 3 distinct computes (local); seed means 5.0, 4.0 and 4.2: the violators 4.0 < 4.2 pool to 4.1
    pts = [(1e12, 4.9), (1e12, 5.1), (2e12, 4.0), (4e12, 4.2)]
    fit = compute_curve.fit_compute_curve(pts)
    assert fit["kind"] == "local"
    assert fit["knots"]["loss"] == pytest.approx([5.0, 4.1, 4.1])
    assert (fit["l_max"], fit["l_min"]) == pytest.approx((5.0, 4.1))
    assert compute_curve.compute_for_loss(fit, 4.1) == pytest.approx(math.sqrt(2e12 * 4e12))  # flat: its middle
    assert fit["rms"] == pytest.approx(math.sqrt((0.1**2 * 4) / 4))  # 0.1 off each point


def test_ill_conditioned_power_law_falls_back_to_local():
    flat = compute_curve.fit_compute_curve([(c, 4.0) for c in COMPUTES])
    assert flat["kind"] == "local" and "ill-conditioned" in flat["reason"]
    kinked = compute_curve.fit_compute_curve(list(zip(COMPUTES, [5.0, 4.5, 4.4, 4.0, 3.0])))
    assert kinked["kind"] == "local" and "misses the points" in kinked["reason"]
    with pytest.raises(ValueError, match="distinct"):
        compute_curve.fit_compute_curve([(1e12, 4.0), (1e12, 4.1)])
