"""The measurements of an experiment that need more than its run folders, run after training
(``python -m tools.experiment run|report``), each result cached as one JSON file under
``<out>/measurements/<measurement>/`` together with the settings it was computed with (changed
settings recompute it):

- ``extrapolation``: every finished run of the listed arms evaluated at each multiple of its
  training context (``analysis.extrapolation``), once as trained and once per evaluation-time
  variant of its arm (e.g. RoPE + YaRN: overrides of the model config at evaluation only);
- ``init_grad_norms``: per-layer gradient norms at initialisation (``analysis.init_gradients``)
  of each listed arm at each depth and seed; nothing is trained;
- ``throughput``: the training step of every arm timed side by side, interleaved in rounds
  (``analysis.throughput``), so that the arms' tokens/s compare under the same machine load.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from archlab.io import write_json_atomic


def _cached(path: Path, settings: dict, compute: Callable[[], dict]) -> dict:
    """The result stored at ``path`` if it was computed with ``settings``, else compute and store it."""
    if path.is_file():
        try:
            stored = json.loads(path.read_text())
            if stored.get("settings") == settings:
                return stored["result"]
        except ValueError:
            pass
    result = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"settings": settings, "result": result}, sort_keys=False)
    return result


def _finished(run: dict) -> bool:
    path = Path(run["run_dir"]) / "summary.json"
    try:
        return json.loads(path.read_text()).get("status") == "completed"
    except (OSError, ValueError):
        return False


def extrapolation_jobs(record: dict) -> list[dict]:
    """(arm, variant, overrides) of every evaluation: each listed arm as trained, then the variants."""
    m = record["spec"]["measurements"]["extrapolation"] or {}
    arm_names = [a["name"] for a in record["arms"]]
    listed = m.get("arms") or arm_names
    jobs = [{"arm": a, "variant": a, "label": next(x["label"] for x in record["arms"] if x["name"] == a),
             "overrides": []} for a in listed]
    for name, v in (m.get("variants") or {}).items():
        if v.get("arm") not in arm_names:
            raise ValueError(f"measurements.extrapolation.variants.{name}.arm={v.get('arm')!r}: not an arm "
                             f"(arms: {', '.join(arm_names)})")
        jobs.append({"arm": v["arm"], "variant": name, "label": v.get("label", name),
                     "overrides": list(v.get("set", []))})
    return jobs


def run_extrapolation(record: dict, log=print) -> list[dict]:
    from analysis.extrapolation import evaluate_lengths

    m = record["spec"]["measurements"]["extrapolation"] or {}
    multipliers = [int(x) for x in m.get("multipliers", [1, 2, 4, 8])]
    tokens = int(m.get("tokens", 32768))
    folder = Path(record["spec"]["out"]) / "measurements" / "extrapolation"
    out = []
    for job in extrapolation_jobs(record):
        for run in (r for r in record["runs"] if r["arm"] == job["arm"] and _finished(r)):
            settings = {"multipliers": multipliers, "tokens": tokens, "overrides": job["overrides"],
                        "run_dir": run["run_dir"]}
            path = folder / f"{run['point']}--{job['variant']}.json"
            if not path.is_file():
                log(f"extrapolation: {job['variant']} on {run['point']}")
            result = _cached(path, settings, lambda: evaluate_lengths(run["run_dir"], multipliers, tokens,
                                                                      job["overrides"]))
            out.append({**job, "seed": run["seed"], "cell": run["cell"], "point": run["point"], "result": result})
    return out


def run_init_grad_norms(record: dict, log=print) -> list[dict]:
    from analysis.init_gradients import init_grad_norms

    m = record["spec"]["measurements"]["init_grad_norms"] or {}
    arms = {a["name"]: a for a in record["arms"]}
    listed = m.get("arms") or list(arms)
    depths = [int(d) for d in m.get("depths", [2, 4, 8])]
    batches = int(m.get("batches", 2))
    seeds = m.get("seeds") or record["spec"]["seeds"]
    folder = Path(record["spec"]["out"]) / "measurements" / "init_grad_norms"
    out = []
    for name in listed:
        if name not in arms:
            raise ValueError(f"measurements.init_grad_norms.arms: {name!r} is not an arm (arms: {', '.join(arms)})")
        arm = arms[name]
        for depth in depths:
            for seed in seeds:
                overrides = [*arm["overrides"], f"model.n_layers={depth}"]
                settings = {"recipe": arm["recipe"], "overrides": overrides, "seed": seed, "batches": batches}
                path = folder / f"{name}-d{depth}-seed{seed}.json"
                if not path.is_file():
                    log(f"init_grad_norms: {name}, {depth} layers, seed {seed}")
                result = _cached(path, settings, lambda: init_grad_norms(arm["recipe"], overrides, seed, batches))
                out.append({"arm": name, "depth": depth, "seed": seed, "result": result})
    return out


def run_throughput(record: dict, log=print) -> dict:
    """{arm: {"tokens_per_s", "rounds", ...}} of the interleaved benchmark; arms that train the same
    model (the same recipe and overrides, e.g. a time-matched copy) are timed once."""
    from analysis.throughput import benchmark

    m = record["spec"]["measurements"].get("throughput") or {}
    steps, rounds = int(m.get("steps", 10)), int(m.get("rounds", 5))
    threads = record.get("threads")
    models: dict[str, tuple[str, list]] = {}  # first arm of each distinct model -> (recipe, overrides)
    same_as: dict[str, str] = {}
    for a in record["arms"]:
        first = next((n for n, spec in models.items() if spec == (a["recipe"], a["overrides"])), None)
        if first is None:
            models[a["name"]] = (a["recipe"], a["overrides"])
        same_as[a["name"]] = first or a["name"]
    settings = {"steps": steps, "rounds": rounds, "threads": threads,
                "arms": {n: list(spec) for n, spec in models.items()}}
    path = Path(record["spec"]["out"]) / "measurements" / "throughput.json"
    if not path.is_file():
        log(f"throughput: {len(models)} models, {rounds} interleaved rounds of {steps} steps")
    timed = _cached(path, settings, lambda: benchmark(models, steps=steps, rounds=rounds, threads=threads))
    return {name: {**timed[first], "timed_as": first} for name, first in same_as.items()}


RUNNERS = {"extrapolation": run_extrapolation, "init_grad_norms": run_init_grad_norms, "throughput": run_throughput}


def run_all(record: dict, log=print) -> dict:
    """{measurement name: results} for the spec's measurements that have a runner here."""
    wanted = record["spec"].get("measurements") or {}
    return {name: fn(record, log=log) for name, fn in RUNNERS.items() if name in wanted}
