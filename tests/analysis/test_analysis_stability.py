"""analysis.measurements.stability on a fake 2 x 2 grid of known per-seed losses (no training): each cell's 95%
t-interval, the paired differences against the reference with their Holm-adjusted verdicts and intervals, a cell
with fewer than 2 finished seeds, and a diverged seed, each checked against numbers computed here with scipy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from analysis.experiments import context_from_rows
from analysis.measurements.stability import Stability

GRID = {"train.lr": [0.001, 0.01], "train.warmup_steps": [0, 10]}
UNIGRAM = 6.30
# (arm, lr, warmup) -> per seed (loss, status); did-not-learn runs finish near the unigram entropy
LOSSES = {
    ("pre-ln", "0.001", "0"): [(5.10, "finished"), (5.20, "finished"), (5.16, "finished")],
    ("pre-ln", "0.001", "10"): [(5.00, "finished"), (5.30, "finished"), (5.12, "finished")],
    ("pre-ln", "0.01", "0"): [(4.80, "finished"), (4.90, "finished"), (4.86, "finished")],
    ("pre-ln", "0.01", "10"): [(4.70, "finished"), (4.75, "finished"), (4.74, "finished")],
    ("post-ln", "0.001", "0"): [(6.28, "finished"), (6.29, "finished"), (6.27, "finished")],  # did not learn
    ("post-ln", "0.001", "10"): [(5.01, "finished"), (5.33, "finished"), (5.10, "finished")],  # about the same
    ("post-ln", "0.01", "0"): [(5.00, "finished"), (None, "incomplete"), (None, "incomplete")],  # 1 seed finished
    ("post-ln", "0.01", "10"): [(5.50, "finished"), (5.62, "finished"), (None, "diverged")],
}


def _row(arm: str, lr: str, warmup: str, seed: int, loss, status: str) -> dict:
    learned = None if status != "finished" else loss < UNIGRAM - 0.1
    return {"arm": arm, "cell": {"train.lr": lr, "train.warmup_steps": warmup}, "seed": seed, "status": status,
            "reason": "", "val_loss": loss, "metric": "loss", "learned": learned, "unigram_entropy": UNIGRAM,
            "tokens": 1000, "training_flops": None, "tokens_per_s": 100.0, "peak_rss_bytes": 2**20, "elapsed_s": 1.0,
            "point": f"{arm}-lr{lr}-warmup_steps{warmup}-seed{seed}"}


def _context(tmp_path):
    arms = [{"name": a, "label": a, "recipe": "recipes/dense/tiny.yaml", "overrides": [], "own": [],
             "budget": {"tokens": 1000}} for a in ("pre-ln", "post-ln")]
    spec = {"name": "fake-grid", "arms": [{"name": "pre-ln"}, {"name": "post-ln"}], "budget": {"tokens": 1000},
            "reference": "pre-ln", "out": str(tmp_path), "seeds": [0, 1, 2], "grid": GRID,
            "measurements": {"stability": {}}}
    rows = [_row(arm, lr, w, s, loss, status) for (arm, lr, w), seeds in LOSSES.items()
            for s, (loss, status) in enumerate(seeds)]
    costs = {a["name"]: {"params_total": 1e3, "params_active": 1e3, "flops_per_token": 6e3, "kv_bytes_per_token": 64}
             for a in arms}
    return context_from_rows({"spec": spec, "arms": arms}, rows, [], {}, tmp_path, costs=costs)


@pytest.fixture
def section(tmp_path):
    return Stability().section(_context(tmp_path))


def _cell(section, arm, lr, warmup) -> dict:
    return next(c for c in section.data["cells"] if c["arm"] == arm
                and c["cell"] == {"train.lr": lr, "train.warmup_steps": warmup})


def _t_interval(values, level=0.95):
    x = np.asarray(values, float)
    half = stats.t.ppf(0.5 + level / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return x.mean(), x.mean() - half, x.mean() + half


def test_each_cell_prints_its_mean_with_the_t_interval_over_its_seeds(section):
    for (arm, lr, w), seeds in LOSSES.items():
        finished = [v for v, status in seeds if status == "finished"]
        if len(finished) < 2:
            continue
        mean, low, high = _t_interval(finished)
        c = _cell(section, arm, lr, w)
        assert (c["loss"]["mean"], c["loss"]["low"], c["loss"]["high"]) == pytest.approx((mean, low, high))
        per_seed = ", ".join(f"{v:.2f}" for v in finished)
        assert f"{mean:.2f} [{low:.2f}, {high:.2f}] ({per_seed})" in section.markdown


def test_a_cell_with_one_finished_seed_says_so_and_has_no_interval(section):
    c = _cell(section, "post-ln", "0.01", "0")
    assert c["loss"]["n"] == 1 and c["loss"]["low"] is None
    assert "5.00 (1 seed finished: no interval) **2 incomplete**" in section.markdown
    r = c["paired"]
    assert r["seeds"] == [0] and r["low"] is None and r["p_difference"] is None and r["class"] == "unresolved"
    row = next(line for line in section.markdown.splitlines() if line.startswith("| lr=0.01, warmup_steps=0 |"))
    assert "fewer than 2 paired seeds: no interval, no test" in row and "+0.200 nats (1 seed)" in row


def test_paired_differences_are_holm_adjusted_over_the_arm_cells(section):
    """Against scipy's one-sample t-test on arm - reference per seed and Holm written out here: the adjusted p,
    the interval at level 1 - 0.05 p / p_Holm, and the verdict. The one-seed cell is not in the family (k = 3)."""
    ref = {(lr, w): v for (arm, lr, w), v in LOSSES.items() if arm == "pre-ln"}
    diffs = {}
    for (arm, lr, w), seeds in LOSSES.items():
        if arm != "post-ln":
            continue
        pairs = [(UNIGRAM if status == "diverged" else v) - r for (v, status), (r, _) in zip(seeds, ref[(lr, w)])
                 if status in ("finished", "diverged")]
        if len(pairs) >= 2:
            diffs[(lr, w)] = np.asarray(pairs)
    p = {k: stats.ttest_1samp(d, 0.0).pvalue for k, d in diffs.items()}
    order = sorted(p, key=p.get)
    k, running, p_adj = len(order), 0.0, {}
    for i, key in enumerate(order):
        running = max(running, min(1.0, (k - i) * p[key]))
        p_adj[key] = running
    assert k == 3
    for (lr, w), d in diffs.items():
        r = _cell(section, "post-ln", lr, w)["paired"]
        alpha = 0.05 * p[(lr, w)] / p_adj[(lr, w)]
        half = stats.t.ppf(1 - alpha / 2, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
        assert r["p_difference"] == pytest.approx(p[(lr, w)])
        assert r["p_difference_holm"] == pytest.approx(p_adj[(lr, w)])
        assert (r["mean"], r["low"], r["high"]) == pytest.approx((d.mean(), d.mean() - half, d.mean() + half))
        assert (r["low"] > 0 or r["high"] < 0) == (p_adj[(lr, w)] <= 0.05)  # the interval agrees with the verdict
        row = next(line for line in section.markdown.splitlines() if line.startswith(f"| lr={lr}, warmup_steps={w} |"))
        text = f"{d.mean():+.3f} nats [{d.mean() - half:+.3f}, {d.mean() + half:+.3f}] at {100 * (1 - alpha):.1f}%"
        assert text in row
    assert _cell(section, "post-ln", "0.001", "0")["paired"]["class"] == "worse"  # stuck at the unigram loss
    assert _cell(section, "post-ln", "0.001", "10")["paired"]["class"] == "unresolved"
    assert _cell(section, "pre-ln", "0.001", "0")["paired"] is None  # the reference is not paired with itself


def test_a_diverged_seed_is_left_out_of_the_mean_and_pairs_at_the_unigram_entropy(section):
    c = _cell(section, "post-ln", "0.01", "10")
    assert c["loss"]["n"] == 2 and c["loss"]["mean"] == pytest.approx((5.50 + 5.62) / 2)
    assert "**1 diverged**" in section.markdown
    r = c["paired"]
    assert r["seeds"] == [0, 1, 2] and r["values"][2] == pytest.approx(UNIGRAM - 4.74)
    assert r["diverged_at_unigram"] == {"arm": [2], "against": []}
    row = next(line for line in section.markdown.splitlines() if line.startswith("| lr=0.01, warmup_steps=10 |"))
    assert "`post-ln` seed 2 diverged: at the unigram entropy" in row


def test_the_section_keeps_the_heat_map_and_names_the_level(section):
    assert section.figures == ["stability.png"]
    assert "at least 95%" in section.markdown
    assert "Holm over the 3 cells with at least 2 paired seeds" in section.markdown  # the 1-seed cell is not tested
    assert section.data["paired"]["against"] == "pre-ln"
