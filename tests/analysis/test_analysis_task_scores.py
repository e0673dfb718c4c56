"""Intervals of the understanding tasks' scores that count the seeds' error and the test items' sampling error,
and the decision rule read off them (Holm, margin, seeds needed)."""

import numpy as np
import pytest

from analysis.task_scores import combined_interval, decide


def _run(rng, p_D, n_D, shift=0.0):
    """One seed's per-document sums: each item correct with its document's rate (+ the seed's shift)."""
    c = rng.binomial(n_D, np.clip(p_D + shift, 0, 1))
    return {"docs": list(range(len(n_D))), "correct_D": c.tolist(), "counted_D": n_D.tolist()}


def _study(rng, seeds=5, docs=40, seed_sd=0.02):
    """A fresh test set (documents drawn from the population, mean rate 0.6) and ``seeds`` fine-tuning seeds."""
    p_D = rng.beta(6, 4, size=docs)  # documents differ: the items of one document share its rate
    n_D = rng.integers(20, 80, size=docs)
    return {s: _run(rng, p_D, n_D, rng.normal(0, seed_sd)) for s in range(seeds)}


def test_identical_seeds_leave_only_the_item_sampling_error():
    rng = np.random.default_rng(0)
    p_D, n_D = rng.beta(6, 4, size=30), rng.integers(20, 80, size=30)
    one = _run(rng, p_D, n_D)
    iv = combined_interval({s: one for s in range(4)})
    assert iv["seed_var"] == 0.0 and iv["item_var"] > 0
    assert iv["low"] < iv["mean"] < iv["high"]


def test_the_interval_covers_the_population_mean_and_seed_error_alone_does_not():
    """Over 150 simulated studies the combined interval holds the population's mean rate (0.6) in 90-99% of them;
    the seed-only t interval (what a table of seeds alone reports) far less often."""
    rng = np.random.default_rng(1)
    hit = seed_only = 0
    for _ in range(150):
        iv = combined_interval(_study(rng), seed=int(rng.integers(1 << 30)))
        hit += iv["low"] <= 0.6 <= iv["high"]
        half = 2.776 * np.sqrt(iv["seed_var"] / iv["n"])  # t(0.975, 4)
        seed_only += iv["mean"] - half <= 0.6 <= iv["mean"] + half
    assert 0.90 <= hit / 150 <= 0.995
    assert seed_only / 150 < 0.8


@pytest.mark.parametrize("shift, expected", [(0.15, "better"), (-0.15, "worse"), (0.0, "equivalent")])
def test_decision_rule(shift, expected):
    rng = np.random.default_rng(2)
    p_D, n_D = rng.beta(6, 4, size=200), rng.integers(200, 400, size=200)
    a = {s: _run(rng, p_D, n_D, shift + rng.normal(0, 0.002)) for s in range(5)}
    b = {s: _run(rng, p_D, n_D, rng.normal(0, 0.002)) for s in range(5)}
    (out,) = decide([{"arm": "a", "against": "b", "arm_runs": a, "other_runs": b}], margin=0.02)
    assert out["class"] == expected and out["seeds_needed"] is None


def test_unresolved_says_how_many_seeds_it_would_need():
    rng = np.random.default_rng(3)
    p_D, n_D = rng.beta(6, 4, size=300), rng.integers(200, 400, size=300)
    a = {s: _run(rng, p_D, n_D, 0.03 + rng.normal(0, 0.03)) for s in range(3)}
    b = {s: _run(rng, p_D, n_D, rng.normal(0, 0.03)) for s in range(3)}
    (out,) = decide([{"arm": "a", "against": "b", "arm_runs": a, "other_runs": b}], margin=0.01)
    assert out["class"] == "unresolved"
    assert out["seeds_needed"] is None or out["seeds_needed"] > 3
