"""tools.sweep: grid expansion, steps from budgets, commands, and a real resumable sweep."""

from __future__ import annotations

import json
import math
import tarfile

import pytest

from archlab.config import load_recipe, model_config
from archlab.costs import param_counts, training_flops_per_token
from tools.sweep.archive import _archivable
from tools.sweep.cli import main
from tools.sweep.plan import build_points, plan_point
from tools.sweep.schedule import _fits, _schedule, command
from tools.sweep.status import RunTimes, _time_model, own_flops, own_steps, steps_done, sweep_status

TINY = ["model.vocab_size=384", "train.seq_len=32", "train.micro_batch_size=8", "data.max_bytes=150000",
        "train.eval_batches=2", "train.tensorboard=false", "train.eval_context_multipliers=[1]",
        "model.d_model=16", "model.n_layers=1", "model.n_heads=2"]


def test_points_cross_ladders_sizes_grid_and_budgets():
    spec = {"ladders": {"dense": {"recipe": "recipes/dense/tiny.yaml"},
                        "llama": {"recipe": "recipes/llama/tiny.yaml", "set": ["model.n_kv_heads=1"],
                                  "sizes": {"s": ["train.lr=1e-3"]}}},
            "sizes": {"s": ["model.d_model=32"], "m": ["model.d_model=64"]},
            "grid": {"train.seed": [0, 1]}, "tokens": [1e5], "flops": [1e12], "set": ["data.max_bytes=1000"]}
    points = build_points(spec)
    assert len(points) == 2 * 2 * 2 * 2
    names = {p.name for p in points}
    assert "llama-s-seed1-tok100000" in names and "dense-m-seed0-flop1e12" in names
    p = next(p for p in points if p.name == "llama-s-seed1-tok100000")
    # order: common, ladder, size (shared then ladder-specific), grid: later overrides win
    assert p.overrides == ["data.max_bytes=1000", "model.n_kv_heads=1", "model.d_model=32", "train.lr=1e-3",
                           "train.seed=1"]


def test_steps_come_from_token_and_flop_budgets(tmp_path):
    spec = {"ladders": {"dense": {"recipe": "recipes/dense/tiny.yaml"}}, "set": TINY, "tokens": [5000], "flops": [3e9]}
    tok, flop = [plan_point(p, tmp_path, processes=2, evals=4) for p in build_points(spec)]
    cfg = load_recipe("recipes/dense/tiny.yaml", TINY)
    tps = 32 * 8 * 1 * 2
    fpt = training_flops_per_token(model_config(cfg), 32)
    assert tok.tokens_per_step == tps and tok.max_steps == math.ceil(5000 / tps)
    assert flop.flops_per_token == fpt and flop.max_steps == math.ceil(3e9 / (fpt * tps))
    assert flop.planned_flops == pytest.approx(flop.max_steps * tps * fpt)
    extra = tok.extra["launch_overrides"]
    assert f"train.max_steps={tok.max_steps}" in extra and f"train.run_name={tok.name}" in extra
    assert f"train.eval_every={max(1, tok.max_steps // 4)}" in extra


def test_user_settings_win_over_scaled_defaults(tmp_path):
    spec = {"ladders": {"d": {"recipe": "recipes/dense/tiny.yaml"}}, "set": TINY + ["train.eval_every=3"],
            "tokens": [20000]}
    p = plan_point(build_points(spec)[0], tmp_path, 1, 8)
    assert not any(o.startswith("train.eval_every=") for o in p.extra["launch_overrides"])


def test_commands_for_both_launchers(tmp_path):
    spec = {"ladders": {"d": {"recipe": "recipes/dense/tiny.yaml"}}, "set": TINY, "tokens": [5000]}
    p = plan_point(build_points(spec)[0], tmp_path, 2, 8)
    cmd = command(p, "python", 1, [])
    assert cmd[1:4] == ["-m", "archlab.train", "recipes/dense/tiny.yaml"] and "train.resume=auto" not in cmd
    acc = command(p, "accelerate", 2, [])
    assert acc[1:3] == ["-m", "accelerate.commands.launch"]
    assert acc[3:6] == ["--multi_gpu", "--num_processes", "2"] and "archlab.train" in acc
    (tmp_path / p.name).mkdir()  # a started point continues from its checkpoint
    assert command(p, "python", 1, [])[-1] == "train.resume=auto"


def test_bad_sweeps_fail_clearly(tmp_path, capsys):
    bad_spec = tmp_path / "bad.yaml"
    bad_spec.write_text("ladders: {d: {recipe: recipes/dense/tiny.yaml}}\ntokens: [1e5]\nsizez: {}\n")
    cases = [
        (["--recipes", "recipes/dense/tiny.yaml"], "no budget"),
        (["--tokens", "1e5"], "no recipes"),
        (["--recipes", "recipes/dense/nope.yaml", "--tokens", "1e5"], "recipe file not found"),
        (["--recipes", "recipes/dense/tiny.yaml", "--tokens", "1e5", "--set", "model.d_model=30"], "n_heads"),
        (["--recipes", "recipes/dense/tiny.yaml", "--tokens", "-5"], "must be positive"),
        (["--spec", str(bad_spec)], "unknown keys"),
        (["--spec", str(tmp_path / "none.yaml")], "file not found"),
        (["--recipes", "recipes/dense/tiny.yaml", "--tokens", "1e5", "--num-processes", "2"], "--launcher accelerate"),
    ]
    for args, message in cases:
        assert main(args + ["--out", str(tmp_path / "s"), "--dry-run"]) == 2, args
        assert message in capsys.readouterr().err, args
    assert not (tmp_path / "s").exists()


def test_dry_run_prints_commands_and_writes_nothing(tmp_path, capsys):
    assert main(["--recipes", "recipes/dense/tiny.yaml", "recipes/llama/tiny.yaml", "--tokens", "4096",
                 "--set", *TINY, "--out", str(tmp_path / "s"), "--dry-run"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and all("archlab.train" in line and "train.max_steps=16" in line for line in lines)
    assert not (tmp_path / "s").exists()


def test_a_real_sweep_records_failures_and_resumes(tmp_path, capsys):
    """One point trains, one fails (its corpus path does not exist); the rerun skips the finished
    point, retries the failed one, and a changed point under the same name is refused."""
    out = tmp_path / "sweep"
    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps({
        "out": str(out), "tokens": [4096],
        "set": TINY + [f"data.cache_dir={tmp_path / 'cache'}"],
        "ladders": {"ok": {"recipe": "recipes/dense/tiny.yaml"},
                    "broken": {"recipe": "recipes/dense/tiny.yaml",
                               "set": ["data.source=text", f"data.paths=[{tmp_path / 'missing.txt'}]"]}},
    }))
    assert main(["--spec", str(spec), "--jobs", "2", "--threads", "1", "--yes"]) == 1  # both points at once
    manifest = json.loads((out / "manifest.json").read_text())
    points = {p["name"]: p for p in manifest["points"]}
    ok, broken = points["ok-tok4096"], points["broken-tok4096"]
    assert ok["status"] == "finished" and ok["returncode"] == 0 and ok["max_steps"] == 16
    summary = json.loads((out / "ok-tok4096" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["tokens"] == 16 * 256
    assert broken["status"] == "failed" and broken["returncode"] == 2
    assert "missing.txt" in (out / "logs" / "broken-tok4096.log").read_text()
    capsys.readouterr()

    (out / "broken-tok4096").mkdir(exist_ok=True)  # its folder exists: the retry resumes it
    assert main(["--spec", str(spec), "--stop-on-failure"]) == 1
    again = {p["name"]: p for p in json.loads((out / "manifest.json").read_text())["points"]}
    assert again["ok-tok4096"]["elapsed_s"] == ok["elapsed_s"]  # skipped, not retrained
    assert again["broken-tok4096"]["status"] == "failed"
    assert again["broken-tok4096"]["elapsed_s"] > broken["elapsed_s"]  # a resumed run adds its invocations' times
    assert "1 already done" in capsys.readouterr().out

    assert main(["--spec", str(spec), "--set", "train.lr=1e-4", "--dry-run"]) == 2
    assert "different settings" in capsys.readouterr().err


def _cooldown_spec(tmp_path, name="cd.yaml", **extra):
    spec = {"out": str(tmp_path / "sweep"), "set": TINY + [f"data.cache_dir={tmp_path / 'cache'}"],
            "ladders": {"ok": {"recipe": "recipes/dense/tiny.yaml"}},
            "cooldown": {"tokens": [2048, 4096], "decay_fraction": 0.2, "shape": "sqrt"}, **extra}
    path = tmp_path / name
    path.write_text(json.dumps(spec))
    return path, spec


def test_cooldown_plans_a_stable_trunk_and_its_branches(tmp_path):
    """Per point a trunk to the last branch step with a checkpoint at each, and per token count D a
    branch of ceil(D / 256) steps whose last 20% decay from the trunk's checkpoint; tokens points too."""
    _, spec = _cooldown_spec(tmp_path, tokens=[4096], set=TINY + ["train.warmup_steps=1"])
    points = {p.name: plan_point(p, tmp_path, 1, 4) for p in build_points(spec)}
    assert list(points) == ["ok-tok4096", "ok-stable", "ok-cd2048", "ok-cd4096"]
    full, trunk, short, long = points.values()
    assert (full.role, trunk.role, short.role, long.role) == ("full", "stable", "cooldown", "cooldown")
    assert short.parent == long.parent == "ok-stable" and full.parent is None
    # 8 steps: decay round(1.6) = 2 from step 6; 16 steps: decay round(3.2) = 3 from step 13
    assert (short.max_steps, short.cooldown["branch_step"], short.cooldown["decay_steps"]) == (8, 6, 2)
    assert (long.max_steps, long.cooldown["branch_step"], long.cooldown["decay_steps"]) == (16, 13, 3)
    assert trunk.max_steps == 13 and trunk.cooldown["branch_steps"] == [6, 13]
    assert long.planned_tokens == full.planned_tokens == 4096 and long.max_steps == full.max_steps
    t_extra, b_extra = trunk.extra["launch_overrides"], long.extra["launch_overrides"]
    assert "train.schedule=constant" in t_extra and "train.ckpt_steps=[6,13]" in t_extra
    assert {"train.schedule=wsd", "train.decay_steps=3", "train.decay_shape=sqrt", "train.max_steps=16",
            f"train.branch_from={tmp_path}/ok-stable/checkpoints/step_00000013"} <= set(b_extra)
    assert not any(o.startswith("train.schedule=") for o in full.extra["launch_overrides"])  # the recipe's cosine
    # one warmup for the trunk and all branches: the user's here; else the recipe's capped at a tenth of the
    # shortest branch (8 steps -> 0)
    assert not any(o.startswith("train.warmup_steps=") for o in t_extra + b_extra)
    _, spec = _cooldown_spec(tmp_path)
    warm = {o for p in build_points(spec) for o in plan_point(p, tmp_path, 1, 4).extra["launch_overrides"]
            if o.startswith("train.warmup_steps=")}
    assert warm == {"train.warmup_steps=0"}


def test_status_counts_each_runs_own_steps_and_its_latest_checkpoint(tmp_path):
    """A branch trains only its decay; a started run counts the steps of its latest checkpoint; nothing timed
    yet gives no time left."""
    _, spec = _cooldown_spec(tmp_path)
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


def test_hours_starts_a_trunk_only_if_it_and_its_branches_end_in_time(tmp_path, capsys):
    import time

    _, spec = _cooldown_spec(tmp_path)
    points = {p.name: plan_point(p, tmp_path / "sweep", 1, 4) for p in build_points(spec)}
    trunk, short, long = points["ok-stable"], points["ok-cd2048"], points["ok-cd4096"]
    key = (trunk.ladder, trunk.size)
    times = RunTimes({key: (10.0, 1e6)}, {key: trunk.flops_per_token})  # 10 s start-up, 1e6 FLOPs/s
    per_step = trunk.tokens_per_step * trunk.flops_per_token / 1e6
    assert times.seconds(trunk) == pytest.approx(10 + 13 * per_step)
    unit = times.seconds(trunk) + times.seconds(short) + times.seconds(long)
    deadline = time.time() + unit - 1  # the trunk alone fits, with its branches not
    queue = [trunk, short, long]
    assert not _fits(trunk, queue, times, deadline) and _fits(short, queue, times, deadline)
    assert _fits(trunk, queue, times, deadline + 60) and _fits(trunk, queue, None, deadline)  # no speed yet: starts
    path, _ = _cooldown_spec(tmp_path, "h.yaml")
    assert main(["--spec", str(path), "--hours", "0"]) == 2
    assert "--hours 0.0: must be > 0" in capsys.readouterr().err
    assert main(["--spec", str(path), "--hours", "1", "--status"]) == 2
    assert "train nothing" in capsys.readouterr().err


def test_hours_goes_on_when_runs_ending_in_one_pass_free_every_slot(tmp_path):
    """Two runs ending in the same poll leave nothing running with points still ready: that is no reason
    to stop while those points fit (here no speed is measured yet, so they do)."""
    import sys

    spec = {"ladders": {"d": {"recipe": "recipes/dense/tiny.yaml"}}, "set": TINY, "tokens": [1000, 2000, 3000, 4000]}
    points = [plan_point(p, tmp_path, 1, 4) for p in build_points(spec)]
    said = []
    _schedule(list(points), points, tmp_path, spec, 2, {}, False, said.append,
              lambda p: [sys.executable, "-c", "pass"], hours=10.0)  # each "run" ends at once, without a run folder
    assert [p.status for p in points] == ["interrupted"] * 4, said  # all four started (none trained anything)
    assert not any(line.startswith("stopping") for line in said)


def test_an_unfitted_size_takes_the_fitted_sizes_speed_trend_within_their_range(tmp_path):
    """Sizes without a fit of their own: the fitted sizes' speed as a power law of the FLOPs per token,
    interpolated, never extrapolated beyond the fastest or slowest fitted speed."""
    from dataclasses import replace

    _, spec = _cooldown_spec(tmp_path)
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


def test_cooldown_flops_branches_each_size_at_the_same_compute(tmp_path):
    """cooldown.flops: every size ends a branch at each compute budget C, with D = C / its training
    FLOPs per token: the sizes' points line up on IsoFLOP lines."""
    sizes = {"small": ["model.d_model=32"], "wide": ["model.d_model=64"]}
    _, spec = _cooldown_spec(tmp_path, sizes=sizes, set=TINY + ["train.warmup_steps=1"],
                             cooldown={"flops": [2.0e9, 4.0e9], "decay_fraction": 0.2})
    points = {p.name: plan_point(p, tmp_path, 1, 4) for p in build_points(spec)}
    branches = [p for p in points.values() if p.role == "cooldown"]
    assert sorted(p.name for p in branches) == ["ok-small-cdflop2e9", "ok-small-cdflop4e9", "ok-wide-cdflop2e9",
                                                "ok-wide-cdflop4e9"]
    for p in branches:
        tokens = p.budget / p.flops_per_token  # this size's D at budget C
        assert p.max_steps == math.ceil(tokens / p.tokens_per_step)
        assert abs(p.planned_flops - p.budget) <= p.flops_per_token * p.tokens_per_step  # within one step of C
    small, wide = points["ok-small-cdflop4e9"], points["ok-wide-cdflop4e9"]
    assert wide.flops_per_token > small.flops_per_token and wide.max_steps < small.max_steps
    assert points["ok-wide-stable"].cooldown["branch_steps"] == sorted(
        p.cooldown["branch_step"] for p in branches if p.parent == "ok-wide-stable")


def test_cooldown_budgets_train_each_size_only_at_its_own_budgets(tmp_path):
    """cooldown.budgets: an IsoFLOP design where each budget lists its sizes: a size gets one trunk,
    run to its own largest budget, and branches only at the budgets that list it."""
    sizes = {"small": ["model.d_model=16"], "mid": ["model.d_model=32"], "wide": ["model.d_model=64"]}
    _, spec = _cooldown_spec(tmp_path, sizes=sizes, set=TINY + ["train.warmup_steps=1"],
                             cooldown={"budgets": [{"flops": 2.0e9, "sizes": ["small", "mid"]},
                                                   {"flops": 8.0e9, "sizes": ["mid", "wide"]}]})
    points = {p.name: plan_point(p, tmp_path, 1, 4) for p in build_points(spec)}
    assert sorted(points) == ["ok-mid-cdflop2e9", "ok-mid-cdflop8e9", "ok-mid-stable", "ok-small-cdflop2e9",
                              "ok-small-stable", "ok-wide-cdflop8e9", "ok-wide-stable"]
    small, mid = points["ok-small-stable"], points["ok-mid-stable"]
    # the small trunk stops at its only branch's start, not at the 8e9 budget it is not part of
    assert small.max_steps == points["ok-small-cdflop2e9"].cooldown["branch_step"]
    assert mid.cooldown["branch_steps"] == sorted(points[f"ok-mid-cdflop{c}"].cooldown["branch_step"]
                                                  for c in ("2e9", "8e9"))


def test_cooldown_compute_6nd_places_branches_at_six_n_d(tmp_path):
    """cooldown.compute: 6nd: a FLOPs budget C is Kaplan's 6 N D (N: active non-embedding parameters
    without the LM head), so D = C / 6N; the measured FLOPs (LM head, attention) stay the cost."""
    sizes = {"small": ["model.d_model=16"], "wide": ["model.d_model=32"]}
    _, spec = _cooldown_spec(tmp_path, sizes=sizes, set=TINY + ["train.warmup_steps=1"],
                             cooldown={"flops": [4.0e8], "compute": "6nd"})
    for p in (plan_point(p, tmp_path, 1, 4) for p in build_points(spec)):
        if p.role != "cooldown":
            continue
        n = param_counts(model_config(load_recipe("recipes/dense/tiny.yaml", p.overrides))).active_no_head
        assert p.max_steps == math.ceil(4.0e8 / (6 * n) / p.tokens_per_step)
        assert p.flops_per_token > 6 * n  # the measured cost counts the LM head too
        assert p.planned_flops == p.planned_tokens * p.flops_per_token


@pytest.mark.parametrize("budgets,message", [
    ([{"flops": 2e9, "sizes": ["small", "huge"]}], "sizes ['huge'] are not defined under sizes:"),
    ([{"flops": 2e9, "sizes": ["small"]}], "sizes ['wide'] are in no budget"),
    ([{"flops": 2e9, "sizes": ["small", "wide"]}, {"tokens": 4096, "sizes": ["wide"]}], "mixes flops and tokens"),
    ([{"flops": 2e9, "sizes": ["small", "wide"]}, {"flops": 2e9, "sizes": ["wide"]}], "is listed twice"),
    ([{"flops": 2e9}], "needs a list of size names"),
    ([], "needs a list such as"),
])
def test_bad_cooldown_budgets_fail_clearly(tmp_path, capsys, budgets, message):
    sizes = {"small": ["model.d_model=16"], "wide": ["model.d_model=32"]}
    path, _ = _cooldown_spec(tmp_path, sizes=sizes, cooldown={"budgets": budgets})
    assert main(["--spec", str(path), "--dry-run"]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "sweep").exists()


@pytest.mark.parametrize("cooldown,extra_set,message", [
    ({"tokens": []}, [], "cooldown.tokens=[]: needs a list"),
    ({"tokens": [4096], "flops": [1e9]}, [], "cooldown: give exactly one of tokens"),
    ({"shape": "sqrt"}, [], "cooldown: give exactly one of tokens"),
    ({"tokens": [4096], "shape": "cubic"}, [], "cooldown.shape='cubic': must be one of: linear, sqrt"),
    ({"tokens": [4096], "decay_fraction": 1.5}, [], "cooldown.decay_fraction=1.5: must lie in (0, 1)"),
    ({"tokens": [4096], "every": 2}, [], "cooldown: unknown keys ['every']"),
    ({"tokens": [-5]}, [], "must be positive"),
    ({"flops": [1e9], "compute": "kaplan"}, [], "cooldown.compute='kaplan': must be one of: measured, 6nd"),
    ({"tokens": [4096], "compute": "6nd"}, [], "only FLOPs budgets have a compute convention"),
    ({"tokens": [4096]}, ["train.schedule=cosine"], "'train.schedule=cosine' (point ok) is set by the sweep"),
    ({"tokens": [256]}, [], "leave the branch start at step 0"),
    ({"tokens": [2048]}, ["train.warmup_steps=7"], "before the end of the warmup (7 steps)"),
])
def test_bad_cooldown_specs_fail_clearly(tmp_path, capsys, cooldown, extra_set, message):
    path, _ = _cooldown_spec(tmp_path, cooldown=cooldown, set=TINY + extra_set)
    assert main(["--spec", str(path), "--dry-run"]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "sweep").exists()


def test_a_real_cooldown_sweep_branches_resumes_and_blocks(tmp_path, capsys):
    """The trunk trains, each branch starts from its checkpoint and ends at its D; the branches of a
    trunk that failed are blocked, not started; a second call skips what is finished."""
    path, spec = _cooldown_spec(tmp_path, ladders={
        "ok": {"recipe": "recipes/dense/tiny.yaml"},
        "broken": {"recipe": "recipes/dense/tiny.yaml",
                   "set": ["data.source=text", f"data.paths=[{tmp_path / 'missing.txt'}]"]}},
        cooldown={"tokens": [1024, 2048]})
    out = tmp_path / "sweep"
    assert main(["--spec", str(path), "--jobs", "2", "--threads", "1", "--yes"]) == 1
    points = {p["name"]: p for p in json.loads((out / "manifest.json").read_text())["points"]}
    assert {n: (p["role"], p["parent"], p["status"]) for n, p in points.items()} == {
        "ok-stable": ("stable", None, "finished"), "ok-cd1024": ("cooldown", "ok-stable", "finished"),
        "ok-cd2048": ("cooldown", "ok-stable", "finished"), "broken-stable": ("stable", None, "failed"),
        "broken-cd1024": ("cooldown", "broken-stable", "blocked"),
        "broken-cd2048": ("cooldown", "broken-stable", "blocked")}
    assert not (out / "broken-cd1024").exists()
    trunk = json.loads((out / "ok-stable" / "summary.json").read_text())
    assert (trunk["role"], trunk["tokens"]) == ("stable", 6 * 256)  # 4 steps: branch at 3; 8 steps: at 6
    for name, steps, start in (("ok-cd1024", 4, 3), ("ok-cd2048", 8, 6)):
        s = json.loads((out / name / "summary.json").read_text())
        assert (s["status"], s["role"], s["step"], s["tokens"], s["branch_step"]) == \
            ("completed", "cooldown", steps, steps * 256, start)
        assert s["branch_from"] == str(out / "ok-stable" / "checkpoints" / f"step_{start:08d}")
    assert "blocked" in capsys.readouterr().out
    # where it stands: the ok ladder done, its speed measured and used for the broken ladder's left steps
    st = sweep_status(spec, jobs=2)
    ok = [r for r in st["rows"] if r["name"].startswith("ok-")]
    assert (st["points"], st["finished"]) == (6, 3) and sum(r["flops_done"] for r in ok) == st["flops_done"]
    assert st["flops_done"] == pytest.approx(st["flops_total"] / 2)  # the two ladders train the same steps
    assert st["seconds_left"] is None or st["seconds_left"] > 0  # these runs last seconds: mostly start-up
    assert main(["--spec", str(path), "--status", "--jobs", "2"]) == 0
    assert "6 points: 3 finished, 0 diverged, 3 to go" in capsys.readouterr().out

    assert main(["--spec", str(path)]) == 1
    again = {p["name"]: p for p in json.loads((out / "manifest.json").read_text())["points"]}
    assert all(again[n]["elapsed_s"] == points[n]["elapsed_s"] for n in ("ok-stable", "ok-cd1024", "ok-cd2048"))
    assert "3 already done" in capsys.readouterr().out

    changed, _ = _cooldown_spec(tmp_path, "changed.yaml", cooldown={"tokens": [1024, 2048], "shape": "linear"})
    assert main(["--spec", str(changed), "--dry-run"]) == 2
    assert "different settings" in capsys.readouterr().err

    # the finished runs' records go to a slim archive (no checkpoints, no tokenizer) that a new sweep folder restores
    archive = tmp_path / "archive"
    assert main(["--spec", str(path), "--archive", str(archive)]) == 0
    assert "archived 3 finished runs" in capsys.readouterr().out
    kept = {p["name"]: p for p in json.loads((archive / "manifest.json").read_text())["points"]}
    assert {n for n, p in kept.items() if p["status"] == "finished"} == {"ok-stable", "ok-cd1024", "ok-cd2048"}
    assert kept["broken-stable"]["status"] == "not archived" and kept["ok-cd1024"]["run_dir"] == "ok-cd1024"
    assert sorted(f.name for f in archive.iterdir()) == ["manifest.json", "runs.tar.xz"]
    with tarfile.open(archive / "runs.tar.xz") as tf:
        assert {m.split("/")[1] for m in tf.getnames() if m.startswith("ok-stable/")} == {
            "run.json", "recipe.yaml", "summary.json", "metrics.jsonl", "env.json"}
    fresh = tmp_path / "fresh"
    assert main(["--spec", str(path), "--out", str(fresh), "--restore", str(archive), "--status"]) == 0
    out_text = capsys.readouterr().out
    assert "restored 3 finished runs" in out_text and "6 points: 3 finished, 0 diverged, 3 to go" in out_text
    restored = {p["name"]: p for p in json.loads((fresh / "manifest.json").read_text())["points"]}
    assert restored["ok-cd2048"]["elapsed_s"] == points["ok-cd2048"]["elapsed_s"]
    assert restored["ok-cd2048"]["run_dir"] == str(fresh / "ok-cd2048")
    # a spec narrowed to part of the archived one (the ok ladder alone) restores its own points only
    narrowed, _ = _cooldown_spec(tmp_path, "narrowed.yaml", cooldown={"tokens": [1024, 2048]})
    assert main(["--spec", str(narrowed), "--out", str(tmp_path / "part"), "--restore", str(archive),
                 "--status"]) == 0
    assert "3 points: 3 finished, 0 diverged, 0 to go" in capsys.readouterr().out
    stranger, _ = _cooldown_spec(tmp_path, "stranger.yaml", ladders={"new": {"recipe": "recipes/dense/tiny.yaml"}},
                                 cooldown={"tokens": [1024, 2048]})
    assert main(["--spec", str(stranger), "--out", str(tmp_path / "other"), "--restore", str(archive)]) == 2
    assert "holds none of the points this spec plans (it holds broken-cd1024" in capsys.readouterr().err
    linear, _ = _cooldown_spec(tmp_path, "linear.yaml", ladders=spec["ladders"],
                               cooldown={"tokens": [1024, 2048], "shape": "linear"})
    assert main(["--spec", str(linear), "--out", str(tmp_path / "other"), "--restore", str(archive)]) == 2
    assert "ok-stable was archived with other settings" in capsys.readouterr().err

    # the ok ladder's runs measured its speed (recorded as 10 s + 1 s a step: runs this short time mostly their
    # start-up): the broken trunk left would not end within 4 ms, so nothing starts
    manifest = json.loads((out / "manifest.json").read_text())
    for q in manifest["points"]:
        if q["name"].startswith("ok-"):
            q["elapsed_s"] = 10.0 + q["max_steps"] - q["cooldown"].get("branch_step", 0)
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert main(["--spec", str(path), "--hours", "1e-6"]) == 1
    assert "the 3 runs left would not end within --hours 1e-06" in capsys.readouterr().out
    assert json.loads((out / "manifest.json").read_text())["points"][3]["status"] == "pending"


def test_archive_keeps_a_trunk_only_with_all_its_branches():
    """Without its checkpoints a restored trunk could not start a branch still to train: it waits for them."""
    points = [{"name": "t"}, {"name": "t-cd1", "parent": "t"}, {"name": "t-cd2", "parent": "t"}, {"name": "full"}]
    assert _archivable(points, {"t", "t-cd1", "full"}) == ["t-cd1", "full"]
    assert _archivable(points, {"t", "t-cd1", "t-cd2"}) == ["t", "t-cd1", "t-cd2"]
