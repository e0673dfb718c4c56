"""tools.sweep --archive / --restore on a small synthetic sweep (run folders written here, nothing trained): the
slim archive, the runs restored from it and the original runs give the analysis the same numbers."""

from __future__ import annotations

import json
import math
import shutil
import tarfile
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from analysis.run_archive import ARCHIVE
from analysis.runs import expand_inputs
from analysis.scaling.read import collect
from archlab.config import load_recipe
from tests.tools.sweep.helpers import TINY
from tools.sweep.archive import archivable
from tools.sweep.cli import main
from tools.sweep.manifest import write_manifest
from tools.sweep.plan import build_points, plan_point


def _spec(tmp_path):
    spec = {"out": str(tmp_path / "sweep"), "set": TINY,
            "ladders": {"dense": {"recipe": "recipes/dense/tiny.yaml"}, "moe": {"recipe": "recipes/mixtral/tiny.yaml"}},
            "tokens": [3000], "cooldown": {"tokens": [2048, 4096]}}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return path, spec


def _fake_run(p, diverge: bool = False) -> None:
    """A run folder as archlab.train leaves it: records, a checkpoint and a tokenizer (which the archive drops)."""
    d = Path(p.run_dir)
    (d / "checkpoints" / "step_00000004").mkdir(parents=True)
    (d / "checkpoints" / "step_00000004" / "model.bin").write_bytes(b"\0" * 64)
    (d / "tokenizer.json").write_text("{}")
    (d / "run.json").write_text(json.dumps({"archlab_run": 1, "name": p.name, "created": 1.5}))
    OmegaConf.save(load_recipe(p.recipe, p.overrides + p.extra["launch_overrides"]), d / "recipe.yaml")
    (d / "env.json").write_text(json.dumps({"python": "3.x", "torch": "2.x"}))
    rng = np.random.default_rng(len(p.name))
    rows, routing = [], []
    for step in range(1, p.max_steps + 1):
        loss = 6.0 - 2.0 * math.log1p(step) / math.log1p(p.max_steps) + 0.01 * rng.standard_normal()
        if diverge and step > p.max_steps - 3:
            loss = None if step == p.max_steps else math.nan
        rows.append({"kind": "train", "step": step, "tokens": step * p.tokens_per_step, "loss": loss,
                     "lr": 1e-3, "grad_norm": float(rng.random())})
        if step % 3 == 0 or step == p.max_steps:
            rows.append({"kind": "val", "step": step, "tokens": step * p.tokens_per_step, "context_len": 32,
                         "context_multiplier": 1, "loss": 4.5 - 0.1 * step / p.max_steps, "ppl": 90.0})
        if p.ladder == "moe" and step % 2 == 0:
            routing.append({"step": step, "tokens": step * p.tokens_per_step,
                            "moe/layer0/tokens_per_expert": rng.integers(0, 99, 4).tolist(), "moe/maxvio": 0.1})
    text = "".join(json.dumps(r) + "\n" for r in rows) + '{"kind": "train", "step": 99, "lo'  # a torn last line
    (d / "metrics.jsonl").write_text(text)
    if routing:
        (d / "routing.jsonl").write_text("".join(json.dumps(r) + "\n" for r in routing))
    summary = {"status": "nonfinite" if diverge else "completed", "role": p.role, "step": p.max_steps,
               "tokens": p.max_steps * p.tokens_per_step, "unigram_entropy_train": 5.5,
               "final_val_loss": {"32": 4.5 - 0.1 + 0.001 * len(p.name)}, "message": "loss is nan" if diverge else ""}
    if p.cooldown.get("branch_from"):
        summary.update(branch_from=p.cooldown["branch_from"], branch_step=p.cooldown["branch_step"])
    (d / "summary.json").write_text(json.dumps(summary, indent=2))


def _numbers(inputs):
    """What the scaling analysis reads of the runs: its points, exclusions (by run name) and validation curves,
    and each run's health, final loss, tokens and rows."""
    runs, problems = expand_inputs(inputs)
    points, excluded, curves = collect(runs)
    return ({r.name: (r.status, r.reason, r.final_val_loss, r.tokens_seen, r.val_rows, r.summary,
                      OmegaConf.to_container(r.recipe), r.params, r.flops_per_token, r.train_rows[:1])
             for r in runs},
            [{**p.__dict__, "units": [Path(u).name for u in p.units]} for p in points],
            [{**e, "run": Path(e["run"]).name} for e in excluded],
            {fam: [(n, t.tolist(), c.tolist(), v.tolist()) for n, t, c, v in cs] for fam, cs in curves.items()},
            [why for _, why in problems])


def test_archive_restore_and_the_analysis_read_the_same_numbers(tmp_path, capsys):
    path, spec = _spec(tmp_path)
    points = {p.name: p for p in (plan_point(q, tmp_path / "sweep", 1, 8) for q in build_points(spec))}
    assert sorted(points) == ["dense-cd2048", "dense-cd4096", "dense-stable", "dense-tok3000",
                              "moe-cd2048", "moe-cd4096", "moe-stable", "moe-tok3000"]
    for name, p in points.items():
        if name != "dense-tok3000":  # not trained: not archived
            _fake_run(p, diverge=name == "moe-cd4096")
            p.status, p.elapsed_s = ("diverged" if name == "moe-cd4096" else "finished"), 2.5
    write_manifest(tmp_path / "sweep", spec, list(points.values()))
    archive = tmp_path / "archive"
    assert main(["--spec", str(path), "--archive", str(archive)]) == 0
    assert "archived 7 finished runs" in capsys.readouterr().out
    assert sorted(f.name for f in archive.iterdir()) == ["manifest.json", ARCHIVE]
    with tarfile.open(archive / ARCHIVE) as tf:
        members = tf.getnames()
        routing = tf.extractfile("moe-stable/routing.jsonl").read().decode().splitlines()
        metrics = [json.loads(line) for line in tf.extractfile("dense-cd4096/metrics.jsonl").read().splitlines()]
    assert {m.split("/")[1] for m in members if m.startswith("dense-")} == \
        {"run.json", "recipe.yaml", "summary.json", "env.json", "metrics.jsonl"}  # no checkpoints, no tokenizer
    assert "moe-cd4096/routing.jsonl" in members
    train = [r for r in metrics if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, points["dense-cd4096"].max_steps]  # the first and the last
    assert len(routing) < sum(1 for _ in open(points["moe-stable"].run_dir + "/routing.jsonl"))
    kept = {q["name"]: q["status"] for q in json.loads((archive / "manifest.json").read_text())["points"]}
    assert kept["moe-cd4096"] == "diverged" and kept["dense-tok3000"] == "not archived"

    original = _numbers([str(tmp_path / "sweep")])
    assert original[0]["moe-cd4096"][0] == "diverged" and len(original[1]) == 4  # three branches, one full run
    assert _numbers([str(archive)]) == original  # the analysis reads the archive in place
    glob_runs = _numbers([str(archive / "dense-*")])[0]
    assert sorted(glob_runs) == ["dense-cd2048", "dense-cd4096", "dense-stable"]
    assert all(glob_runs[n] == original[0][n] for n in glob_runs)

    fresh = tmp_path / "fresh"
    assert main(["--spec", str(path), "--out", str(fresh), "--restore", str(archive), "--status"]) == 0
    assert "restored 7 finished runs" in capsys.readouterr().out
    assert _numbers([str(fresh)]) == original
    assert not (fresh / "dense-stable" / "checkpoints").exists()

    # an archive of an earlier archlab (plain run folders) restores, and the next --archive packs it
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    shutil.copy(archive / "manifest.json", legacy)
    for name in kept:
        if (fresh / name).is_dir():
            shutil.copytree(fresh / name, legacy / name)
    assert _numbers([str(legacy)]) == original
    assert main(["--spec", str(path), "--out", str(tmp_path / "again"), "--restore", str(legacy), "--status"]) == 0
    assert _numbers([str(tmp_path / "again")]) == original
    assert main(["--spec", str(path), "--archive", str(legacy)]) == 0
    assert sorted(f.name for f in legacy.iterdir()) == ["manifest.json", ARCHIVE]
    assert (legacy / ARCHIVE).read_bytes() == (archive / ARCHIVE).read_bytes()  # the same runs, the same bytes


def test_archive_keeps_a_trunk_only_with_all_its_branches():
    """Without its checkpoints a restored trunk could not start a branch still to train: it waits for them."""
    points = [{"name": "t"}, {"name": "t-cd1", "parent": "t"}, {"name": "t-cd2", "parent": "t"}, {"name": "full"}]
    assert archivable(points, {"t", "t-cd1", "full"}) == ["t-cd1", "full"]
    assert archivable(points, {"t", "t-cd1", "t-cd2"}) == ["t", "t-cd1", "t-cd2"]
