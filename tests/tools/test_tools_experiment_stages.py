"""tools.experiment.stages: the registry runs each wanted stage in order over one context, the record written
once the training stages are done; a new stage is one object and its registry line (toy stages, nothing trains);
`plan` asks every stage in the same order; the report's CPU-hours (analysis.cpu_hours) count what the runs and the
measurements' caches recorded."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from analysis import cpu_hours
from analysis.measurements.base import cached
from tools.experiment import finish_record, load_spec, plan, read_record, run_experiment
from tools.experiment import stages as registry
from tools.experiment.stages import Context, Stage


@pytest.fixture(autouse=True)
def _in_repo_root(root, monkeypatch):
    monkeypatch.chdir(root)  # specs name recipes relative to the repository root


def _spec(tmp_path: Path):
    path = tmp_path / "spec.yaml"
    path.write_text(json.dumps({"name": "toy", "out": str(tmp_path / "runs"), "budget": {"tokens": 4096},
                                "seeds": [0], "arms": [{"name": "a", "recipe": "recipes/dense/tiny.yaml"}],
                                "tune": {"shared": "toy stages: nothing is trained"}}))
    return load_spec(str(path))


class Toy:
    """A stage that notes when it ran and what the context held then."""

    def __init__(self, name: str, trains: bool = True, wanted: bool = True, seen: list = None):
        self.name, self.trains, self._wanted, self.seen = name, trains, wanted, seen

    def wanted(self, spec) -> bool:
        return self._wanted

    def plan(self, spec, arms, log=print) -> dict[str, list]:
        log(f"== {self.name}")
        self.seen.append(("plan", self.name))
        return {self.name: []}

    def run(self, ctx: Context) -> None:
        self.seen.append((self.name, list(ctx.extra.get("order", [])), ctx.record is not None))
        ctx.extra.setdefault("order", []).append(self.name)
        if not self.trains:
            ctx.measurements[self.name] = ctx.record["order"]


def test_the_registry_holds_every_stage_in_the_order_they_run():
    assert [s.name for s in registry.STAGES] == ["tuning", "seeded runs", "compute curve", "sequential looks",
                                                  "fine-tuning", "measurements"]
    assert all(isinstance(s, Stage) for s in registry.STAGES)
    assert [s.trains for s in registry.STAGES] == [True] * 5 + [False]


def test_a_registered_stage_runs_in_order_over_one_context(tmp_path, monkeypatch):
    seen: list = []
    toys = [Toy("first", seen=seen), Toy("skipped", wanted=False, seen=seen), Toy("second", seen=seen),
            Toy("reads the record", trains=False, seen=seen)]
    monkeypatch.setattr(registry, "STAGES", toys)  # the registry line of each new stage
    spec = _spec(tmp_path)
    ctx = run_experiment(spec, log=lambda *a: None, show_progress=False, command="toy")
    # in order, the unwanted one skipped, each seeing what the earlier ones left; the record before the reader
    assert seen == [("first", [], False), ("second", ["first"], False), ("reads the record", ["first", "second"], True)]
    record = read_record(Path(spec.out))
    assert record["order"] == ["first", "second"] and record["command"] == "toy"
    assert record["registration"]["spec_hash"]  # pre-registration stamps the record as before
    assert ctx.measurements == {"reads the record": ["first", "second"]}
    # `report`: only the stages that read the record run again, nothing trains
    seen.clear()
    again = finish_record(record, spec, log=lambda *a: None)
    assert [s[0] for s in seen] == ["reads the record"] and again.measurements["reads the record"] == ["first",
                                                                                                         "second"]


def test_plan_asks_every_stage_in_order(tmp_path, monkeypatch):
    seen: list = []
    monkeypatch.setattr(registry, "STAGES", [Toy("one", seen=seen), Toy("two", wanted=False, seen=seen)])
    lines: list = []
    out = plan(_spec(tmp_path), log=lines.append, estimate=False)
    assert seen == [("plan", "one"), ("plan", "two")]  # an unwanted stage may still say why it trains nothing
    assert list(out["stages"]) == ["one", "two"] and "== one" in lines and "== two" in lines


# --------------------------------------------------------------------------------------------
# CPU-hours
# --------------------------------------------------------------------------------------------


def _sweep(folder: Path, walls: dict[str, float]) -> list[dict]:
    folder.mkdir(parents=True)
    points = [{"name": n, "run_dir": str(folder / n), "elapsed_s": w} for n, w in walls.items()]
    (folder / "manifest.json").write_text(json.dumps({"points": points}))
    return [{"point": n, "run_dir": str(folder / n)} for n in walls]


def _spin() -> str:
    """0.08 s of process CPU time (the clock ticks in hundredths)."""
    t0 = time.process_time()
    while time.process_time() - t0 < 0.08:
        pass
    return "spun"


def test_cpu_hours_count_every_runs_wall_time_x_threads_and_the_measurements_cpu(tmp_path):
    out = tmp_path / "runs"
    seeded = [{**r, "sweep": "sweep"} for r in _sweep(out / "sweep", {"a-seed0": 3600.0, "b-seed0": 1800.0})]
    tune = [{**r, "sweep": "tune"} for r in _sweep(out / "tune", {"a-lr1": 900.0})]
    ft_tune = [{**r, "sweep": "tune"} for r in _sweep(out / "finetune" / "tune", {"a-lr1": 450.0})]
    curve = [{"point": "gone", "run_dir": str(out / "ceg" / "gone"), "sweep": "ceg"}]  # no time recorded anywhere
    record = {"spec": {"name": "t", "out": str(out)}, "threads": 2, "runs": seeded, "tune_runs": tune,
              "finetune_tune_runs": ft_tune, "ceg_runs": curve}
    meas = out / "measurements"
    assert cached(meas / "x" / "one.json", {"k": 1}, _spin) == "spun"
    stored = json.loads((meas / "x" / "one.json").read_text())
    assert stored["cpu_s"] >= 0.05 and stored["wall_s"] >= 0.05  # the computation's own cost, beside its result
    (meas / "old.json").write_text(json.dumps({"settings": {}, "result": 1}))  # cached before times were kept
    (meas / "probe.json").write_text(json.dumps({"settings": {}, "result": {"cpu_s": 36.0}}))  # the probe's own
    comparison = {"arms": {"b": {"verdict": {"class": "better"}}, "c": {"verdict": {"class": "unresolved"}},
                           "d": {"verdict": {"class": "equivalent within the margin"}}, "a": {}}}
    c = cpu_hours.cpu_hours(record, comparison)
    train_h = 2 * (3600 + 1800 + 900 + 450) / 3600
    assert c["training"] == pytest.approx(train_h) and c["training_runs"] == 5 and c["untimed_runs"] == 1
    assert c["measurements"] == pytest.approx((stored["cpu_s"] + 36.0) / 3600)
    assert (c["measurement_results"], c["untimed_results"]) == (3, 1)
    assert (c["resolved"], c["comparisons"]) == (2, 3)
    assert c["per_resolved"] == pytest.approx((train_h + (stored["cpu_s"] + 36.0) / 3600) / 2)
    text = cpu_hours.text(c)
    assert f"CPU cost: {c['total']:.2f} CPU-hours" in text and "x 2 threads per run" in text
    assert "2 of 3 comparisons resolved" in text and f"{c['per_resolved']:.2f} CPU-hours per resolved" in text
    assert "1 run without a recorded time" in text and "1 of 3 results cached before" in text


def test_cpu_hours_say_when_nothing_is_resolved_and_when_threads_were_not_recorded(tmp_path):
    record = {"spec": {"name": "t", "out": str(tmp_path / "none")}, "runs": []}
    c = cpu_hours.cpu_hours(record, {"arms": {"b": {"verdict": {"class": "unresolved"}}}})
    assert c["per_resolved"] is None and c["total"] == 0
    text = cpu_hours.text(c)
    assert "None of the 1 comparisons is resolved" in text and "threads not recorded" in text
    assert "No comparison was classified" in cpu_hours.text(cpu_hours.cpu_hours(record, None))
