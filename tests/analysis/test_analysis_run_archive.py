"""analysis.run_archive: which lines of a run's records the slim archive keeps, and bytes that depend only on the
runs."""

from __future__ import annotations

import json

from analysis.run_archive import ARCHIVE, archived_run, read_archive, slim_metrics, slim_routing, write_archive


def _lines(rows):
    return "".join(json.dumps(r) + "\n" for r in rows)


def test_metrics_keep_evaluation_rows_and_what_the_health_check_reads():
    rows = [{"kind": "train", "step": 1, "tokens": 10, "loss": 7.0},
            {"kind": "train", "step": 2, "tokens": 20, "loss": 6.0},
            {"kind": "val", "step": 2, "tokens": 20, "loss": 6.5},
            {"kind": "train", "step": 3, "tokens": 30, "loss": None},  # a diverged step
            {"kind": "train", "step": 4, "tokens": 40, "loss": 5.0},
            {"kind": "train", "step": 5, "loss": 4.0},  # no token count
            {"kind": "val", "step": 5, "tokens": 50, "loss": 5.5}]
    text = _lines(rows) + '{"kind": "train", "st'  # a torn last line
    kept = [json.loads(line) for line in slim_metrics(text).splitlines()]
    assert [(r["kind"], r["step"]) for r in kept] == [("train", 1), ("val", 2), ("train", 3), ("train", 4),
                                                       ("val", 5)]
    assert slim_metrics(slim_metrics(text)) == slim_metrics(text)  # slimming twice changes nothing


def test_routing_keeps_the_row_in_force_at_each_evaluation_and_the_last():
    text = _lines([{"step": s, "moe/maxvio": s / 10} for s in (10, 20, 30, 40, 50)])
    assert [json.loads(line)["step"] for line in slim_routing(text, [25, 40]).splitlines()] == [20, 40, 50]
    assert slim_routing("", [5]) == ""


def test_an_archive_reads_back_and_its_bytes_depend_only_on_the_runs(tmp_path):
    runs = {"b": {"run.json": "{}", "summary.json": '{"status": "completed"}'}, "a": {"recipe.yaml": "x: 1\n"}}
    write_archive(tmp_path / "one", runs)
    write_archive(tmp_path / "two", dict(reversed(list(runs.items()))))
    assert (tmp_path / "one" / ARCHIVE).read_bytes() == (tmp_path / "two" / ARCHIVE).read_bytes()
    assert read_archive(tmp_path / "one") == runs and read_archive(tmp_path / "none") == {}
    assert archived_run(tmp_path / "one" / "a") == runs["a"] and archived_run(tmp_path / "one" / "c") is None
    write_archive(tmp_path / "one", {**runs, "c": {"run.json": "{}"}})  # rewritten: read afresh
    assert archived_run(tmp_path / "one" / "c") == {"run.json": "{}"}
