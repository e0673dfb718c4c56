"""analysis.eval_error: the validation set's error common to every seed, beside the seed error of each verdict,
on per-window losses with a known shared window effect; the rule read from a report.json's per-arm summary
where no per-window losses exist; and the text saying where it holds, fails, or was not measured."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from analysis import eval_error

W = 400  # validation windows


def _ctx(window_sd: float, seed_sd: float, rng: np.random.Generator, measured: bool = True):
    """Two arms, 3 seeds, the same W windows: the arm differs from the reference by 0.05 nats plus a per-window
    effect of sd ``window_sd`` common to every seed (the evaluation error the seed spread misses) plus a per-seed
    shift of sd ``seed_sd``."""
    base_W = 3.0 + 0.5 * rng.standard_normal(W)  # the windows' own difficulty: cancels in the pair
    common_W = window_sd * rng.standard_normal(W)
    windows, groups = {}, {}
    for arm in ("ref", "arm"):
        runs = {}
        for s in range(3):
            w = base_W + 0.02 * rng.standard_normal(W)
            if arm == "arm":
                w = w + 0.05 + common_W + seed_sd * rng.standard_normal()
            point = f"{arm}-seed{s}"
            windows[point] = w.tolist()
            runs[s] = {"point": point, "val_loss": float(w.mean()), "status": "finished"}
        groups[arm] = SimpleNamespace(runs=runs, losses=lambda runs=runs: {s: r["val_loss"] for s, r in runs.items()})
    return SimpleNamespace(measures={"val_sampling": windows} if measured else {}, reference="ref",
                           group=groups.get, arms={a: SimpleNamespace(label=a) for a in groups})


VERDICT = [{"arm": "arm", "against": "ref", "seeds": [0, 1, 2]}]


def test_a_shared_window_effect_is_measured_and_fails_the_rule_when_seeds_agree():
    """A common window effect of sd 0.2 gives an evaluation se near 0.2 / sqrt(400) = 0.01; with seeds that
    agree to 0.002 nats, the rule fails and the interval would widen by several times."""
    [row] = eval_error.check(_ctx(0.2, 0.002, np.random.default_rng(0)), VERDICT)
    assert row["eval_se"] == pytest.approx(0.2 / math.sqrt(W), rel=0.15) and row["windows"] == W
    assert row["holds"] is False and row["ratio"] > 1 and row["widen"] == pytest.approx(math.hypot(1, row["ratio"]))
    assert "per-window differences, 3 seeds" in row["source"]


def test_the_rule_holds_when_the_seeds_spread_more_than_the_windows():
    [row] = eval_error.check(_ctx(0.02, 0.05, np.random.default_rng(1)), VERDICT)
    assert row["holds"] is True and row["ratio"] <= eval_error.RATIO and row["widen"] < 1.055
    text = eval_error.text([row])
    assert "The rule holds for every verdict measured" in text and "| yes |" in text


def test_a_report_json_summary_stands_in_for_the_windows_against_the_reference():
    ctx = _ctx(0.0, 0.01, np.random.default_rng(2), measured=False)
    summary = {"arms": {"arm": {"windows": 512, "val_paired_half_width": 0.0196}}}
    [row] = eval_error.check(ctx, VERDICT, summary)
    assert row["eval_se"] == pytest.approx(0.01, rel=1e-3) and row["windows"] == 512 and "report.json" in row["source"]
    other = [{"arm": "ref", "against": "arm", "seeds": [0, 1, 2]}]  # not against the reference: no summary applies
    [none] = eval_error.check(ctx, other, summary)
    assert none["eval_se"] is None and none["holds"] is None
    assert "not checked" in eval_error.text([none]) and "not measured" in eval_error.text([none])


def test_the_paired_se_uses_only_common_seeds_of_equal_windows():
    a = {0: [1.0, 2.0, 3.0], 1: [1.0, 2.0, 3.0], 2: [1.0, 2.0]}
    b = {0: [0.0, 0.0, 0.0], 1: [0.0, 0.0, 0.0], 2: [0.0, 0.0, 0.0]}
    se, windows, seeds = eval_error.paired_eval_se(a, b)
    assert (windows, seeds) == (3, 2) and se == pytest.approx(1.0 / math.sqrt(3))
    assert eval_error.paired_eval_se({0: [1.0]}, {0: [0.0]}) is None
    assert eval_error.seed_se({0: 1.0}, {0: 0.5}) is None


def test_the_val_sampling_table_reads_the_rule_on_standard_errors(monkeypatch):
    """attention-kv's GQA-4 numbers: a paired validation half-width of 0.0092 beside a 5-seed paired interval of
    half-width 0.036 (sd 0.029) passes on half-widths (0.26) but not on standard errors (0.0047 / 0.0130 = 0.36)."""
    from analysis.measurements import val_sampling

    monkeypatch.setattr(val_sampling.val_bootstrap, "bootstrap_mean_interval", lambda w: {"half_width": 0.107})
    monkeypatch.setattr(val_sampling.val_bootstrap, "paired_bootstrap_difference",
                        lambda a, b: {"half_width": 0.0092})
    runs = {s: {"point": f"p{s}"} for s in range(5)}
    ref = SimpleNamespace(arm="mha", label="MHA", runs=runs, loss={"low": 3.6, "high": 3.66}, vs_reference=None)
    arm = SimpleNamespace(arm="gqa4", label="GQA", runs=runs, loss={"low": 3.61, "high": 3.63},
                          vs_reference={"low": -0.047, "high": 0.025, "sd": 0.029, "n": 5})
    ctx = SimpleNamespace(measures={"val_sampling": {f"p{s}": [0.0] * 512 for s in range(5)}}, reference="mha",
                          group=lambda a: ref if a == "mha" else arm, arm_groups=lambda: [ref, arm])
    sec = val_sampling.ValSampling().section(ctx)
    assert sec.data["arms"]["gqa4"]["within_a_third"] is False and sec.data["arms"]["mha"]["within_a_third"] is None
    assert "standard errors" in sec.markdown
