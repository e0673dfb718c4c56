"""Reading an experiment spec: the YAML, ``--quick`` and ``--set`` applied, every key checked once (an error
names the key), into a typed :class:`analysis.experiment_spec.Spec` that every later stage reads by field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Optional, Sequence

from omegaconf import OmegaConf

from analysis.experiment_spec import ArmSpec, Budget, Spec, budget_arm, budget_tag, budget_words
from analysis.measurements import MEASUREMENTS
from archlab.config import RecipeError, load_recipe, model_config
from archlab.costs import training_flops_per_token
from tools import sweep
from tools.experiment.arms import resolve_arms
from tools.experiment.stages import ceg as ceg_stage
from tools.experiment.stages import finetune as finetune_stage
from tools.experiment.stages import looks, tuning

REPO_ROOT = Path(__file__).resolve().parents[2]
SPEC_KEYS = ("name", "title", "description", "claim", "out", "report", "seeds", "budget", "set", "grid", "reference",
             "arms", "measurements", "quick", "notes", "tune", "ceg", "margin", "verdicts", "budgets", "finetune")
ARM_KEYS = ("name", "label", "recipe", "extends", "set", "budget", "side", "note", "compare")
QUICK_KEYS = ("arms", "seeds", "budget", "budgets", "set", "grid", "measurements", "tune", "ceg", "finetune")
DEFAULT_SEEDS = [0, 1, 2]
# --quick: a model and corpus small enough that every experiment runs end to end in seconds
QUICK_SET = ["model.vocab_size=384", "data.max_bytes=150000", "model.d_model=32", "model.n_layers=2",
             "train.seq_len=32", "train.micro_batch_size=4", "train.eval_batches=2",
             "train.tensorboard=false", "train.log_every=1", "train.warmup_steps=2"]
# --quick, for a key its spec's `quick:` block does not give: a budget of a few thousand tokens, the tuning grid's
# lowest and highest lr without extension, the compute curve on the quick seeds (one) only
QUICK_BUDGET = {"tokens": 4096}
QUICK_TUNE = {"max_extend": 0}


def load_spec(path: str, quick: bool = False, extra_set: Sequence[str] = ()) -> Spec:
    """Read an experiment spec, apply ``quick:`` when asked (and ``extra_set``, overrides for every
    arm after the spec's ``set``), and check every key. A quick budget of the other kind than the spec's
    (``{tokens: T}`` for a spec at equal FLOPs) keeps the spec's comparison: it becomes the FLOPs (or tokens)
    of T tokens (or C FLOPs) of the reference arm as the quick settings build it."""
    spec, convert = _load(path, quick, extra_set)
    if not convert:
        return spec
    ref = next(a for a in resolve_arms(spec) if a.name == spec.reference)
    cfg = load_recipe(ref.recipe, ref.overrides)
    fpt = float(training_flops_per_token(model_config(cfg), int(cfg.train.seq_len)))
    return _load(path, quick, extra_set, (ref.name, fpt))[0]


def _load(path: str, quick: bool, extra_set: Sequence[str], convert_at=None) -> tuple[Spec, bool]:
    """:func:`load_spec`'s reading; returns the spec and whether its quick budget is of another kind than the
    spec's, so that it must be converted at ``convert_at`` ((reference arm, its FLOPs per token))."""
    p = Path(path)
    if not p.is_file():
        raise RecipeError(f"{path}: experiment spec not found (experiments live in experiments/<name>.yaml)")
    try:
        raw = OmegaConf.to_container(OmegaConf.load(p), resolve=False)  # ${...} stay for the recipes
    except Exception as e:
        raise RecipeError(f"{path}: not valid YAML ({e})") from None
    if not isinstance(raw, dict):
        raise RecipeError(f"{path}: an experiment spec is a YAML mapping (name, arms, budget, ...)")
    _check_keys(raw, SPEC_KEYS, path)
    quick_part = raw.pop("quick", None) or {}
    _check_keys(quick_part, QUICK_KEYS, f"{path}: quick")
    _check_measurements(quick_part.get("measurements"), f"{path}: quick.measurements")
    convert = False
    if quick:
        kind = _budget_kind(raw)
        raw["set"] = list(raw.get("set") or []) + QUICK_SET + list(quick_part.get("set") or [])
        raw["seeds"] = quick_part.get("seeds", [0])
        for key in ("budget", "budgets", "grid", "tune", "ceg", "finetune"):
            if key in quick_part:
                raw[key] = quick_part[key]
        raw["quick_defaults"] = quick_defaults(raw, quick_part, raw["seeds"])
        quick_kind = _budget_kind(raw)
        convert = kind in ("tokens", "flops") and quick_kind in ("tokens", "flops") and quick_kind != kind
        if convert and convert_at:
            raw["quick_defaults"].append(_convert_budgets(raw, kind, *convert_at))
        wanted = raw.get("measurements") or {}
        quick_measures = _merge({n: m.quick for n, m in MEASUREMENTS.items() if m.quick},
                                quick_part.get("measurements") or {})
        raw["measurements"] = _merge(wanted, {k: v for k, v in quick_measures.items() if k in wanted})
        if quick_part.get("arms"):
            raw["only_arms"] = list(quick_part["arms"])
    if extra_set:
        raw["set"] = list(raw.get("set") or []) + list(extra_set)
    budgets = expand_budgets(raw, path)
    for key in ("name", "arms", "budget"):
        if not raw.get(key):
            raise RecipeError(f"{path}: '{key}:' is required (see python -m tools.experiment --help)")
    design = looks.check(raw, path)  # seeds: {min, max, ...}: the first look's seeds
    seeds = list(range(design.min)) if design else raw.get("seeds", list(DEFAULT_SEEDS))
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and s >= 0 for s in seeds):
        raise RecipeError(f"{path}: seeds={seeds!r}: expected a list of integers >= 0, e.g. [0, 1, 2]")
    budget = _check_budget(raw["budget"], f"{path}: budget")
    common = sweep._as_override_list(raw.get("set"), "set")
    if any(o.split("=", 1)[0].strip() == "train.seed" for o in common):
        raise RecipeError(f"{path}: set: train.seed is chosen by 'seeds:'; remove it from 'set:'")
    grid = raw.get("grid") or {}
    if not isinstance(grid, dict) or "train.seed" in grid:
        raise RecipeError(f"{path}: grid={grid!r}: a mapping of key -> list of values, without train.seed")
    measurements = (_check_measurements(raw["measurements"], f"{path}: measurements") if "measurements" in raw
                    else None)
    if raw.get("tune") is None:  # no arm is compared at an lr that suits another arm better, by construction
        raise RecipeError(f"{path}: 'tune:' is required: each arm's lr tuned ({{lr: [1.0e-3, 2.0e-3, 4.0e-3]}}), "
                          "tuned at the muP base width and transferred ({lr: [...], mup: true}), or shared by design "
                          "({shared: <why>}); see tools/experiment/stages/tuning.py")
    tune = tuning.check(raw.get("tune"), list(range(design.max)) if design else seeds)
    if tune.searched and "train.lr" in grid:
        raise RecipeError(f"{path}: tune: and grid: train.lr both choose the lr; a grid over lr shares it by design "
                          "(write tune: {shared: <why>})")
    ceg = ceg_stage.check(raw.get("ceg"), seeds)
    margin = ceg_stage.check_margin(raw.get("margin"))
    verdicts = raw.get("verdicts") or "reference"
    if verdicts not in ("reference", "pairs", "parent"):
        raise RecipeError(f"verdicts={verdicts!r}: must be reference (every arm against the reference), "
                          "pairs (every arm that names a compare: arm against that arm) or parent (every arm against "
                          "the arm it extends)")
    finetune = finetune_stage.check(raw.get("finetune"), tune, seeds, _check_budget, f"{path}: finetune")
    if finetune is not None:
        if design is not None or grid:
            raise RecipeError(f"{path}: finetune: fine-tunes each arm's run of each seed; give a list of seeds and "
                              "no grid: (one pre-trained run per arm and seed)")
        measurements = {**(measurements or {}), "finetune": (measurements or {}).get("finetune") or {}}
    out = raw.get("out") or f"runs/experiments/{raw['name']}"
    arms = _arm_specs(raw["arms"])
    spec = Spec(name=raw["name"], arms=arms, budget=budget, tune=tune,
                reference=raw.get("reference") or arms[0].name,
                out=out.rstrip("/") + "-quick" if quick else out, spec_path=_relative(p), seeds=seeds, set=common,
                verdicts=verdicts, margin=margin, ceg=ceg, sequential=design, grid=raw.get("grid"),
                measurements=measurements, title=raw.get("title"), description=raw.get("description"),
                claim=raw.get("claim"), notes=raw.get("notes"), report=raw.get("report"), quick=quick,
                quick_defaults=raw.get("quick_defaults"), only_arms=raw.get("only_arms"),
                extra_set=list(extra_set) if extra_set else None, budgets=budgets, finetune=finetune)
    pairs = ((measurements or {}).get("finetune") or {}).get("pairs") or []
    bases = {base for _, _, group in spec.budget_groups() for base in group}
    for name in [n for p in pairs for n in p if n not in bases]:
        raise RecipeError(f"{path}: measurements.finetune.pairs names {name!r}, not an arm (the arms: "
                          f"{', '.join(sorted(bases))})")
    return spec, convert


def _budget_kind(raw: dict) -> Optional[str]:
    """The kind (tokens | flops) of a raw spec's ``budget:`` or first of its ``budgets:``; None when neither."""
    b = raw.get("budget") or (raw.get("budgets") or [None])[0]
    return next(iter(b)) if isinstance(b, dict) and len(b) == 1 else None


def _convert_budgets(raw: dict, kind: str, reference: str, fpt: float) -> str:
    """The quick budgets (in place) in the spec's own ``kind``, at the reference arm's FLOPs per token ``fpt``;
    returns the line that says so."""
    def convert(b: dict) -> dict:
        if not isinstance(b, dict) or len(b) != 1 or next(iter(b)) == kind:
            return b
        value = float(next(iter(b.values())))
        return {kind: float(f"{value * fpt if kind == 'flops' else value / fpt:.4g}")}

    was = raw.get("budget") or raw.get("budgets")
    if raw.get("budget"):
        raw["budget"] = convert(raw["budget"])
    if raw.get("budgets"):
        raw["budgets"] = [convert(b) for b in raw["budgets"]]
    now = raw.get("budget") or raw.get("budgets")
    words = "equal training FLOPs" if kind == "flops" else "equal tokens"
    return (f"quick budget {was} -> {now}: the spec compares at {words}, so the quick runs do too (at the "
            f"reference arm {reference}'s {fpt:.4g} training FLOPs per token)")


def expand_budgets(raw: dict, path) -> Optional[list[Budget]]:
    """``budgets: [B1, B2, ...]``: every arm once per budget (in place, in the YAML's mapping): arm ``a`` becomes
    ``a-<tag>`` (:func:`analysis.experiment_spec.budget_arm`) with that budget, its ``extends``, ``compare``, the
    reference and ``quick.arms`` renamed to the same budget's arms; returns the budgets (None without the key).
    Each (arm, budget) is an ordinary arm: tuned, trained and reported as any other."""
    entries = raw.get("budgets")
    if entries is None:
        return None
    where = f"{path}: budgets"
    if not isinstance(entries, list) or not entries:
        raise RecipeError(f"{where}={entries!r}: a list of budgets, e.g. [{{tokens: 5.0e6}}, {{tokens: 1.0e7}}]")
    if raw.get("budget"):
        raise RecipeError(f"{path}: give budget: (one) or budgets: (each arm at each), not both")
    budgets = [_check_budget(b, f"{where}[{i}]") for i, b in enumerate(entries)]
    tags = [budget_tag(b) for b in budgets]
    if any(b.timed for b in budgets) or len(set(tags)) < len(tags):
        raise RecipeError(f"{where}={entries!r}: distinct tokens or flops budgets (no match_time_of)")
    arms = raw.get("arms") or []
    if not all(isinstance(e, dict) and e.get("name") for e in arms):
        return budgets  # _arm_specs names the bad entry
    new = []
    for b in budgets:
        previous = None
        for i, entry in enumerate(arms):
            if entry.get("budget"):
                raise RecipeError(f"{path}: arms[{i}].budget: with budgets: every arm trains at each budget")
            e = {**entry, "name": budget_arm(str(entry["name"]), b), "budget": b.to_dict()}
            if entry.get("label"):  # the same model at two budgets: the label says which
                e["label"] = f"{entry['label']}, {budget_words(b)}"
            parent = previous if entry.get("extends") == "previous" else entry.get("extends")
            if parent:
                e["extends"] = budget_arm(str(parent), b)
            if entry.get("compare"):
                e["compare"] = budget_arm(str(entry["compare"]), b)
            if not entry.get("side"):
                previous = entry["name"]
            new.append(e)
    raw["arms"] = new
    raw["budget"] = budgets[0].to_dict()
    raw["reference"] = budget_arm(str(raw.get("reference") or arms[0]["name"]), budgets[0])
    if raw.get("only_arms"):
        raw["only_arms"] = [budget_arm(str(a), b) for b in budgets for a in raw["only_arms"]]
    return budgets


def quick_defaults(raw: dict, quick_part: dict, seeds: Sequence[int]) -> list[str]:
    """``--quick`` without a key in ``quick:``: the budget, the tuning grid and the compute curve's seeds
    shrink by :data:`QUICK_BUDGET` and :data:`QUICK_TUNE` (in place, in the YAML's mapping before it is
    checked); returns what was applied, one line each."""
    applied = []
    if "budgets" in raw and "budgets" not in quick_part:
        applied.append(f"budgets {raw['budgets']} -> [{QUICK_BUDGET}]")
        raw["budgets"] = [dict(QUICK_BUDGET)]
    elif "budget" not in quick_part and "budgets" not in quick_part:
        was = raw.get("budget")
        raw["budget"] = dict(QUICK_BUDGET)
        applied.append(f"budget {was} -> {QUICK_BUDGET}")
    tune = raw.get("tune")
    if "tune" not in quick_part and isinstance(tune, dict) and isinstance(tune.get("lr"), list) and tune["lr"]:
        lrs = sorted(float(v) for v in tune["lr"])
        new = {**tune, "lr": [lrs[0], lrs[-1]] if len(lrs) > 1 else lrs, **QUICK_TUNE}
        applied.append(f"tune.lr {tune['lr']} -> {new['lr']}, max_extend {tune.get('max_extend', 'default')} -> "
                       f"{QUICK_TUNE['max_extend']}")
        raw["tune"] = new
    ft = raw.get("finetune")
    if "finetune" not in quick_part and isinstance(ft, dict):
        new = {**ft, "budget": dict(QUICK_BUDGET)}
        if isinstance(ft.get("tune"), dict) and isinstance(ft["tune"].get("lr"), list) and ft["tune"]["lr"]:
            lrs = sorted(float(v) for v in ft["tune"]["lr"])
            new["tune"] = {**ft["tune"], "lr": [lrs[0], lrs[-1]] if len(lrs) > 1 else lrs, **QUICK_TUNE}
        applied.append(f"finetune.budget {ft.get('budget')} -> {QUICK_BUDGET}; finetune.tune -> {new.get('tune')}")
        raw["finetune"] = new
    ceg = raw.get("ceg")
    if "ceg" not in quick_part and isinstance(ceg, dict) and "seeds" in ceg and list(ceg["seeds"]) != list(seeds):
        applied.append(f"ceg.seeds {ceg['seeds']} -> {list(seeds)}")
        raw["ceg"] = {**ceg, "seeds": list(seeds)}
    return applied


def _arm_specs(entries) -> list[ArmSpec]:
    """The ``arms:`` entries as written, each a mapping with a safe, unrepeated name, known keys, overrides
    without train.seed and a budget of a known kind (how they chain is ``tools.experiment.arms``' job)."""
    out: list[ArmSpec] = []
    for i, entry in enumerate(entries):
        where = f"arms[{i}]"
        if not isinstance(entry, dict) or not entry.get("name"):
            raise RecipeError(f"{where}: each arm is a mapping with a 'name:' (and 'recipe:' or 'extends:')")
        _check_keys(entry, ARM_KEYS, f"{where} ({entry['name']})")
        name = str(entry["name"])
        if name in {a.name for a in out} or sweep._safe(name) != name:
            raise RecipeError(f"{where}: arm name {name!r} is repeated or has characters other than letters, digits, "
                              "'.', '_' and '-'")
        own = sweep._as_override_list(entry.get("set"), f"{where}.set")
        if any(o.split("=", 1)[0].strip() == "train.seed" for o in own):
            raise RecipeError(f"{where}.set: train.seed is chosen by 'seeds:'")
        budget = _check_budget(entry["budget"], f"{where}.budget") if entry.get("budget") else None
        out.append(ArmSpec(name=name, label=entry.get("label"), recipe=entry.get("recipe"),
                           extends=entry.get("extends"), set=own if "set" in entry else None, budget=budget,
                           side=entry.get("side"), note=entry.get("note"), compare=entry.get("compare")))
    return out


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


def _check_budget(budget, where: str) -> Budget:
    if not isinstance(budget, dict) or len(budget) != 1 and "match_time_of" not in budget:
        raise RecipeError(f"{where}={budget!r}: give one of {{tokens: T}}, {{flops: C}} or {{match_time_of: ARM}}")
    if "match_time_of" in budget:
        _check_keys(budget, ("match_time_of", "speed_of"), where)
        return Budget.from_dict(budget)
    kind, value = next(iter(budget.items()))
    if kind not in ("tokens", "flops"):
        raise RecipeError(f"{where}: unknown budget kind {kind!r}; use tokens or flops")
    try:
        ok = float(value) > 0
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise RecipeError(f"{where}.{kind}={value!r}: must be a positive number")
    return Budget(kind, value)


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
