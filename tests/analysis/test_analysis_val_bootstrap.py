"""analysis.val_bootstrap: the bootstrap intervals of the validation sampling error against the normal
approximation and by construction."""

from __future__ import annotations

import math

import numpy as np
import pytest

from analysis import val_bootstrap


def test_bootstrap_of_a_constant_has_zero_width():
    res = val_bootstrap.bootstrap_mean_interval([3.2] * 50)
    assert res["mean"] == pytest.approx(3.2) and res["half_width"] == pytest.approx(0.0, abs=1e-12)
    assert res["low"] == pytest.approx(3.2) and res["high"] == pytest.approx(3.2) and res["n"] == 50
    assert val_bootstrap.bootstrap_mean_interval([])["mean"] is None


def test_bootstrap_matches_the_normal_approximation():
    x = np.random.default_rng(0).normal(4.0, 1.0, 400)
    res = val_bootstrap.bootstrap_mean_interval(x, n_boot=4000)
    expect = 1.96 * x.std(ddof=1) / math.sqrt(400)  # 0.098
    assert res["half_width"] == pytest.approx(expect, rel=0.1)
    assert res["se"] == pytest.approx(x.std(ddof=1) / 20, rel=0.1)
    assert res["low"] < x.mean() < res["high"]


def test_paired_bootstrap_removes_the_shared_variance():
    rng = np.random.default_rng(1)
    b = rng.normal(4.0, 1.0, 400)  # window-to-window spread both models share
    res = val_bootstrap.paired_bootstrap_difference(b + 0.05 + rng.normal(0, 0.1, 400), b, n_boot=4000)
    assert res["mean"] == pytest.approx(0.05, abs=0.02)
    assert res["half_width"] == pytest.approx(1.96 * 0.1 / 20, rel=0.15)  # 0.0098, not the unpaired ~0.14
    shifted = val_bootstrap.paired_bootstrap_difference(b + 0.05, b)
    assert shifted["mean"] == pytest.approx(0.05) and shifted["half_width"] == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="same windows"):
        val_bootstrap.paired_bootstrap_difference([1.0, 2.0], [1.0])
