"""Pre-registration in the records: the hash of a spec's decision-relevant part, stated when its first stage
trains and carried by every run it trains, so that a report can show the design (arms, seed rule, margin, verdict
family, grids, budgets, tuning, measurements) was fixed before the seeded runs, and any later change to it.

``<out>/registration.json`` holds the hash in force, when it was first stated, the decision-relevant part it
hashes (so that a change names its keys) and the chain of changes (old hash, new hash, the keys that changed, the
reason, the time). ``run`` registers before it trains (:func:`register`): the first time it writes the file; a
spec whose decision-relevant part changed after its seeded runs began is refused unless ``--amend "REASON"``
records the change; before the seeded runs began, a change is recorded without one (nothing has been measured
against the design yet). Every run the record lists carries ``spec_hash`` and ``stated_at`` of the registration in
force when the record first listed it with a run folder (:func:`stamp`); the report checks they agree.

Not decision-relevant, so not hashed: the words (title, description, claim, notes; the arms' labels and notes),
where things are written (out, report, the spec's path), what ``--quick`` says of its own defaults, and ``--set``
overrides given on the command line (machine settings such as ``data.cache_dir``).
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Optional

from analysis.experiment_spec import WORDS, Spec
from archlab.config import RecipeError
from archlab.io import write_json_atomic
from tools.sweep.manifest import run_dir_state

FILE = "registration.json"
NOT_HASHED = (*WORDS, "out", "report", "spec_path", "quick_defaults", "extra_set")
ARM_WORDS = ("label", "note")
HASH_CHARS = 16


def decision_part(spec: Spec) -> dict:
    """The spec as the record keeps it, less what describes the runs or where they are written (module)."""
    d = {k: v for k, v in spec.to_dict().items() if k not in NOT_HASHED}
    extra = list(getattr(spec, "extra_set", None) or [])  # `--set` of the command line: where and how, not what
    if extra and list(d.get("set") or [])[-len(extra):] == extra:
        d["set"] = list(d["set"])[:-len(extra)]
    d["arms"] = [{k: v for k, v in a.items() if k not in ARM_WORDS} for a in d["arms"]]
    return d


def spec_hash(decision: dict) -> str:
    """The first 16 hex digits of the SHA-256 of the decision-relevant part as canonical JSON (keys sorted, so the
    YAML's key order does not matter; lists keep their order: the arms' order is the tables' order)."""
    text = json.dumps(decision, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:HASH_CHARS]


def changed_keys(old, new, path: str = "") -> list[str]:
    """The dotted keys whose values differ ('margin.ceg', 'arms[mqa].set', 'seeds'); the arms matched by name."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new)):
            out += changed_keys(old.get(k), new.get(k), f"{path}.{k}" if path else str(k))
        return out
    if path == "arms" and isinstance(old, list) and isinstance(new, list):
        by_old, by_new = {a.get("name"): a for a in old}, {a.get("name"): a for a in new}
        out = [f"arms[{n}]" for n in by_old.keys() ^ by_new.keys()]
        for n in [n for n in by_new if n in by_old]:
            out += changed_keys(by_old[n], by_new[n], f"arms[{n}]")
        if not out and [a.get("name") for a in old] != [a.get("name") for a in new]:
            out.append("arms (order)")
        return out
    return [] if old == new else [path]


def now_utc() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def read(out: Path) -> Optional[dict]:
    path = Path(out) / FILE
    return json.loads(path.read_text()) if path.is_file() else None


def seeded_runs_began(out: Path) -> bool:
    """Whether any seeded run (a folder of ``sweep``, ``sweep-time``, ``sweep-look<k>``) has started."""
    return any(d.is_dir() and d.name != "logs" and run_dir_state(d) != "new" for d in Path(out).glob("sweep*/*"))


def started_runs(out: Path) -> list[str]:
    """The run folders under ``out`` (two or three levels down: ``tune/<run>``, ``finetune/sweep/<run>``) that have
    started: runs a registration written now would postdate."""
    dirs = [*Path(out).glob("*/*"), *Path(out).glob("*/*/*")]
    return sorted(str(d) for d in dirs if any((d / f).is_file() for f in ("run.json", "recipe.yaml", "summary.json")))


def register(spec: Spec, amend: Optional[str] = None, log=print) -> dict:
    """The registration in force for ``spec`` (written to ``<out>/registration.json`` when new or changed); a
    change after the seeded runs began without ``amend`` raises RecipeError naming the keys."""
    out = Path(spec.out)
    decision = decision_part(spec)
    new = spec_hash(decision)
    reg = read(out)
    if reg is None:
        reg = {"kind": "archlab-experiment-registration", "version": 1, "spec_hash": new, "stated_at": now_utc(),
               "first_hash": new, "first_stated_at": None, "decision": decision, "chain": [],
               "predating": started_runs(out)}
        reg["first_stated_at"] = reg["stated_at"]
        log(f"pre-registered: spec hash {new} ({out / FILE})" + (
            f"; {len(reg['predating'])} runs already started are not stamped with it" if reg["predating"] else ""))
    elif reg["spec_hash"] == new:
        if amend:
            log(f"--amend: the spec's decision-relevant part is as registered ({new}); nothing to amend")
        return reg
    else:
        keys = changed_keys(reg["decision"], decision)
        began = seeded_runs_began(out)
        if began and not amend:
            raise RecipeError(
                f"{spec.spec_path}: the spec's decision-relevant part changed after its seeded runs began "
                f"(changed: {', '.join(keys)}; registered {reg['spec_hash']}, now {new}): put the registered values "
                "back, or record the change with --amend \"REASON\" (the report prints it), or start afresh with "
                "another out: folder")
        reason = amend or "changed before the seeded runs began"
        reg["chain"].append({"old": reg["spec_hash"], "new": new, "changed": keys, "reason": reason, "at": now_utc(),
                             "after_seeded_runs": began})
        reg.update(spec_hash=new, stated_at=reg["chain"][-1]["at"], decision=decision)
        log(f"registration amended: {reg['chain'][-1]['old']} -> {new} (changed: {', '.join(keys)}): {reason}")
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / FILE, reg, sort_keys=False)
    return reg


def stamp(record: dict, previous: Optional[dict], reg: Optional[dict]) -> dict:
    """``record`` with every run of its run lists (``runs``, ``tune_runs``, ``ceg_runs``, ...) carrying
    ``spec_hash`` and ``stated_at``: the stamp ``previous`` (the record before this write) gave that run folder,
    else ``reg``'s when the run folder exists (a run not started yet is stamped when it is); and the registration
    itself under ``registration``. Unchanged without ``reg`` (a record written outside ``run``)."""
    if reg is None:
        return record
    before = {r["run_dir"]: r for runs in _run_lists(previous or {}).values() for r in runs if "spec_hash" in r}
    record = dict(record)
    for key, runs in _run_lists(record).items():
        record[key] = [_stamped(r, before.get(r["run_dir"]), reg) for r in runs]
    record["registration"] = {k: v for k, v in reg.items() if k != "decision"}
    return record


def _stamped(run: dict, earlier: Optional[dict], reg: dict) -> dict:
    """A copy of one run record with its stamp: the earlier record's, else the registration's once it started."""
    run = {k: v for k, v in run.items() if k not in ("spec_hash", "stated_at")}
    if earlier is not None:
        return {**run, "spec_hash": earlier["spec_hash"], "stated_at": earlier["stated_at"]}
    if run_dir_state(run["run_dir"]) != "new" and run["run_dir"] not in set(reg.get("predating") or ()):
        return {**run, "spec_hash": reg["spec_hash"], "stated_at": reg["stated_at"]}
    return run


def _run_lists(record: dict) -> dict[str, list[dict]]:
    """The record's lists of run records: every top-level list whose items name a ``point`` and a ``run_dir``."""
    return {k: v for k, v in record.items() if isinstance(v, list) and v and all(
        isinstance(r, dict) and "point" in r and "run_dir" in r for r in v)}


def drift(spec: Spec, record: dict) -> list[str]:
    """The decision-relevant keys in which ``spec`` (the file as it is now) differs from the record's
    registration ([] when it agrees or the record has none)."""
    reg = read(Path(spec.out))
    if reg is None or not record.get("registration") or reg["spec_hash"] == spec_hash(decision_part(spec)):
        return []
    return changed_keys(reg["decision"], decision_part(spec))


def plan_line(spec: Spec) -> str:
    """What ``plan`` says of the registration: the spec's hash, and whether it is the one registered in ``out``."""
    new = spec_hash(decision_part(spec))
    reg = read(Path(spec.out))
    if reg is None:
        return f"spec hash {new} (registered when `run` first trains)"
    if reg["spec_hash"] == new:
        return f"spec hash {new}: as registered {reg['first_stated_at']}" + (
            f" (amended {len(reg['chain'])}x)" if reg["chain"] else "")
    keys = changed_keys(reg["decision"], decision_part(spec))
    return (f"spec hash {new}: differs from the registered {reg['spec_hash']} in {', '.join(keys)}"
            + (" (seeded runs began: `run` needs --amend \"REASON\")" if seeded_runs_began(Path(spec.out)) else ""))
