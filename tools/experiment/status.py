"""``python -m tools.experiment status SPEC``: where an experiment stands, from its runs folder, training
nothing. One line per stage folder (tuning, seeded runs, a sequential design's looks, the compute curve):
its runs finished, diverged and to go (started ones among them, and which failed last time), the SLURM
jobs still to finish with the scheduler's state, and whether the report's record is written."""

from __future__ import annotations

from pathlib import Path

from tools import launch, sweep

LABELS = {"tune": "tuning", "sweep": "seeded runs", "ceg": "compute curve"}
ORDER = {"tune": 0, "ceg": 2}  # tuning first, the seeded sweeps (and their looks) next, the compute curve last


def stage_folders(out: Path) -> list[Path]:
    """The folders under ``out`` that hold a sweep manifest, in the order the experiment trains them."""
    found = [p for p in out.iterdir() if (p / sweep.MANIFEST).is_file()] if out.is_dir() else []
    return sorted(found, key=lambda p: (ORDER.get(p.name, 1), p.name))


def stage_status(folder: Path) -> dict:
    """Counts of one stage's runs by what their run folders say (``tools.sweep.run_dir_state``), the points whose
    last launch failed, and the scheduler's state of its SLURM jobs still to finish."""
    points = (sweep.read_manifest(folder) or {}).get("points", [])
    rows = []
    for q in points:
        state = sweep.run_dir_state(q["run_dir"])
        job = dict(q.get("job") or {})
        if job and state not in ("finished", "diverged"):
            job["state"] = launch.recorded_state(job)
        rows.append({"name": q["name"], "state": state, "last": q.get("status"), "job": job})
    count = {s: sum(r["state"] == s for r in rows) for s in ("finished", "diverged", "started", "new")}
    return {"folder": str(folder), "label": LABELS.get(folder.name, folder.name.replace("sweep-", "seeded runs, ")),
            "points": len(rows), **count,
            "failed": [r["name"] for r in rows if r["last"] == "failed" and r["state"] not in ("finished", "diverged")],
            "jobs": [r for r in rows if r["job"].get("state")]}


def status_text(out: Path, record: str) -> str:
    """The status lines of the experiment whose runs folder is ``out``."""
    stages = [stage_status(f) for f in stage_folders(out)]
    if not stages:
        return f"experiment {out}: nothing trained yet (no stage folder with a sweep manifest)"
    lines = [f"experiment {out}:"]
    for s in stages:
        to_go = s["points"] - s["finished"] - s["diverged"]
        line = (f"- {s['label']} ({Path(s['folder']).name}/): {s['points']} runs: {s['finished']} finished, "
                f"{s['diverged']} diverged, {to_go} to go ({s['started']} of them started)")
        if s["failed"]:
            line += f"; failed at their last launch: {', '.join(s['failed'])} (see {Path(s['folder']).name}/logs/)"
        lines.append(line)
        if s["jobs"]:
            lines.append("  SLURM jobs still to finish: "
                         + ", ".join(f"{r['name']} {r['job'].get('id')} {r['job']['state']}" for r in s["jobs"]))
    done = (out / record).is_file()
    lines.append(f"record {out / record}: " + ("written (python -m tools.experiment report SPEC writes the report)"
                                               if done else "not yet (written when every stage has finished)"))
    return "\n".join(lines)
