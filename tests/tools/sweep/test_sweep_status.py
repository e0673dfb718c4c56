"""tools.sweep.status: each run's own steps, the wall-time model and where a sweep stands."""

from __future__ import annotations

import json

import pytest

from tests.tools.sweep.helpers import write_cooldown_spec
from tools.sweep.plan import build_points, plan_point
from tools.sweep.status import RunTimes, _time_model, own_flops, own_steps, steps_done, sweep_status


def test_status_counts_each_runs_own_steps_and_its_latest_checkpoint(tmp_path):
    """A branch trains only its decay; a started run counts the steps of its latest checkpoint; nothing timed
    yet gives no time left."""
    _, spec = write_cooldown_spec(tmp_path)
    points = {p.name: plan_point(p, tmp_path / "sweep", 1, 4) for p in build_points(spec)}
    trunk, short, long = points["ok-stable"], points["ok-cd2048"], points["ok-cd4096"]
    assert [own_steps(p) for p in (trunk, short, long)] == [13, 2, 3]
    step = tmp_path / "sweep" / "ok-stable" / "checkpoints" / "step_00000006"
    step.mkdir(parents=True)
    (step / "manifest.json").write_text("{}")
    assert steps_done(trunk) == 6 and steps_done(short) == 0
    st = sweep_status(spec, jobs=2)
    per_step = trunk.tokens_per_step * trunk.flops_per_token
    assert st["flops_total"] == pytest.approx((13 + 2 + 3) * per_step)
    assert st["flops_done"] == pytest.approx(6 * per_step)
    assert (st["finished"], st["started"], st["seconds_left"]) == (0, 1, None)
    # the trunk and the short branch finished in 10 s + FLOPs / 1e6 FLOPs/s: the fit recovers both, and the
    # long branch left takes 10 s + its FLOPs / 1e6, one job at a time
    records = []
    for p in (trunk, short):
        (tmp_path / "sweep" / p.name).mkdir(parents=True, exist_ok=True)
        (tmp_path / "sweep" / p.name / "summary.json").write_text(json.dumps({"status": "completed"}))
        records.append({"name": p.name, "elapsed_s": 10.0 + own_steps(p) * per_step / 1e6})
    (tmp_path / "sweep" / "manifest.json").write_text(json.dumps({"kind": "archlab-sweep", "points": records}))
    st = sweep_status(spec, jobs=1)
    (fit,) = st["speed"].values()  # the one size of the ok ladder
    assert fit == pytest.approx({"flops_per_s": 1e6, "start_s": 10.0})
    assert st["seconds_left"] == pytest.approx(10.0 + 3 * per_step / 1e6)


def test_an_unfitted_size_takes_the_fitted_sizes_speed_trend_within_their_range(tmp_path):
    """Sizes without a fit of their own: the fitted sizes' speed as a power law of the FLOPs per token,
    interpolated, never extrapolated beyond the fastest or slowest fitted speed."""
    from dataclasses import replace

    _, spec = write_cooldown_spec(tmp_path)
    trunk = plan_point(next(p for p in build_points(spec) if p.role == "stable"), tmp_path / "sweep", 1, 4)
    fpt = trunk.flops_per_token
    models = {("a", "s"): (10.0, 1e6), ("a", "l"): (30.0, 4e6)}  # 4x the FLOPs per token, 4x the speed
    times = RunTimes(models, {("a", "s"): fpt, ("a", "l"): 4 * fpt})
    flops = own_flops(replace(trunk, flops_per_token=2 * fpt))
    mid = replace(trunk, ladder="a", size="m", flops_per_token=2 * fpt)  # halfway in log: 2e6 FLOPs/s
    assert times.seconds(mid) == pytest.approx(20 + flops / 2e6)
    wide = replace(trunk, ladder="a", size="w", flops_per_token=64 * fpt)  # the trend says 64e6: kept at 4e6
    assert times.seconds(wide) == pytest.approx(20 + own_flops(wide) / 4e6)
    one = RunTimes({("a", "s"): (10.0, 1e6)}, {("a", "s"): fpt})
    assert one.seconds(mid) == pytest.approx(10 + flops / 1e6)
    assert RunTimes({}, {}).seconds(mid) is None


def test_time_model_needs_runs_of_different_lengths():
    assert _time_model([(1e9, 12.0), (4e9, 42.0)]) == pytest.approx((2.0, 1e8))  # 2 s start-up, 1e8 FLOPs/s
    assert _time_model([(1e9, 12.0), (2e9, 22.0)]) is None  # 2x apart: start-up and speed not separable
    assert _time_model([(1e9, 12.0), (4e9, 10.0)]) is None  # longer runs faster: no speed to read
    assert _time_model([(1e9, 12.0)]) is None


def test_before_any_size_is_fitted_the_runs_of_all_sizes_give_the_time_left(tmp_path):
    """One finished run of each of two sizes (3x apart in FLOPs): no size has a fit of its own, yet one line
    through both gives every run to go a time, instead of 'unknown'."""
    from dataclasses import replace

    from tools.sweep.status import status_text

    _, spec = write_cooldown_spec(tmp_path)
    points = {p.name: plan_point(p, tmp_path / "sweep", 1, 4) for p in build_points(spec)}
    trunk, short = points["ok-stable"], points["ok-cd2048"]
    per_step = trunk.tokens_per_step * trunk.flops_per_token
    for p in (trunk, short):  # finished, in 10 s + FLOPs / 1e6 FLOPs/s
        (tmp_path / "sweep" / p.name).mkdir(parents=True, exist_ok=True)
        (tmp_path / "sweep" / p.name / "summary.json").write_text(json.dumps({"status": "completed"}))
    two = [replace(trunk, size="s1"), replace(short, size="s2")]  # as if two sizes, one run each
    times = RunTimes.fit(two, {p.name: 10.0 + own_steps(p) * per_step / 1e6 for p in two})
    assert times.models == {} and times.pooled == pytest.approx((10.0, 1e6))
    assert times.seconds(replace(points["ok-cd4096"], size="s3")) == pytest.approx(10.0 + 3 * per_step / 1e6)
    st = {"out": "o", "points": 3, "finished": 2, "diverged": 0, "started": 0, "flops_done": 1.0, "flops_total": 2.0,
          "speed": {}, "pooled": {"flops_per_s": 1e6, "start_s": 10.0}, "seconds_left": 40.0, "jobs": 1, "rows": []}
    text = status_text(st)
    assert "every size together" in text and "time left at --jobs 1" in text and "unknown" not in text
