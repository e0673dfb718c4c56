"""Experiments: named arms (a recipe + overrides) x seeds at one budget, trained by ``tools.sweep``,
measured, and reported with intervals.

    python -m tools.experiment run experiments/evolution.yaml              # train, measure, write the report
    python -m tools.experiment run experiments/evolution.yaml --quick      # tiny models, a few steps, one seed
    python -m tools.experiment report experiments/evolution.yaml           # the report again from the runs
    python -m tools.experiment plan experiments/evolution.yaml             # arms, steps and costs; trains nothing
    python -m tools.experiment status experiments/evolution.yaml           # each stage's runs: done, to go, failed

Three stages train. (1) Tuning (``tools.experiment_tuning``, ``<out>/tune/``): each arm's lr is
chosen on its own by a log grid at the full budget, extended until the best lr is interior (or
tuned at the muP base width and transferred, or shared by design, said so). (2) The seeded runs:
every arm at its tuned lr once per seed (and per cell of ``grid``, if any) as one point of a
``tools.sweep`` sweep under ``<out>/sweep/``: resumable (a finished run is skipped, a started one continues from
its checkpoint), one run folder per point, ``manifest.json`` with each run's status, wall time and
peak resident memory. Arms whose budget is a wall-clock time (``match_time_of``) train in a second
sweep, ``<out>/sweep-time/``, once the runs that set their time are done. (3) The compute curve
(``tools.experiment_ceg``, ``<out>/ceg/``): WSD trunks of the reference arm with cooldown branches
from below to above the budget, so that each arm's loss converts to a compute-equivalent gain
(CEG), and every comparison is classified (paired t-test and TOST against the margin, Holm across
the report's comparisons): better, worse, equivalent within the margin, or unresolved. Every run is
a typed record (arm, seed, lr, grid cell, role: tune | seeded | ceg-stable | ceg-cooldown) in
``experiment.json``. Then the measurements
that need more than the run folders (evaluation at longer contexts, gradient norms at
initialisation, the throughput benchmark) run in this process, each cached under
``<out>/measurements/``; then the report (``analysis.experiment_report``): ``report.md`` with the
tables, PNGs, ``report.json`` with every number and the command that regenerates it.

Each measurement is one module of ``analysis.measurements`` (registered in
``analysis.measurements.MEASUREMENTS``): the settings it accepts, checked when the spec loads (an
unknown setting or a bad value is an error naming it), what it computes after training and its
report section.

Spec file (YAML):

    name: evolution                    # report title and folder names
    title: The architecture-evolution ladder
    description: ...                   # what is trained and why (quoted in the report)
    claim: ...                         # the published claim the experiment checks
    out: runs/experiments/evolution    # run folders (git-ignored); --quick adds -quick
    report: docs/experiments/evolution # where `run` writes the report (--quick: <out>/report)
    seeds: [0, 1, 2]                   # train.seed of every arm (default: 3 seeds); or a sequential design,
                                       # {min: 3, max: 9, step: 2, spending: pocock}: the unresolved
                                       # comparisons get more seeds (tools.experiment_seeds)
    budget: {flops: 4.0e12}            # or {tokens: 1.0e6}: the same for every arm unless the arm says otherwise
    set: [model.vocab_size=2048]       # overrides for every arm
    grid: {train.lr: [1.0e-3, 3.0e-3]} # optional: crossed with every arm and seed
    reference: vanilla                 # paired differences are taken against it (default: the first arm)
    tune: {lr: [1.0e-3, 2.0e-3, 4.0e-3], budget_fraction: 1.0, seed: 1000, max_extend: 3}
                                       # required: each arm's lr (tools.experiment_tuning); or {lr: [...],
                                       # mup: true} (width-only arms under muP), or {shared: <why>} (by design)
    ceg: {fractions: [0.25, 0.5, 1.0, 2.0], seeds: [0, 1, 2], decay_fraction: 0.2, shape: sqrt}
                                       # optional: the reference's loss against compute (tools.experiment_ceg)
    margin: {ceg: [0.9, 1.1]}          # equivalence margin of the verdicts (default), or {nats: 0.02}
    verdicts: reference                # the verdicts' family: every arm against the reference (default),
                                       # pairs: every arm that names a `compare:` arm against that arm, or
                                       # parent: every arm against the arm it extends (a ladder's steps)
    arms:                              # in order: tables and plots follow it
      - name: vanilla
        label: 2017 Transformer        # short text for tables and plots (default: the name)
        recipe: recipes/vanilla/tiny.yaml
        set: [train.lr=1.0e-3]
      - name: pre-ln
        extends: previous              # or an arm's name: its recipe and overrides, then this arm's `set`
        set: [model.norm.placement=pre]
      - name: dense-time
        extends: dense
        side: true                     # not a step of the ladder (measurements.ladder)
        compare: moe                   # also paired with this arm in the tables (any arm)
        budget: {match_time_of: moe}   # the tokens this arm trains (at its parent's measured tokens/s)
                                       # in the mean training time of arm `moe` (speeds: the throughput
                                       # benchmark if the spec measures it, else the runs' own)
    measurements:                      # besides the final validation loss and the costs (always reported)
      ladder: {}                       # each arm against the arm it extends; waterfall plot
      extrapolation: {multipliers: [1, 2, 4, 8], tokens: 32768, arms: [...], variants: {NAME: {arm, label, set}}}
                                       # loss at multiples of the training context, as trained and with
                                       # evaluation-time overrides (arms: default all)
      init_grad_norms: {depths: [2, 4, 8], batches: 2, seeds: [...], arms: [...]}  # per-layer gradient norms at
                                       # initialisation (seeds: default the spec's; arms: default all)
      stability: {}                    # grid outcome per arm: learned | did not learn | diverged
      routing: {heatmaps: [a, b]}      # MaxVio against validation loss; load heatmaps of two arms
      wall_clock: {}                   # equal-FLOPs and equal-time views
      kv_cache: {}                     # validation loss against KV-cache bytes per token
      val_sampling: {}                 # the validation set's own sampling error beside the seed intervals
      throughput: {steps: 10, rounds: 5}  # every arm's training step timed side by side (interleaved rounds):
                                       # tokens/s that compare under the same load; time-matched budgets use it
                                       # (--quick: {steps: 2, rounds: 2}); its section comes last
    quick:                             # --quick: these keys replace the spec's (`set` is appended)
      budget: {tokens: 4096}
      tune: {lr: [1.0e-3, 3.0e-3], max_extend: 0}
      arms: [vanilla, pre-ln]          # train only these arms (all arms are still resolved and checked)

``--quick`` also applies :data:`QUICK_SET` (tiny width, short sequences, a small corpus) before
the spec's ``quick.set`` and the arms' own overrides, trains one seed, and writes to ``<out>-quick``.
Keys that ``quick:`` does not give shrink by default (also without any ``quick:`` block), each named in
the report's setup: budget -> {tokens: 4096}; tune.lr -> the grid's lowest and highest lr, max_extend 0;
ceg.seeds -> the quick seeds ([0]). A spec's grid: and measurements: keep their values (the measurements'
own quick settings apply).
"""

from __future__ import annotations

import argparse
import copy
import json
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from omegaconf import OmegaConf

from analysis.measurements import MEASUREMENTS
from archlab.config import RecipeError, load_recipe
from archlab.io import write_json_atomic
from tools import experiment_ceg, experiment_seeds, experiment_status, experiment_tuning, launch, sweep

REPO_ROOT = Path(__file__).resolve().parents[1]
RECORD = "experiment.json"
SPEC_KEYS = ("name", "title", "description", "claim", "out", "report", "seeds", "budget", "set", "grid", "reference",
             "arms", "measurements", "quick", "notes", "tune", "ceg", "margin", "verdicts")
ARM_KEYS = ("name", "label", "recipe", "extends", "set", "budget", "side", "note", "compare")
QUICK_KEYS = ("arms", "seeds", "budget", "set", "grid", "measurements", "tune", "ceg")
DEFAULT_SEEDS = [0, 1, 2]
# --quick: a model and corpus small enough that every experiment runs end to end in seconds
QUICK_SET = ["model.vocab_size=384", "data.max_bytes=150000", "model.d_model=32", "model.n_layers=2",
             "train.seq_len=32", "train.micro_batch_size=4", "train.eval_batches=2",
             "train.tensorboard=false", "train.log_every=1", "train.warmup_steps=2"]
# --quick, for a key its spec's `quick:` block does not give: a budget of a few thousand tokens, the tuning grid's
# lowest and highest lr without extension, the compute curve on the quick seeds (one) only
QUICK_BUDGET = {"tokens": 4096}
QUICK_TUNE = {"max_extend": 0}


@dataclass
class Arm:
    """One arm, resolved: the recipe and every override it trains with (common, quick, inherited, own)."""

    name: str
    label: str
    recipe: str
    overrides: list[str]
    own: list[str]  # the arm's own `set` (what it changes relative to `parent`)
    parent: Optional[str] = None
    budget: dict = field(default_factory=dict)  # {tokens: T} | {flops: C} | {match_time_of: arm, speed_of: arm}
    side: bool = False
    note: str = ""
    compare: Optional[str] = None  # one more arm to pair this one with in the tables

    @property
    def timed(self) -> bool:
        return "match_time_of" in self.budget


# --------------------------------------------------------------------------------------------
# the spec
# --------------------------------------------------------------------------------------------


def load_spec(path: str, quick: bool = False, extra_set: Sequence[str] = ()) -> dict:
    """Read an experiment spec, apply ``quick:`` when asked (and ``extra_set``, overrides for every
    arm after the spec's ``set``), and check every key."""
    p = Path(path)
    if not p.is_file():
        raise RecipeError(f"{path}: experiment spec not found (experiments live in experiments/<name>.yaml)")
    try:
        spec = OmegaConf.to_container(OmegaConf.load(p), resolve=False)  # ${...} stay for the recipes
    except Exception as e:
        raise RecipeError(f"{path}: not valid YAML ({e})") from None
    if not isinstance(spec, dict):
        raise RecipeError(f"{path}: an experiment spec is a YAML mapping (name, arms, budget, ...)")
    _check_keys(spec, SPEC_KEYS, path)
    quick_part = spec.pop("quick", None) or {}
    _check_keys(quick_part, QUICK_KEYS, f"{path}: quick")
    _check_measurements(quick_part.get("measurements"), f"{path}: quick.measurements")
    if quick:
        spec["set"] = list(spec.get("set") or []) + QUICK_SET + list(quick_part.get("set") or [])
        spec["seeds"] = quick_part.get("seeds", [0])
        for key in ("budget", "grid", "tune", "ceg"):
            if key in quick_part:
                spec[key] = quick_part[key]
        spec["quick_defaults"] = quick_defaults(spec, quick_part, spec["seeds"])
        wanted = spec.get("measurements") or {}
        quick_measures = _merge({n: m.quick for n, m in MEASUREMENTS.items() if m.quick},
                                quick_part.get("measurements") or {})
        spec["measurements"] = _merge(wanted, {k: v for k, v in quick_measures.items() if k in wanted})
        if quick_part.get("arms"):
            spec["only_arms"] = list(quick_part["arms"])
    if extra_set:
        spec["set"] = list(spec.get("set") or []) + list(extra_set)
        spec["extra_set"] = list(extra_set)
    spec["quick"] = quick
    spec["spec_path"] = _relative(p)
    for key in ("name", "arms", "budget"):
        if not spec.get(key):
            raise RecipeError(f"{path}: '{key}:' is required (see python -m tools.experiment --help)")
    design = experiment_seeds.check(spec, path)  # seeds: {min, max, ...}: the first look's seeds
    seeds = spec.setdefault("seeds", list(DEFAULT_SEEDS))
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and s >= 0 for s in seeds):
        raise RecipeError(f"{path}: seeds={seeds!r}: expected a list of integers >= 0, e.g. [0, 1, 2]")
    _check_budget(spec["budget"], f"{path}: budget")
    spec["set"] = sweep._as_override_list(spec.get("set"), "set")
    if any(o.split("=", 1)[0].strip() == "train.seed" for o in spec["set"]):
        raise RecipeError(f"{path}: set: train.seed is chosen by 'seeds:'; remove it from 'set:'")
    grid = spec.get("grid") or {}
    if not isinstance(grid, dict) or "train.seed" in grid:
        raise RecipeError(f"{path}: grid={grid!r}: a mapping of key -> list of values, without train.seed")
    if "measurements" in spec:
        spec["measurements"] = _check_measurements(spec["measurements"], f"{path}: measurements")
    if spec.get("tune") is None:  # no arm is compared at an lr that suits another arm better, by construction
        raise RecipeError(f"{path}: 'tune:' is required: each arm's lr tuned ({{lr: [1.0e-3, 2.0e-3, 4.0e-3]}}), "
                          "tuned at the muP base width and transferred ({lr: [...], mup: true}), or shared by design "
                          "({shared: <why>}); see tools/experiment_tuning.py")
    spec["tune"] = experiment_tuning.check(spec.get("tune"), list(range(design.max)) if design else seeds)
    if spec["tune"] and "lr" in spec["tune"] and "train.lr" in grid:
        raise RecipeError(f"{path}: tune: and grid: train.lr both choose the lr; a grid over lr shares it by design "
                          "(write tune: {shared: <why>})")
    spec["ceg"] = experiment_ceg.check(spec.get("ceg"), seeds)
    spec["margin"] = experiment_ceg.check_margin(spec.get("margin"))
    spec["verdicts"] = spec.get("verdicts") or "reference"
    if spec["verdicts"] not in ("reference", "pairs", "parent"):
        raise RecipeError(f"verdicts={spec['verdicts']!r}: must be reference (every arm against the reference), "
                          "pairs (every arm that names a compare: arm against that arm) or parent (every arm against "
                          "the arm it extends)")
    spec.setdefault("out", f"runs/experiments/{spec['name']}")
    if quick:
        spec["out"] = spec["out"].rstrip("/") + "-quick"
    return spec


def quick_defaults(spec: dict, quick_part: dict, seeds: Sequence[int]) -> list[str]:
    """``--quick`` without a key in ``quick:``: the budget, the tuning grid and the compute curve's seeds
    shrink by :data:`QUICK_BUDGET` and :data:`QUICK_TUNE` (in place); returns what was applied, one line each."""
    applied = []
    if "budget" not in quick_part:
        was = spec.get("budget")
        spec["budget"] = dict(QUICK_BUDGET)
        applied.append(f"budget {was} -> {QUICK_BUDGET}")
    tune = spec.get("tune")
    if "tune" not in quick_part and isinstance(tune, dict) and isinstance(tune.get("lr"), list) and tune["lr"]:
        lrs = sorted(float(v) for v in tune["lr"])
        new = {**tune, "lr": [lrs[0], lrs[-1]] if len(lrs) > 1 else lrs, **QUICK_TUNE}
        applied.append(f"tune.lr {tune['lr']} -> {new['lr']}, max_extend {tune.get('max_extend', 'default')} -> "
                       f"{QUICK_TUNE['max_extend']}")
        spec["tune"] = new
    ceg = spec.get("ceg")
    if "ceg" not in quick_part and isinstance(ceg, dict) and "seeds" in ceg and list(ceg["seeds"]) != list(seeds):
        applied.append(f"ceg.seeds {ceg['seeds']} -> {list(seeds)}")
        spec["ceg"] = {**ceg, "seeds": list(seeds)}
    return applied


def _check_keys(d: dict, valid: Sequence[str], where: str) -> None:
    if not isinstance(d, dict):
        raise RecipeError(f"{where}: expected a mapping")
    unknown = sorted(set(d) - set(valid))
    if unknown:
        raise RecipeError(f"{where}: unknown keys {unknown}; valid: {', '.join(valid)}")


def _check_measurements(wanted: Optional[dict], where: str) -> dict:
    """``{name: settings}`` with every name a registered measurement and its settings checked by it."""
    if wanted is None:
        return {}
    if not isinstance(wanted, dict):
        raise RecipeError(f"{where}={wanted!r}: expected a mapping of measurement name -> settings")
    unknown = sorted(set(wanted) - set(MEASUREMENTS))
    if unknown:
        raise RecipeError(f"{where}: unknown {unknown}; valid: {', '.join(MEASUREMENTS)}")
    return {name: MEASUREMENTS[name].check(settings, f"{where}.{name}") for name, settings in wanted.items()}


def _check_budget(budget, where: str) -> None:
    if not isinstance(budget, dict) or len(budget) != 1 and "match_time_of" not in budget:
        raise RecipeError(f"{where}={budget!r}: give one of {{tokens: T}}, {{flops: C}} or {{match_time_of: ARM}}")
    if "match_time_of" in budget:
        _check_keys(budget, ("match_time_of", "speed_of"), where)
        return
    kind, value = next(iter(budget.items()))
    if kind not in ("tokens", "flops"):
        raise RecipeError(f"{where}: unknown budget kind {kind!r}; use tokens or flops")
    try:
        ok = float(value) > 0
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise RecipeError(f"{where}.{kind}={value!r}: must be a positive number")


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _relative(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(p)


def resolve_arms(spec: dict) -> list[Arm]:
    """Each arm's recipe and full override list: common set, then the chain of ``extends``, then its own."""
    arms: dict[str, Arm] = {}
    previous: Optional[str] = None
    for i, entry in enumerate(spec["arms"]):
        where = f"arms[{i}]"
        if not isinstance(entry, dict) or not entry.get("name"):
            raise RecipeError(f"{where}: each arm is a mapping with a 'name:' (and 'recipe:' or 'extends:')")
        _check_keys(entry, ARM_KEYS, f"{where} ({entry['name']})")
        name = str(entry["name"])
        if name in arms or sweep._safe(name) != name:
            raise RecipeError(f"{where}: arm name {name!r} is repeated or has characters other than letters, digits, "
                              "'.', '_' and '-'")
        own = sweep._as_override_list(entry.get("set"), f"{where}.set")
        if any(o.split("=", 1)[0].strip() == "train.seed" for o in own):
            raise RecipeError(f"{where}.set: train.seed is chosen by 'seeds:'")
        parent_name = entry.get("extends")
        if parent_name == "previous":
            parent_name = previous
            if parent_name is None:
                raise RecipeError(f"{where}: 'extends: previous' on the first arm")
        if parent_name is not None:
            if parent_name not in arms:
                raise RecipeError(f"{where}: extends {parent_name!r}, which is not an arm listed before it "
                                  f"(arms so far: {', '.join(arms) or 'none'})")
            parent = arms[parent_name]
            if entry.get("recipe"):
                raise RecipeError(f"{where}: give either 'recipe:' or 'extends:', not both")
            recipe, inherited = parent.recipe, parent.overrides
        else:
            recipe, inherited = entry.get("recipe"), list(spec["set"])
            if not recipe:
                raise RecipeError(f"{where} ({name}): needs 'recipe:' or 'extends:'")
            if not Path(recipe).is_file():
                raise RecipeError(f"{where}.recipe={recipe!r}: file not found")
        budget = entry.get("budget") or dict(spec["budget"])
        _check_budget(budget, f"{where}.budget")
        if "match_time_of" in budget:
            budget = {"match_time_of": budget["match_time_of"], "speed_of": budget.get("speed_of") or parent_name}
            for key in ("match_time_of", "speed_of"):
                if budget[key] not in arms or arms[budget[key]].timed:
                    raise RecipeError(f"{where}.budget.{key}={budget[key]!r}: must name an earlier arm with a "
                                      "tokens or flops budget (its runs measure the time or the speed)")
        arms[name] = Arm(name=name, label=str(entry.get("label") or name), recipe=str(recipe),
                         overrides=list(inherited) + own, own=own, parent=parent_name, budget=budget,
                         side=bool(entry.get("side", False)), note=str(entry.get("note") or ""),
                         compare=entry.get("compare"))
        if not arms[name].side:
            previous = name
    reference = spec.get("reference") or next(iter(arms))
    if reference not in arms:
        raise RecipeError(f"reference={reference!r}: not an arm (arms: {', '.join(arms)})")
    spec["reference"] = reference
    for arm in arms.values():
        if arm.compare is not None and arm.compare not in arms:
            raise RecipeError(f"arm {arm.name}: compare={arm.compare!r} is not an arm (arms: {', '.join(arms)})")
    if spec.get("verdicts") == "pairs" and not any(a.compare for a in arms.values()):
        raise RecipeError("verdicts=pairs: no arm names a compare: arm, so there would be no verdict; add compare: "
                          "to the arms to pair, or drop verdicts")
    if spec.get("verdicts") == "parent" and not any(a.parent for a in arms.values() if not a.side):
        raise RecipeError("verdicts=parent: no arm extends another, so there would be no verdict; give the arms "
                          "extends:, or drop verdicts")
    for arm in arms.values():  # the compute curve's schedule (ceg.arms_schedule: wsd), after everything else
        arm.overrides = [*arm.overrides, *experiment_ceg.arms_schedule(spec)]
    for arm in arms.values():  # every arm's recipe must load now, not half-way through the experiment
        try:
            load_recipe(arm.recipe, arm.overrides)
        except RecipeError as e:
            raise RecipeError(f"arm {arm.name} ({arm.recipe} + its overrides): {e}") from None
    only = spec.get("only_arms")
    if only:
        missing = [a for a in only if a not in arms]
        if missing:
            raise RecipeError(f"quick.arms: {missing} are not arms (arms: {', '.join(arms)})")
        needed = {reference} | {a.budget[k] for a in arms.values() if a.name in only and a.timed
                                for k in ("match_time_of", "speed_of")}
        if not needed <= set(only):
            raise RecipeError(f"quick.arms={only}: must include {sorted(needed - set(only))} (the reference arm and "
                              "the arms whose runs set a time-matched budget)")
        return [a for a in arms.values() if a.name in only]
    return list(arms.values())


# --------------------------------------------------------------------------------------------
# sweeps
# --------------------------------------------------------------------------------------------


def grid_of(spec: dict) -> dict:
    """The sweep grid: the experiment's own grid, then the seeds (last: point names end -seed<s>)."""
    return {**(spec.get("grid") or {}), "train.seed": list(spec["seeds"])}


def sweep_spec(spec: dict, arms: Sequence[Arm], folder: str, budgets: dict[str, dict]) -> dict:
    """A ``tools.sweep`` spec: one ladder per arm (its overrides, its own budget), grid x seeds."""
    ladders = {}
    for arm in arms:
        kind, value = next(iter(budgets[arm.name].items()))
        ladders[arm.name] = {"recipe": arm.recipe, "set": list(arm.overrides), kind: [float(value)]}
    return {"out": str(Path(spec["out"]) / folder), "ladders": ladders, "grid": grid_of(spec),
            "description": f"experiment {spec['name']}"}


planned_points = sweep.plan_points


def match_time_budgets(spec: dict, arms: Sequence[Arm], runs: list[dict],
                       bench: Optional[dict] = None) -> dict[str, dict]:
    """Token budgets of the time-matched arms: the mean training time of ``match_time_of``'s runs
    (tokens / tokens per second) times the tokens per second of ``speed_of``, rounded to 3
    significant digits (so reruns find the same point names). Tokens per second: from ``bench``
    (the interleaved benchmark, ``analysis.throughput``: both arms under the same load) when given,
    else the mean over an arm's runs of each run's median over its logged windows
    (``analysis.experiments.run_tokens_per_s``)."""
    from analysis.experiments import run_tokens_per_s

    def mean_of(arm: str, fn) -> float:
        vals = []
        for r in runs:
            if r["arm"] != arm:
                continue
            path = Path(r["run_dir"]) / "summary.json"
            s = json.loads(path.read_text()) if path.is_file() else {}
            speed = run_tokens_per_s(r["run_dir"]) if s.get("status") == "completed" else None
            if bench is not None and speed:
                speed = bench[arm]["tokens_per_s"]
            if speed:
                vals.append(fn(s["tokens"], speed))
        if not vals:
            raise RecipeError(f"match_time_of/speed_of: arm {arm!r} has no completed run with a measured tokens/s")
        return sum(vals) / len(vals)

    out = {}
    for arm in arms:
        seconds = mean_of(arm.budget["match_time_of"], lambda tokens, speed: tokens / speed)
        speed = mean_of(arm.budget["speed_of"], lambda tokens, speed: speed)
        out[arm.name] = {"tokens": float(f"{seconds * speed:.3g}"), "seconds": seconds, "tokens_per_s": speed,
                         "speeds_from": "throughput benchmark" if bench is not None else "the runs"}
    return out


# --------------------------------------------------------------------------------------------
# running
# --------------------------------------------------------------------------------------------


def _record_runs(spec: dict, points: list[sweep.Point], folder: str) -> list[dict]:
    """Typed records of the seeded runs: arm (the point's ladder), seed and grid cell (the point's
    own grid values), role "seeded"."""
    out = []
    for p in points:
        cell = dict(p.cell)
        seed = int(cell.pop("train.seed"))
        out.append({"arm": p.ladder, "seed": seed, "cell": cell, "role": "seeded", "point": p.name, "sweep": folder,
                    "run_dir": p.run_dir, "max_steps": p.max_steps, "planned_tokens": p.planned_tokens,
                    "planned_flops": p.planned_flops})
    return out


def write_record(spec: dict, arms: Sequence[Arm], runs: list[dict], extra: dict) -> Path:
    out = Path(spec["out"])
    out.mkdir(parents=True, exist_ok=True)
    record = {"kind": "archlab-experiment", "version": 1, "spec": spec, "arms": [asdict(a) for a in arms],
              "runs": runs, **extra}
    return write_json_atomic(out / RECORD, record, sort_keys=False)


def read_record(out: Path) -> dict:
    path = Path(out) / RECORD
    if not path.is_file():
        raise RecipeError(f"{path}: no experiment record; run `python -m tools.experiment run SPEC` first")
    return json.loads(path.read_text())


WORDS = ("title", "description", "claim", "notes")  # spec fields that describe, never change, the runs


def with_current_words(record: dict, spec: dict, arms: Sequence[Arm]) -> dict:
    """The record of the runs with the current spec's descriptive text: its title, description,
    claim, notes and the arms' labels and notes (what the runs are stays the record's)."""
    record["spec"]["spec_path"] = spec["spec_path"]
    record["spec"].update({k: spec[k] for k in WORDS if k in spec})
    words = {a.name: a for a in arms}
    for a in record["arms"]:
        if a["name"] in words:
            a["label"], a["note"] = words[a["name"]].label, words[a["name"]].note
    return record


def regenerate_command(spec: dict, args) -> str:
    """The command that rebuilds this report from scratch (finished runs are reused)."""
    cmd = ["python", "-m", "tools.experiment", "run", spec["spec_path"]]
    if spec["quick"]:
        cmd.append("--quick")
    if getattr(args, "out", None):
        cmd += ["--out", args.out]
    if getattr(args, "report", None):
        cmd += ["--report", args.report]
    if spec.get("extra_set"):
        cmd += ["--set", *spec["extra_set"]]
    cmd += ["--jobs", str(getattr(args, "jobs", 1))]
    if getattr(args, "threads", None):
        cmd += ["--threads", str(args.threads)]
    return shlex.join(cmd)


def run_experiment(spec: dict, *, jobs: int = 1, threads: Optional[int] = None, log=print,
                   show_progress: bool = True, command: str = "") -> dict:
    """Train every arm x cell x seed (resumable), then the time-matched arms; returns the record."""
    from tqdm.auto import tqdm

    arms = resolve_arms(spec)
    fixed = [a for a in arms if not a.timed]
    timed = [a for a in arms if a.timed]
    n_cells = len(sweep._grid_items(grid_of(spec)))
    t0 = time.time()
    extra = tune_arms(spec, arms, fixed, jobs=jobs, threads=threads, log=log)
    phase1 = sweep_spec(spec, fixed, "sweep", {a.name: a.budget for a in fixed})
    points = planned_points(phase1)
    bar = tqdm(total=len(arms) * n_cells, desc=f"{spec['name']} runs", unit="run", disable=not show_progress,
               file=sys.stderr, dynamic_ncols=True)
    write = bar.write if show_progress else log
    bar.update(sum(sweep.is_done(p) for p in points))
    _check_stopped(sweep.run_sweep(phase1, jobs=jobs, threads=threads, log=write, progress=lambda p: bar.update(1)))
    runs = _record_runs(spec, points, "sweep")
    timed_budgets = {}
    if timed:
        bench = None
        if "throughput" in (spec.get("measurements") or {}):  # the speeds, side by side, before phase 2
            write_record(spec, arms, runs, {"threads": threads})
            bench = MEASUREMENTS["throughput"].run(read_record(Path(spec["out"])), log=write)
        timed_budgets = match_time_budgets(spec, timed, runs, bench)
        phase2 = sweep_spec(spec, timed, "sweep-time", timed_budgets)
        points2 = planned_points(phase2)
        bar.update(sum(sweep.is_done(p) for p in points2))
        _check_stopped(sweep.run_sweep(phase2, jobs=jobs, threads=threads, log=write,
                                       progress=lambda p: bar.update(1)))
        runs += _record_runs(spec, points2, "sweep-time")
    bar.close()
    if spec.get("ceg"):  # the reference's compute curve, at its tuned lr
        ref = next(a for a in arms if a.name == spec["reference"])
        extra["ceg_runs"] = experiment_ceg.run(spec, ref, [], jobs=jobs, threads=threads, log=log)
    if spec.get("sequential"):  # more seeds for what is unresolved (tools.experiment_seeds)
        stage = {"sweep_spec": sweep_spec, "record_runs": _record_runs, "read_record": read_record,
                 "check_stopped": _check_stopped,
                 "write_record": lambda rs: write_record(spec, arms, rs, {**extra, "threads": threads})}
        runs = experiment_seeds.run_looks(spec, fixed, runs, stage, jobs=jobs, threads=threads, log=log)
    write_record(spec, arms, runs, {**extra, "timed_budgets": timed_budgets,
                                    "train_wall_s": round(time.time() - t0, 1), "command": command,
                                    "threads": threads})
    return read_record(Path(spec["out"]))


def tune_arms(spec: dict, arms: Sequence[Arm], fixed: Sequence[Arm], *, jobs: int = 1, threads: Optional[int] = None,
              log=print) -> dict:
    """The tuning stage (``tools.experiment_tuning``): each fixed-budget arm's lr, appended to its
    overrides (time-matched arms take their parent's); returns what the record keeps of it."""
    tune = spec.get("tune")
    if not tune or "shared" in tune:
        return {}
    tuned, recs = experiment_tuning.run(spec, fixed, jobs=jobs, threads=threads, log=log)
    for arm, lr_set in experiment_tuning.tuned_overrides(arms, tuned).items():
        a = next(a for a in arms if a.name == arm)
        a.overrides = [*a.overrides, *lr_set]
    manifest = sweep.read_manifest(Path(spec["out"]) / experiment_tuning.FOLDER) or {}
    wall = {p["name"]: p.get("elapsed_s") or 0.0 for p in manifest.get("points", [])}  # per tuning run
    return {"tuning": tuned, "tune_runs": recs, "tune_wall_s": wall}


Stopped = sweep.Stopped


def _check_stopped(points: list[sweep.Point]) -> None:
    left = [p.name for p in points if p.status in ("pending", "running", "interrupted")]
    if left:
        raise Stopped(f"{len(left)} runs not finished ({', '.join(left[:3])}{', ...' if len(left) > 3 else ''}); "
                      "run the same command again to resume them")


def plan(spec: dict, log=print, estimate: bool = True) -> dict:
    """Print every arm with its overrides, steps and costs, the training commands of each stage
    (tuning, seeded runs, the compute curve) and an estimate of their CPU time; train nothing.
    Returns {stage: {"runs", "flops"}} and the estimate."""
    from archlab.config import model_config
    from archlab.costs import kv_cache_bytes, param_counts, training_flops_per_token

    arms = resolve_arms(spec)
    log(f"experiment {spec['name']}: {len(arms)} arms x {len(sweep._grid_items(grid_of(spec)))} runs "
        f"(grid x seeds {spec['seeds']}), reference {spec['reference']}, out {spec['out']}")
    for a in arms:
        cfg = load_recipe(a.recipe, a.overrides)
        pc = param_counts(cfg)
        fpt = training_flops_per_token(model_config(cfg), int(cfg.train.seq_len))
        changes = a.overrides[len(spec["set"]):]  # everything beyond the common overrides
        log(f"- {a.name} ({a.label}): {a.recipe} {' '.join(changes)}; budget {a.budget}; params {pc.total:,} total / "
            f"{pc.active:,} active; {fpt / 1e6:.2f} MFLOP/token; KV {kv_cache_bytes(cfg, 1, 1, 'bf16'):.0f} B/token")
    fixed = [a for a in arms if not a.timed]
    stages = {}
    log("\n== stage 1: tuning")
    experiment_tuning.plan(spec, fixed, log=log)
    if spec.get("tune") and "lr" in spec["tune"]:
        searched = [experiment_tuning.mup_base_arm(fixed)] if spec["tune"].get("mup") else fixed
        pts = planned_points(experiment_tuning.sweep_spec(spec, searched, {a.name: spec["tune"]["lr"]
                                                                          for a in searched}))
        stages["tuning (starting grid)"] = pts
    log("\n== stage 2: seeded runs" + (" (at each arm's tuned lr)" if "tuning (starting grid)" in stages else ""))
    sspec = sweep_spec(spec, fixed, "sweep", {a.name: a.budget for a in fixed})
    # listed without the tuned lrs (chosen by stage 1): not compared with seeded runs already trained at them
    sweep.run_sweep(sspec, dry_run=True, log=log, check="tuning (starting grid)" not in stages)
    stages["seeded runs"] = planned_points(sspec)
    if len(fixed) < len(arms):
        log("time-matched arms (" + ", ".join(a.name for a in arms if a.timed) + "): their token budgets are set "
            "once the runs they match are finished (not in the estimate)")
    log("\n== stage 3: compute curve (CEG)")
    ref = next(a for a in arms if a.name == spec["reference"])
    experiment_ceg.plan(spec, ref, log=log)
    if spec.get("ceg"):
        stages["compute curve"] = planned_points(experiment_ceg.sweep_spec(spec, ref, []))
    stages.update(experiment_seeds.plan(spec, fixed, sweep_spec, log=log))
    out = {name: {"runs": len(pts), "flops": sum(_new_flops(p) for p in pts)} for name, pts in stages.items()}
    speed = _flops_per_s(ref) if estimate else None
    log("\n== cost" + (f" (estimated at {speed / 1e9:.2f} GFLOP/s of training, the reference arm's step timed here "
                       "on 1 thread; a run per core)" if speed else ""))
    for name, o in out.items():
        est = f", ~{o['flops'] / speed / 60:.0f} CPU-min" if speed else ""
        log(f"- {name}: {o['runs']} runs, {o['flops']:.3g} training FLOPs{est}")
    total = sum(o["flops"] for o in out.values())
    if speed:
        log(f"- total: ~{total / speed / 60:.0f} CPU-min (~{total / speed / 120:.0f} min wall with --jobs 2)")
    return {"stages": out, "flops_per_s": speed}


def _new_flops(p: sweep.Point) -> float:
    """The FLOPs a point trains itself: a cooldown branch only its steps after the trunk's checkpoint."""
    if p.role == "cooldown" and p.cooldown:
        return p.cooldown["decay_steps"] * p.tokens_per_step * p.flops_per_token
    return p.planned_flops


def _flops_per_s(arm: Arm) -> Optional[float]:
    """Training FLOP/s of the arm's step on this machine (1 thread, a few steps): the plan's yardstick."""
    from analysis.throughput import benchmark
    from archlab.config import model_config
    from archlab.costs import training_flops_per_token

    cfg = load_recipe(arm.recipe, arm.overrides)
    tps = benchmark({arm.name: (arm.recipe, arm.overrides)}, steps=2, rounds=2, warmup=1, threads=1)
    return tps[arm.name]["tokens_per_s"] * training_flops_per_token(model_config(cfg), int(cfg.train.seq_len))


def measure(record: dict, log=print) -> dict:
    """{name: result} of the spec's measurements that compute something beyond the run folders
    (``Measurement.run``), each result cached as JSON under ``<out>/measurements/``."""
    wanted = record["spec"].get("measurements") or {}
    results = {}
    for name, m in MEASUREMENTS.items():
        if name in wanted:
            result = m.run(record, log=log)
            if result is not None:
                results[name] = result
    return results


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m tools.experiment", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    sub = ap.add_subparsers(dest="command", required=True)
    for name, text in (("run", "train (resumable), measure and write the report"),
                       ("report", "write the report from the finished runs (measuring what is missing)"),
                       ("plan", "print the arms, their costs and the training commands"),
                       ("status", "where the runs stand, stage by stage (trains nothing)")):
        p = sub.add_parser(name, help=text)
        p.add_argument("spec", help="experiment spec, e.g. experiments/evolution.yaml")
        p.add_argument("--quick", action="store_true", help="tiny models, a few steps, one seed (<out>-quick)")
        p.add_argument("--out", help="folder of the runs (default: the spec's out:)")
        p.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                       help="overrides for every arm, after the spec's set: (e.g. data.cache_dir=/tmp/cache)")
        if name not in ("plan", "status"):
            p.add_argument("--report", help="report folder (default: the spec's report:, or <out>/report)")
        if name == "run":
            p.add_argument("--jobs", type=int, default=1, help="runs trained at the same time (default 1)")
            p.add_argument("--threads", type=int, help="torch threads per trainer (default: torch's)")
            p.add_argument("--launcher", choices=["python", "slurm"], default="python",
                           help="train each run on this machine, or as one SLURM job (submitit; --slurm-* options)")
            launch.add_arguments(p)
    return ap


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    from analysis.experiment_report import write_report
    from analysis.runs import RunError

    try:
        spec = load_spec(args.spec, quick=args.quick, extra_set=args.set)
        if args.out:
            spec["out"] = args.out
        if args.command == "plan":
            plan(spec)
            return 0
        if args.command == "status":
            print(experiment_status.status_text(Path(spec["out"]), RECORD))
            return 0
        if args.command == "run":
            if args.jobs < 1 or (args.threads is not None and args.threads < 1):
                raise RecipeError("--jobs and --threads must be >= 1")
            with launch.use(launch.from_args(args)):
                record = run_experiment(spec, jobs=args.jobs, threads=args.threads,
                                        command=regenerate_command(spec, args))
        else:
            record = with_current_words(read_record(Path(spec["out"])), spec, resolve_arms(spec))
        t0 = time.time()
        measurements = measure(record)
        report_dir = Path(args.report or (spec.get("report") if not spec["quick"] else None)
                          or Path(spec["out"]) / "report")
        record["measure_wall_s"] = round(time.time() - t0, 1)
        # the command of the run that trained it (`report` keeps its --jobs/--threads)
        command = record.get("command") or regenerate_command(spec, args)
        paths = write_report(record, measurements, report_dir, command=command)
    except Stopped as e:
        print(f"stopped: {e}", file=sys.stderr)
        return 1
    except (RecipeError, RunError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"report: {paths['markdown']}")
    for name in paths["unfinished"]:
        print(f"not finished: {name} (see {spec['out']}/sweep*/logs/{name}.log)", file=sys.stderr)
    return 1 if paths["unfinished"] else 0


if __name__ == "__main__":
    sys.exit(main())
