"""fits.allocation: the compute-optimal allocation at each size's own FLOPs per token."""

import math

import numpy as np
import pytest

from analysis.scaling.fits.allocation import (
    CheapestShape,
    FlopsPerToken,
    allocation,
    flops_per_token,
    measured_multiplier,
    measured_optimum,
)
from analysis.scaling.fits.common import OK
from analysis.scaling.fits.loss_nd import NDFit, compute_multiplier, compute_optimal

LAW = dict(E=2.357, A=26.42, alpha=0.346, B=6860.0, beta=0.634)  # the CPU study's law


def _fit(**kw) -> NDFit:
    law = {**LAW, **kw}
    return NDFit(n_points=0, status=OK, a_opt=law["beta"] / (law["alpha"] + law["beta"]), **law)


@pytest.mark.parametrize("C", [1e10, 1e12, 1e14])
def test_proportional_flops_give_chinchillas_closed_form(C):
    closed = compute_optimal(_fit(), C, 6.0)
    num = measured_optimum(_fit(), C, FlopsPerToken.proportional(6.0))
    for key in ("N_opt", "D_opt", "L_opt", "a", "b"):
        assert getattr(num, key) == pytest.approx(getattr(closed, key), rel=1e-4), key
    assert num.k == pytest.approx(6.0)
    other = _fit(A=LAW["A"] * 0.7)
    assert measured_multiplier(_fit(), other, C, FlopsPerToken.proportional(6.0), FlopsPerToken.proportional(6.0)) \
        == pytest.approx(compute_multiplier(_fit(), other, C, 6.0, 6.0), rel=1e-3)


def test_the_optimum_minimises_the_loss_on_the_iso_flop_line():
    """With F(N) = c N^1.2 (FLOPs per parameter rising with N) the optimum is the minimum of L(N, C / F(N))
    found by brute force, and a = d ln N_opt / d ln C = beta / (alpha + 1.2 beta) (the closed form for
    F ∝ N^(1+e))."""
    N = np.geomspace(1e3, 1e7, 5)
    fpt = FlopsPerToken.measured(N, 3.0 * N ** 1.2)
    assert fpt(np.array([5e2, 3e4, 2e7])) == pytest.approx(3.0 * np.array([5e2, 3e4, 2e7]) ** 1.2, rel=1e-9)
    C = 1e13
    grid = np.geomspace(1e2, 1e9, 200001)
    L = _fit().predict(grid, C / fpt(grid))
    opt = measured_optimum(_fit(), C, fpt)
    assert opt.N_opt == pytest.approx(grid[np.argmin(L)], rel=1e-3)
    assert opt.L_opt == pytest.approx(L.min(), rel=1e-9, abs=1e-9)
    assert opt.a == pytest.approx(LAW["beta"] / (LAW["alpha"] + 1.2 * LAW["beta"]), rel=1e-3)
    assert opt.b == pytest.approx(1 - 1.2 * opt.a, rel=1e-3)


def test_bootstrap_draws_give_intervals_around_the_estimate():
    fit = _fit()
    rng = np.random.default_rng(0)
    fit.samples = np.array([[LAW["E"], LAW["A"] * math.exp(rng.normal(0, 0.05)), LAW["alpha"], LAW["B"],
                             LAW["beta"] + rng.normal(0, 0.01)] for _ in range(100)])
    opt = measured_optimum(fit, 1e12, FlopsPerToken.measured([1e3, 1e6], [8e3, 5e6]))
    lo, hi = opt.ci["a"]
    assert lo < opt.a < hi and lo < hi
    assert set(opt.ci) >= {"N_opt", "D_opt", "L_opt", "a", "b", "k"}
    direct = allocation(*fit.samples.T, 1e12, FlopsPerToken.measured([1e3, 1e6], [8e3, 5e6]))["N_opt"]
    assert np.min(direct) <= opt.ci["N_opt"][0] <= np.percentile(direct, 5) < opt.N_opt


def test_refusals_name_the_problem():
    with pytest.raises(ValueError, match="no size with a positive N"):
        FlopsPerToken.measured([0, -1], [1, 2])
    bad = _fit(alpha=0.0)
    assert measured_optimum(bad, 1e12, FlopsPerToken.proportional(6.0)).status == "degenerate-exponents"
    assert math.isnan(measured_multiplier(bad, _fit(), 1e12, FlopsPerToken.proportional(6.0),
                                          FlopsPerToken.proportional(6.0)))


def test_the_exponent_over_a_compute_range_is_the_chord_of_ln_n_opt():
    """With C_range the exponent is the slope of ln N_opt between its ends: for F = k N the closed form's a."""
    fpt = FlopsPerToken.measured([1e3, 1e5, 1e7], [4e3, 8e5, 5e7])
    r = allocation(*[np.array([v]) for v in LAW.values()], 1e12, fpt, (1e11, 1e13))
    ends = [allocation(*[np.array([v]) for v in LAW.values()], c, fpt)["N_opt"][0] for c in (1e11, 1e13)]
    assert r["a"][0] == pytest.approx(math.log(ends[1] / ends[0]) / math.log(100.0), rel=1e-6)
    closed = allocation(*[np.array([v]) for v in LAW.values()], 1e12, FlopsPerToken.proportional(6.0), (1e10, 1e14))
    assert closed["a"][0] == pytest.approx(LAW["beta"] / (LAW["alpha"] + LAW["beta"]), rel=1e-3)


def test_several_shapes_read_the_cheapest_shapes_flops_per_token():
    """Sizes of two depths interleave in N, a deeper one spending 20% more per token at equal N: one log-log curve
    through all of them would zigzag (false kinks in N_opt); per shape, the cheaper depth's curve is F(N), so the
    optimum is the one the cheap shape alone gives."""
    N2 = np.geomspace(3e4, 9e5, 9)
    N4 = N2 * 1.1
    F2, F4 = 4.0 * N2 ** 1.02, 1.2 * 4.0 * N4 ** 1.02
    f = flops_per_token([*N2, *N4], [*F2, *F4], ["2 layers"] * 9 + ["4 layers"] * 9)
    assert isinstance(f, CheapestShape) and [label for label, _ in f.shapes] == ["2 layers", "4 layers"]
    x = np.geomspace(2e4, 3e6, 50)
    cheap = FlopsPerToken.measured(N2, F2)
    np.testing.assert_allclose(f(x), cheap(x), rtol=1e-12)
    one = measured_optimum(_fit(), 1e12, cheap, C_range=(1e11, 1e13))
    two = measured_optimum(_fit(), 1e12, f, C_range=(1e11, 1e13))
    assert (two.N_opt, two.a) == (one.N_opt, one.a)
    zigzag = FlopsPerToken.measured([*N2, *N4], [*F2, *F4])
    slopes = np.diff(zigzag.log_F) / np.diff(zigzag.log_N)
    assert slopes.max() > 2.0 and slopes.min() < 0.5  # what one curve through both depths would be
    assert set(f.to_json()["shapes"]) == {"2 layers", "4 layers"}


def test_one_shape_is_one_curve_and_labels_must_match_the_sizes():
    assert isinstance(flops_per_token([1e3, 1e4], [6e3, 6e4], ["2 layers", "2 layers"]), FlopsPerToken)
    assert isinstance(flops_per_token([1e3, 1e4], [6e3, 6e4]), FlopsPerToken)
    with pytest.raises(ValueError, match="3 shape labels for 2 sizes"):
        flops_per_token([1e3, 1e4], [6e3, 6e4], ["a", "b", "c"])
