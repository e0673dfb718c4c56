"""An experiment spec as types: what ``experiments/*.yaml`` says (``Spec`` and its parts) and the arms it
resolves to (``Arm``). ``tools.experiment.load`` builds and checks a ``Spec`` once from the YAML; the record
(``experiment.json``) carries it as ``Spec.to_dict()``, and the report reads it back with ``Spec.from_dict``,
so every stage reads fields. The keys are documented in ``tools/experiment/__init__.py``; the checks (errors
naming the key) live with the loader, which owns the YAML; these types live in analysis because the report
reads them and analysis never imports tools."""

from __future__ import annotations

from dataclasses import dataclass, field
from dataclasses import replace as _replace
from typing import Optional

from analysis.sequential import Design, as_dict

REFERENCE, PAIRS, PARENT = "reference", "pairs", "parent"  # the verdicts' families
TIMED = "match_time_of"
WORDS = ("title", "description", "claim", "notes")  # spec fields that describe, never change, the runs


@dataclass(frozen=True)
class Budget:
    """What one run trains: ``{tokens: T}`` or ``{flops: C}`` (``kind``, ``value`` as written), or the
    time of another arm's runs at an arm's speed (``{match_time_of: ARM, speed_of: ARM}``)."""

    kind: str  # tokens | flops | match_time_of
    value: Optional[float] = None
    match_time_of: Optional[str] = None
    speed_of: Optional[str] = None

    @property
    def timed(self) -> bool:
        return self.kind == TIMED

    def to_dict(self) -> dict:
        if not self.timed:
            return {self.kind: self.value}
        return {TIMED: self.match_time_of, **({"speed_of": self.speed_of} if self.speed_of is not None else {})}

    @classmethod
    def from_dict(cls, d: dict) -> "Budget":
        if TIMED in d:
            return cls(TIMED, match_time_of=d[TIMED], speed_of=d.get("speed_of"))
        kind, value = next(iter(d.items()))
        return cls(kind, value)


@dataclass(frozen=True)
class Tune:
    """How each arm's lr is chosen (``tools.experiment.stages.tuning``): a log grid searched per arm (``lr``), at the
    muP base width and transferred (``mup``), or shared by design (``shared``: the reason, nothing tuned)."""

    shared: Optional[str] = None
    budget_fraction: float = 1.0
    seed: int = 1000
    max_extend: int = 3
    lr: list[float] = field(default_factory=list)
    mup: bool = False

    @property
    def searched(self) -> bool:
        return self.shared is None

    def to_dict(self) -> dict:
        if self.shared is not None:
            return {"shared": self.shared}
        return {"budget_fraction": self.budget_fraction, "seed": self.seed, "max_extend": self.max_extend,
                "lr": list(self.lr), "mup": self.mup}

    @classmethod
    def from_dict(cls, d: dict) -> "Tune":
        if "shared" in d:
            return cls(shared=d["shared"])
        return cls(budget_fraction=d["budget_fraction"], seed=d["seed"], max_extend=d["max_extend"],
                   lr=list(d["lr"]), mup=d.get("mup", False))


@dataclass(frozen=True)
class Ceg:
    """The reference's compute curve (``tools.experiment.stages.ceg``): WSD trunks per seed, cooldown branches at
    ``fractions`` of the budget; ``arms_schedule: wsd`` trains every arm on the curve's schedule."""

    fractions: list[float]
    seeds: list[int]
    decay_fraction: float = 0.2
    shape: str = "sqrt"
    arms_schedule: str = "wsd"

    def to_dict(self) -> dict:
        return {"fractions": list(self.fractions), "seeds": list(self.seeds), "decay_fraction": self.decay_fraction,
                "shape": self.shape, "arms_schedule": self.arms_schedule}

    @classmethod
    def from_dict(cls, d: dict) -> "Ceg":
        return cls(list(d["fractions"]), list(d["seeds"]), d["decay_fraction"], d["shape"],
                   d.get("arms_schedule", "wsd"))


@dataclass(frozen=True)
class Margin:
    """The verdicts' equivalence margin: ``{ceg: [low, high]}`` (compute-equivalent gain) or ``{nats: m}``."""

    kind: str  # ceg | nats
    value: object  # [low, high] | m

    @property
    def nats(self) -> Optional[float]:
        return self.value if self.kind == "nats" else None

    @property
    def ceg(self) -> Optional[list[float]]:
        return self.value if self.kind == "ceg" else None

    def to_dict(self) -> dict:
        return {self.kind: self.value}

    @classmethod
    def from_dict(cls, d: dict) -> "Margin":
        kind, value = next(iter(d.items()))
        return cls(kind, value)


@dataclass(frozen=True)
class Finetune:
    """The fine-tuning stage (``tools.experiment.stages.finetune``): every arm's pre-trained run of each seed fine-tuned
    (``train.init_from``) with ``set`` (e.g. ``train.objective=classify``) for ``budget``, at the lr ``tune`` chooses
    per arm on the fine-tuning validation loss."""

    set: list[str]
    budget: Budget
    tune: Tune
    tasks: list[str] = field(default_factory=list)  # objectives, each fine-tuned on its own (``set`` names none)
    controls: bool = False  # also each base arm fine-tuned from a fresh init (no pre-training), per task

    def to_dict(self) -> dict:
        out = {"set": list(self.set), "budget": self.budget.to_dict(), "tune": self.tune.to_dict()}
        return {**out, "tasks": list(self.tasks), "controls": self.controls} if self.tasks else out

    @classmethod
    def from_dict(cls, d: dict) -> "Finetune":
        return cls(list(d["set"]), Budget.from_dict(d["budget"]), Tune.from_dict(d["tune"]), list(d.get("tasks") or []),
                   bool(d.get("controls", False)))

    def expand(self, arms: list["Arm"], seeded: dict[tuple[str, int], str],
               budgets: Optional[list[Budget]] = None) -> tuple[list["Arm"], dict, dict]:
        """(fine-tuning arms, their pre-trained runs {(arm, seed): run or "null"}, {arm: {base arm, task, control}})
        with ``tasks``: each arm once per task (``<arm>-<task>``, the objective after the arm's own overrides) and,
        with ``controls``, each base arm's first arm once per task from a fresh init (``<base>-scratch-<task>``,
        ``train.init_from=null``: the same architecture without pre-training). Without ``tasks``: unchanged."""
        if not self.tasks:
            return list(arms), dict(seeded), {a.name: {"base_arm": a.name, "task": None, "control": False}
                                              for a in arms}
        seeds = sorted({s for _, s in seeded})
        out, runs, meta = [], {}, {}
        for task in self.tasks:
            for a in arms:
                name = f"{a.name}-{task}"
                out.append(_replace(a, name=name, overrides=[*a.overrides, f"train.objective={task}"]))
                runs.update({(name, s): seeded[(a.name, s)] for s in seeds if (a.name, s) in seeded})
                meta[name] = {"base_arm": a.name, "task": task, "control": False}
            if self.controls:
                firsts: dict[str, Arm] = {}
                for a in arms:
                    suffix = next((f"-{budget_tag(b)}" for b in budgets or [] if a.name.endswith(f"-{budget_tag(b)}")),
                                  "")
                    firsts.setdefault(a.name[:len(a.name) - len(suffix)], a)
                for base, a in firsts.items():
                    name = f"{base}-scratch-{task}"
                    out.append(_replace(a, name=name, label=f"{a.label}, fresh init (control)",
                                        overrides=[*a.overrides, f"train.objective={task}"]))
                    runs.update({(name, s): "null" for s in seeds})
                    meta[name] = {"base_arm": base, "task": task, "control": True}
        return out, runs, meta


def budget_tag(b: Budget) -> str:
    """4096 tokens -> tok4096; 2.5e13 FLOPs -> flop2.5e13: the suffix of an arm's name per pre-training budget
    (``budgets:``), the same text ``tools.sweep`` names a point's budget by."""
    number = f"{float(b.value):.6g}".replace("e+0", "e").replace("e+", "e")
    return f"{'tok' if b.kind == 'tokens' else 'flop'}{number}"


def budget_words(b: Budget) -> str:
    """2.5e6 tokens -> '2.5M tokens': a budget as an arm's label names it (``budgets:``)."""
    value, kind = float(b.value), "tokens" if b.kind == "tokens" else "FLOPs"
    for unit, size in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= size:
            return f"{value / size:.3g}{unit} {kind}"
    return f"{value:.3g} {kind}"


def budget_arm(base: str, b: Budget) -> str:
    """The name of arm ``base`` at pre-training budget ``b`` (``budgets:``): ``gpt-tok5e6``."""
    return f"{base}-{budget_tag(b)}"


DEFAULT_MARGIN = Margin("ceg", [0.9, 1.1])  # "no difference": equivalent within 10% of compute (TOST)


@dataclass(frozen=True)
class ArmSpec:
    """One entry of ``arms:`` as written (None: the key is not given); ``tools.experiment.arms`` resolves it."""

    name: str
    label: Optional[str] = None
    recipe: Optional[str] = None
    extends: Optional[str] = None
    set: Optional[list[str]] = None
    budget: Optional[Budget] = None
    side: Optional[bool] = None
    note: Optional[str] = None
    compare: Optional[str] = None

    def to_dict(self) -> dict:
        out = {"name": self.name, "label": self.label, "recipe": self.recipe, "extends": self.extends,
               "set": self.set, "budget": self.budget.to_dict() if self.budget else None, "side": self.side,
               "note": self.note, "compare": self.compare}
        return {k: v for k, v in out.items() if v is not None}

    @classmethod
    def from_dict(cls, d: dict) -> "ArmSpec":
        return cls(**{**d, "budget": Budget.from_dict(d["budget"]) if d.get("budget") else None})


@dataclass(frozen=True)
class Arm:
    """One arm, resolved: the recipe and every override it trains with (common, quick, inherited, own)."""

    name: str
    label: str
    recipe: str
    overrides: list[str]
    own: list[str]  # the arm's own `set` (what it changes relative to `parent`)
    parent: Optional[str] = None
    budget: Budget = Budget("tokens")
    side: bool = False
    note: str = ""
    compare: Optional[str] = None  # one more arm to pair this one with in the tables

    @property
    def timed(self) -> bool:
        return self.budget.timed

    def to_dict(self) -> dict:
        return {"name": self.name, "label": self.label, "recipe": self.recipe, "overrides": list(self.overrides),
                "own": list(self.own), "parent": self.parent, "budget": self.budget.to_dict(), "side": self.side,
                "note": self.note, "compare": self.compare}

    @classmethod
    def from_dict(cls, d: dict) -> "Arm":
        """The arm of a record or a committed report.json (written by :meth:`to_dict`; other keys, e.g. the
        report's ``costs``, are not the arm's and are left out)."""
        return cls(name=d["name"], label=d["label"], recipe=d["recipe"], overrides=list(d["overrides"]),
                   own=list(d["own"]), parent=d.get("parent"), budget=Budget.from_dict(d["budget"]),
                   side=bool(d.get("side", False)), note=d.get("note") or "", compare=d.get("compare"))


@dataclass(frozen=True)
class Spec:
    """An experiment spec, checked (``tools.experiment.load.load_spec``). Optional keys the YAML does not give
    are None and stay out of :meth:`to_dict`; ``quick_defaults``, ``only_arms`` and ``extra_set`` are set by
    ``--quick`` and ``--set``."""

    name: str
    arms: list[ArmSpec]
    budget: Budget
    tune: Optional[Tune]  # always given by a spec (tools.experiment.load); None only in a record without it
    reference: str  # the first arm's name when the YAML names none
    out: str
    spec_path: str
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])  # a sequential design: its first look's seeds
    set: list[str] = field(default_factory=list)
    verdicts: str = REFERENCE
    margin: Margin = DEFAULT_MARGIN
    ceg: Optional[Ceg] = None
    sequential: Optional[Design] = None
    grid: Optional[dict] = None
    measurements: Optional[dict] = None  # {name: settings}, each checked by its measurement
    title: Optional[str] = None
    description: Optional[str] = None
    claim: Optional[str] = None
    notes: Optional[str] = None
    report: Optional[str] = None
    quick: bool = False
    quick_defaults: Optional[list[str]] = None
    only_arms: Optional[list[str]] = None
    extra_set: Optional[list[str]] = None
    budgets: Optional[list[Budget]] = None  # `budgets:`: every arm once per budget, named budget_arm(arm, b)
    finetune: Optional[Finetune] = None

    @property
    def wanted(self) -> dict:
        """The measurements the spec names, ``{}`` for none."""
        return self.measurements or {}

    def budget_groups(self) -> list[tuple[str, Optional[Budget], dict[str, str]]]:
        """[(tag, budget, {base arm name: arm name})] per pre-training budget, in the spec's order: one group of
        every arm (tag "", budget None) without ``budgets:``."""
        names = [a.name for a in self.arms]
        if not self.budgets:
            return [("", None, {n: n for n in names})]
        out = []
        for b in self.budgets:
            suffix = "-" + budget_tag(b)
            out.append((budget_tag(b), b, {n[:-len(suffix)]: n for n in names if n.endswith(suffix)}))
        return out

    def base_reference(self) -> str:
        """The reference arm's name without its budget's suffix (``budgets:``), else the reference."""
        for tag, _, arms in self.budget_groups():
            for base, name in arms.items():
                if name == self.reference:
                    return base
        return self.reference

    def to_dict(self) -> dict:
        """The spec as the record keeps it (JSON), read back by :meth:`from_dict`."""
        out = {"name": self.name, "title": self.title, "description": self.description, "claim": self.claim,
               "out": self.out, "report": self.report, "seeds": list(self.seeds), "budget": self.budget.to_dict(),
               "set": list(self.set), "grid": self.grid, "reference": self.reference,
               "arms": [a.to_dict() for a in self.arms], "tune": self.tune.to_dict() if self.tune else None,
               "verdicts": self.verdicts,
               "ceg": self.ceg.to_dict() if self.ceg else None, "margin": self.margin.to_dict(),
               "measurements": self.measurements, "notes": self.notes, "quick": self.quick,
               "quick_defaults": self.quick_defaults, "only_arms": self.only_arms, "extra_set": self.extra_set,
               "spec_path": self.spec_path, "sequential": as_dict(self.sequential) if self.sequential else None,
               "budgets": [b.to_dict() for b in self.budgets] if self.budgets else None,
               "finetune": self.finetune.to_dict() if self.finetune else None}
        return {k: v for k, v in out.items() if v is not None}

    @classmethod
    def from_dict(cls, d: dict) -> "Spec":
        """The spec of a record or a committed report.json (written by :meth:`to_dict`, or by the dict this
        type replaced: its keys in another order, ``margin``, ``verdicts`` and ``sequential`` maybe absent)."""
        seq = d.get("sequential")
        return cls(
            name=d["name"], arms=[ArmSpec.from_dict(a) for a in d["arms"]], budget=Budget.from_dict(d["budget"]),
            tune=Tune.from_dict(d["tune"]) if d.get("tune") else None, reference=d["reference"],
            out=d["out"], spec_path=d.get("spec_path", ""), seeds=list(d["seeds"]), set=list(d.get("set") or []),
            verdicts=d.get("verdicts") or REFERENCE,
            margin=Margin.from_dict(d["margin"]) if d.get("margin") else DEFAULT_MARGIN,
            ceg=Ceg.from_dict(d["ceg"]) if d.get("ceg") else None,
            sequential=Design(seq["min"], seq["max"], seq["step"], seq["spending"], seq["alpha"]) if seq else None,
            grid=d.get("grid"), measurements=d.get("measurements"), title=d.get("title"),
            description=d.get("description"), claim=d.get("claim"), notes=d.get("notes"), report=d.get("report"),
            quick=bool(d.get("quick", False)), quick_defaults=d.get("quick_defaults"), only_arms=d.get("only_arms"),
            extra_set=d.get("extra_set"),
            budgets=[Budget.from_dict(b) for b in d["budgets"]] if d.get("budgets") else None,
            finetune=Finetune.from_dict(d["finetune"]) if d.get("finetune") else None)
