"""tools.sweep.schedule: commands, real resumable sweeps (with cooldown branches, status, archive and
restore end to end) and --hours."""

from __future__ import annotations

import json
import tarfile

import pytest

from tests.tools.sweep.helpers import TINY, write_cooldown_spec
from tools.sweep.cli import main
from tools.sweep.plan import build_points, plan_point
from tools.sweep.schedule import _fits, _schedule, command
from tools.sweep.status import RunTimes, sweep_status


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


def test_hours_starts_a_trunk_only_if_it_and_its_branches_end_in_time(tmp_path, capsys):
    import time

    _, spec = write_cooldown_spec(tmp_path)
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
    path, _ = write_cooldown_spec(tmp_path, "h.yaml")
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


def test_a_real_cooldown_sweep_branches_resumes_and_blocks(tmp_path, capsys):
    """The trunk trains, each branch starts from its checkpoint and ends at its D; the branches of a
    trunk that failed are blocked, not started; a second call skips what is finished."""
    path, spec = write_cooldown_spec(tmp_path, ladders={
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

    changed, _ = write_cooldown_spec(tmp_path, "changed.yaml", cooldown={"tokens": [1024, 2048], "shape": "linear"})
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
    narrowed, _ = write_cooldown_spec(tmp_path, "narrowed.yaml", cooldown={"tokens": [1024, 2048]})
    assert main(["--spec", str(narrowed), "--out", str(tmp_path / "part"), "--restore", str(archive),
                 "--status"]) == 0
    assert "3 points: 3 finished, 0 diverged, 0 to go" in capsys.readouterr().out
    stranger, _ = write_cooldown_spec(tmp_path, "stranger.yaml", ladders={"new": {"recipe": "recipes/dense/tiny.yaml"}},
                                 cooldown={"tokens": [1024, 2048]})
    assert main(["--spec", str(stranger), "--out", str(tmp_path / "other"), "--restore", str(archive)]) == 2
    assert "holds none of the points this spec plans (it holds broken-cd1024" in capsys.readouterr().err
    linear, _ = write_cooldown_spec(tmp_path, "linear.yaml", ladders=spec["ladders"],
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
