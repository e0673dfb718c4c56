"""analysis.curve_fit, the one L(C) fitter and the one Huber loss: the loss by hand, both residual scales
recover a known curve, and the kept start stands when nothing beats it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import least_squares

from analysis import curve_fit

E, A_C0, ALPHA = 3.0, 1.0, 0.3
U = np.array([0.25, 0.5, 1.0, 2.0, 4.0])  # C / c0
L = E + A_C0 * U ** -ALPHA


def test_huber_by_hand():
    r = np.array([0.0, 0.5e-3, -2e-3, 3.0])
    assert curve_fit.huber(r, 1e-3) == pytest.approx([0.0, 0.125e-6, 1e-3 * (2e-3 - 0.5e-3), 1e-3 * (3.0 - 0.5e-3)])
    assert curve_fit.robust_cost(r, 1e-3) == pytest.approx(float(curve_fit.huber(r, 1e-3).sum()))
    assert curve_fit.robust_cost(r, None) == pytest.approx(0.5 * float(r @ r))


def test_plain_cost_is_least_squares_own():
    res = least_squares(lambda t: t[0] * U - L, [1.0])
    assert curve_fit.robust_cost(res.fun, None) == res.cost


def test_loss_scale_recovers_the_curve():
    starts = curve_fit.line_starts(U, L, (0.0, 0.5, 0.9), 5.0)
    bounds = np.array([0.0, -np.inf, 0.0]), np.array([L.min() - 1e-9, np.inf, 5.0])
    theta = curve_fit.fit_lc(U, L, starts, on="loss", bounds=bounds, x_scale="jac", xtol=1e-14, ftol=1e-14,
                             gtol=1e-14, max_nfev=2000)
    assert theta == pytest.approx([E, math.log(A_C0), ALPHA], abs=1e-6)
    assert np.abs(curve_fit.residuals(theta, U, L, "loss")).max() < 1e-9


def test_log_scale_recovers_the_curve_with_a_huber_loss():
    start = curve_fit.profile_start(U, L, 1e-3)
    bounds = [math.log(1e-6), -30.0, 0.0], [math.log(L.max()), 30.0, 5.0]
    theta = curve_fit.fit_lc(U, L, [start], on="log", bounds=bounds, huber_delta=1e-3, keep=start, margin=1e-9,
                             max_nfev=500)
    assert np.exp(theta[:2]) == pytest.approx([E, A_C0], rel=1e-4) and theta[2] == pytest.approx(ALPHA, rel=1e-4)
    assert np.abs(curve_fit.residuals(theta, U, L, "log")).max() < 1e-6


def test_the_kept_start_stands_when_nothing_beats_it():
    keep = (math.log(E), math.log(A_C0), ALPHA)  # the exact answer: no polish improves on it
    bounds = [math.log(1e-6), -30.0, 0.0], [math.log(L.max()), 30.0, 5.0]
    assert curve_fit.fit_lc(U, L, [], on="log", bounds=bounds, huber_delta=1e-3, keep=keep) == pytest.approx(keep)
    assert curve_fit.fit_lc(U, L, [], on="log", bounds=bounds, huber_delta=1e-3) is None
