"""tools.experiment.registration: the spec hash is stable across key order and blind to the words; a decision-relevant
change after the seeded runs began is refused (naming the keys) unless --amend records it; every run the record lists
carries the hash it ran under; the report prints the registration, the amendment, or that the runs predate it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from analysis.experiment_report import NOT_REGISTERED, registration_text
from archlab.config import RecipeError
from tools.experiment import cli, registration
from tools.experiment.load import load_spec
from tools.experiment.run import RECORD, write_record

SPEC = Path("experiments/attention-kv.yaml")


def spec_file(tmp_path: Path, name: str, change=None, reverse: bool = False) -> Path:
    """attention-kv's spec with its runs under ``tmp_path/out``, ``change`` applied to its mapping, keys reversed."""
    d = OmegaConf.to_container(OmegaConf.load(SPEC))
    d["out"] = str(tmp_path / "out")
    if change:
        change(d)
    if reverse:
        d = dict(reversed(list(d.items())))
        d["arms"] = [dict(reversed(list(a.items()))) for a in d["arms"]]
    path = tmp_path / name
    OmegaConf.save(OmegaConf.create(d), path)
    return path


def load(path: Path):
    return load_spec(str(path))


def start_seeded_run(spec) -> Path:
    """A seeded run folder that has begun (its summary written), as the seeded sweep leaves one."""
    run_dir = Path(spec.out) / "sweep" / "mha-seed0-flop4.2e12"
    run_dir.mkdir(parents=True)
    (run_dir / "summary.json").write_text(json.dumps({"status": "finished"}))
    return run_dir


def margin(d):
    d["margin"] = {"ceg": [0.8, 1.25]}


def test_the_hash_is_stable_across_key_order_and_blind_to_the_words(tmp_path):
    base = registration.spec_hash(registration.decision_part(load(spec_file(tmp_path, "a.yaml"))))
    reordered = load(spec_file(tmp_path, "b.yaml", reverse=True))
    assert registration.spec_hash(registration.decision_part(reordered)) == base

    def words(d):
        d.update(description="Another description.", title="Another title", claim="Another claim.")
        d["arms"][1]["label"] = "another label"
    worded = load(spec_file(tmp_path, "c.yaml", words))
    assert registration.spec_hash(registration.decision_part(worded)) == base
    changed = load(spec_file(tmp_path, "d.yaml", margin))
    assert registration.spec_hash(registration.decision_part(changed)) != base
    assert registration.changed_keys(registration.decision_part(load(spec_file(tmp_path, "a.yaml"))),
                                     registration.decision_part(changed)) == ["margin.ceg"]


def test_a_set_on_the_command_line_is_not_part_of_the_design(tmp_path):
    """`--set data.cache_dir=...` says where and how the runs are made, so `report` without it sees no change."""
    path = spec_file(tmp_path, "a.yaml")
    base = registration.spec_hash(registration.decision_part(load(path)))
    with_set = load_spec(str(path), extra_set=["data.cache_dir=/elsewhere"])
    assert "data.cache_dir=/elsewhere" in with_set.set
    assert registration.spec_hash(registration.decision_part(with_set)) == base


def test_a_changed_margin_after_the_seeded_runs_began_is_refused(tmp_path, capsys):
    spec = load(spec_file(tmp_path, "a.yaml"))
    reg = registration.register(spec, log=lambda *_: None)
    assert reg["first_hash"] == reg["spec_hash"] and reg["chain"] == []
    assert registration.register(spec, log=lambda *_: None) == reg  # the same spec again: nothing changes
    start_seeded_run(spec)
    changed = load(spec_file(tmp_path, "a.yaml", margin))
    with pytest.raises(RecipeError, match=r"changed after its seeded runs began \(changed: margin.ceg;.*--amend"):
        registration.register(changed, log=lambda *_: None)
    assert registration.read(Path(spec.out))["spec_hash"] == reg["spec_hash"]  # nothing recorded
    # the command line refuses it before training anything, with the same one-line message
    assert cli.main(["run", str(tmp_path / "a.yaml")]) == 2
    assert "margin.ceg" in capsys.readouterr().err


def test_amend_is_recorded_and_the_report_prints_it(tmp_path):
    spec = load(spec_file(tmp_path, "a.yaml"))
    first = registration.register(spec, log=lambda *_: None)
    run_dir = start_seeded_run(spec)
    runs = [{"arm": "mha", "seed": 0, "cell": {}, "role": "seeded", "point": run_dir.name, "run_dir": str(run_dir)}]
    write_record(spec, [], runs, {})
    record = json.loads((Path(spec.out) / RECORD).read_text())
    assert record["runs"][0]["spec_hash"] == first["spec_hash"]
    assert record["runs"][0]["stated_at"] == first["stated_at"]
    assert f"pre-registered: {first['spec_hash']}, first run {first['stated_at']}" in registration_text(record)
    assert "Every one of the 1 runs of the record carries it." in registration_text(record)

    changed = load(spec_file(tmp_path, "a.yaml", margin))
    reg = registration.register(changed, amend="the margin of the published claim", log=lambda *_: None)
    assert reg["spec_hash"] != first["spec_hash"] and reg["first_hash"] == first["spec_hash"]
    assert reg["chain"] == [{"old": first["spec_hash"], "new": reg["spec_hash"], "changed": ["margin.ceg"],
                             "reason": "the margin of the published claim", "at": reg["chain"][0]["at"],
                             "after_seeded_runs": True}]
    later = Path(spec.out) / "sweep" / "mha-seed1-flop4.2e12"  # a run trained after the amendment
    later.mkdir()
    (later / "summary.json").write_text(json.dumps({"status": "finished"}))
    write_record(changed, [], [*runs, {**runs[0], "seed": 1, "point": later.name, "run_dir": str(later)}], {})
    record = json.loads((Path(spec.out) / RECORD).read_text())
    assert [r["spec_hash"] for r in record["runs"]] == [first["spec_hash"], reg["spec_hash"]]  # each its own
    text = registration_text(record)
    assert f"pre-registered: {first['spec_hash']}" in text
    assert f"1 under {first['spec_hash']}; 1 under {reg['spec_hash']}" in text
    assert (f"-> {reg['spec_hash']}, changed margin.ceg: the margin of the published claim" in text
            and "after the seeded runs began" in text)


def test_a_change_before_the_seeded_runs_needs_no_amend(tmp_path):
    spec = load(spec_file(tmp_path, "a.yaml"))
    registration.register(spec, log=lambda *_: None)
    reg = registration.register(load(spec_file(tmp_path, "a.yaml", margin)), log=lambda *_: None)
    assert reg["chain"][0]["reason"] == "changed before the seeded runs began"
    assert reg["chain"][0]["after_seeded_runs"] is False


def test_a_record_without_a_registration_says_so():
    assert registration_text({"runs": [{"point": "a", "run_dir": "x"}]}) == f"Pre-registration: {NOT_REGISTERED}."
    assert NOT_REGISTERED == "not pre-registered in the records (runs predate spec hashing)"


def test_the_plan_line_and_drift(tmp_path):
    spec = load(spec_file(tmp_path, "a.yaml"))
    assert "registered when `run` first trains" in registration.plan_line(spec)
    registration.register(spec, log=lambda *_: None)
    start_seeded_run(spec)
    changed = dataclasses.replace(load(spec_file(tmp_path, "b.yaml", margin)), out=spec.out)
    assert "in margin.ceg (seeded runs began: `run` needs --amend" in registration.plan_line(changed)
    assert registration.drift(changed, {"registration": registration.read(Path(spec.out))}) == ["margin.ceg"]


def test_runs_that_predate_the_first_registration_are_not_stamped(tmp_path):
    """A runs folder trained before spec hashing, registered now: its runs keep no hash and the report says why."""
    spec = load(spec_file(tmp_path, "a.yaml"))
    old = start_seeded_run(spec)
    reg = registration.register(spec, log=lambda *_: None)
    assert reg["predating"] == [str(old)]
    write_record(spec, [], [{"arm": "mha", "seed": 0, "cell": {}, "role": "seeded", "point": old.name,
                             "run_dir": str(old)}], {})
    record = json.loads((Path(spec.out) / RECORD).read_text())
    assert "spec_hash" not in record["runs"][0]
    assert "1 without a spec hash (1 of them started before the spec was first registered)" in registration_text(record)
