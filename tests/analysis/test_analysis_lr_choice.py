"""analysis.lr_choice against known optima: a parabola in log lr recovered between grid points, its minimum
kept inside the bracket, the range within seed noise, the grid's best where no parabola applies, and noisy
grids on which the fitted choice lands nearer the true optimum than the argmin."""

from __future__ import annotations

import math

import numpy as np
import pytest

from analysis import lr_choice

GRID = [1e-3 * 2 ** k for k in range(6)]  # 1e-3 .. 3.2e-2, a factor 2 apart


def bowl(lr: float, opt: float, curvature: float = 0.5, floor: float = 3.0) -> float:
    return floor + curvature * math.log(lr / opt) ** 2


def test_a_known_parabola_is_recovered_between_grid_points():
    res = lr_choice.choose(GRID, [bowl(lr, 5.5e-3) for lr in GRID], noise_sd=0.01)
    assert res["kind"] == "parabola" and res["grid_lr"] == 4e-3 and res["points"] == 5
    assert res["lr"] == pytest.approx(5.5e-3, rel=1e-9) and res["curvature"] == pytest.approx(0.5)
    # within 0.01 nats of the minimum: |ln(lr / opt)| <= sqrt(0.01 / 0.5)
    r = math.sqrt(0.01 / 0.5)
    assert (res["flat_low"], res["flat_high"]) == pytest.approx((5.5e-3 * math.exp(-r), 5.5e-3 * math.exp(r)))
    assert "parabola through 5 points" in lr_choice.describe(res)
    assert lr_choice.regret(res, 4e-3) == pytest.approx(0.5 * math.log(4e-3 / 5.5e-3) ** 2)


def test_the_minimum_stays_inside_the_bracket():
    """Losses that curve upwards but whose parabola's vertex lies beyond the best's neighbour (a skewed
    valley): the choice is clamped to the neighbour, never extrapolated."""
    losses = [5.0, 4.0, 3.2, 3.0, 2.99, 3.5]  # the vertex of the 5-point fit lies right of 1.6e-2
    res = lr_choice.choose(GRID, losses)
    assert res["grid_lr"] == 1.6e-2 and GRID[3] <= res["lr"] <= GRID[5]


def test_the_grid_best_where_no_parabola_applies():
    at_end = lr_choice.choose(GRID, [bowl(lr, 1e-1) for lr in GRID])
    assert at_end["kind"] == "grid" and at_end["lr"] == GRID[-1] and "not bracketed" in at_end["reason"]
    diverged = [math.inf, None, 3.0, math.inf, None, 4.0]
    holes = lr_choice.choose(GRID, diverged)
    assert holes["kind"] == "grid" and holes["lr"] == GRID[2] and "a parabola needs 3" in holes["reason"]
    assert lr_choice.choose(GRID, [None] * 6)["reason"] == "no lr learned"
    zigzag = lr_choice.choose(GRID[:5], [2.0, 2.9, 1.9, 2.9, 2.0])  # the best fit curves downwards: no minimum
    assert zigzag["kind"] == "grid" and zigzag["lr"] == GRID[2] and "do not curve upwards" in zigzag["reason"]


def test_on_noisy_grids_the_fit_is_nearer_the_optimum_than_the_argmin():
    """Seed noise of 0.01 nats on a bowl of curvature 0.05 per ln(lr)^2 (a nearly flat optimum, as in the
    committed tuning grids): over 400 noisy grids the fitted choice's mean |ln(lr / opt)| is smaller."""
    rng = np.random.default_rng(0)
    opt = 5.5e-3
    err_fit, err_grid = [], []
    for _ in range(400):
        losses = [bowl(lr, opt, curvature=0.05) + 0.01 * rng.standard_normal() for lr in GRID]
        res = lr_choice.choose(GRID, losses, noise_sd=0.01)
        err_fit.append(abs(math.log(res["lr"] / opt)))
        err_grid.append(abs(math.log(res["grid_lr"] / opt)))
    assert np.mean(err_fit) < 0.8 * np.mean(err_grid)
