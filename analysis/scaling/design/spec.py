"""A design spec read and checked: the assumed law, the noise model, the planned grid (sizes x budgets,
seeds, WSD cooldown branches) and the families, with errors by key. The spec's keys:
docs/methods/scaling-design.md ("Spec file")."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np
from omegaconf import OmegaConf

from analysis.scaling.fits.allocation import FlopsPerToken, allocation
from analysis.scaling.fits.common import OK
from analysis.scaling.fits.loss_nd import NDFit, compute_optimal

SPEC_KEYS = ("description", "sizes", "tokens", "flops", "budgets", "seeds", "cooldown", "law", "noise", "sims",
             "seed", "fit", "throughput", "families", "ref_flops", "data", "flops_per_token")
LAW_KEYS = ("E", "A", "alpha", "B", "beta")
NOISE_KEYS = ("sigma", "trunk_share")
FIT_KEYS = ("n_polish", "huber_delta", "budget_tolerance", "bootstrap")
COOLDOWN_KEYS = ("decay_fraction",)
THROUGHPUT_KEYS = ("flops_per_s", "tokens_per_s", "size")
DATA_KEYS = ("tokens", "max_epochs")
FAMILY_KEYS = ("law", "compute_multiplier", "seeds", "sizes", "tokens", "flops", "budgets")
GRID_KEYS = ("sizes", "tokens", "flops", "budgets")
BUDGET_KEYS = ("flops", "tokens", "sizes")


@dataclass(frozen=True)
class Law:
    """L(N, D) = E + A / N^alpha + B / D^beta (nats/token); default Besiroglu et al. 2024's Chinchilla fit."""

    E: float = 1.82
    A: float = 482.01
    alpha: float = 0.3478
    B: float = 2085.43
    beta: float = 0.3658

    @property
    def a(self) -> float:
        """Compute-optimal exponent: N_opt ∝ C^a, a = beta / (alpha + beta)."""
        return self.beta / (self.alpha + self.beta)

    def loss(self, N, D) -> np.ndarray:
        N, D = np.asarray(N, dtype=float), np.asarray(D, dtype=float)
        return self.E + self.A * N ** (-self.alpha) + self.B * D ** (-self.beta)

    def as_fit(self) -> NDFit:
        """The law as an exact :class:`NDFit` (for :func:`compute_optimal`)."""
        return NDFit(n_points=0, status=OK, E=self.E, A=self.A, alpha=self.alpha, B=self.B, beta=self.beta,
                     a_opt=self.a, b_opt=1.0 - self.a)

    def n_opt(self, C, fpt: Optional[FlopsPerToken] = None) -> np.ndarray:
        """Compute-optimal N at C FLOPs: C = 6 N D, or C = F(N) D with ``fpt`` (each size's FLOPs per token)."""
        if fpt is not None:
            return np.array([float(allocation(self.E, self.A, self.alpha, self.B, self.beta, float(c), fpt)["N_opt"][0])
                             for c in np.atleast_1d(C)])
        return np.array([compute_optimal(self.as_fit(), float(c), 6.0).N_opt for c in np.atleast_1d(C)])

    def with_compute_multiplier(self, k: float) -> "Law":
        """The law of a family k times more compute-efficient: A -> A k^-alpha, i.e. L'(N, D) = L(k N, D),
        whose compute-optimal loss at C is this law's at k C."""
        return replace(self, A=self.A * k ** (-self.alpha))


@dataclass(frozen=True)
class Noise:
    """Seed noise of one run's final loss: sigma = std of ln L; trunk_share = the share of sigma^2 that
    the cooldown branches of one WSD trunk have in common (used with ``cooldown`` only)."""

    sigma: float = 0.012
    trunk_share: float = 0.5


@dataclass
class Plan:
    """The planned grid: one entry per point (size, budget), P points."""

    N: np.ndarray  # (P,) parameters, as analysis.scaling counts N (total by default)
    D: np.ndarray  # (P,) training tokens
    budget: list  # (P,) the FLOPs budget of the point (IsoFLOP tag) or None for a token budget
    seeds: int = 1
    decay_fraction: Optional[float] = None  # None: independent runs; else WSD trunks with branches
    fpt: Optional[FlopsPerToken] = None  # each size's training FLOPs per token; None: 6 N (C = 6 N D)
    trunk: np.ndarray = field(init=False)  # (P,) index of the point's trunk (its size) in 0..T-1

    def __post_init__(self):
        self.N, self.D = np.asarray(self.N, dtype=float), np.asarray(self.D, dtype=float)
        self.trunk = np.unique(self.N, return_inverse=True)[1].ravel()

    @property
    def F(self) -> np.ndarray:
        """(P,) training FLOPs per token of each point's size."""
        return 6.0 * self.N if self.fpt is None else self.fpt(self.N)

    @property
    def C(self) -> np.ndarray:
        return self.F * self.D

    @property
    def n_runs(self) -> int:
        """Runs to train: points x seeds, or (trunks + branches) x seeds."""
        per_seed = len(self.N) + (int(self.trunk.max()) + 1 if self.decay_fraction is not None else 0)
        return per_seed * self.seeds

    def train_flops(self) -> float:
        """Training FLOPs of the whole sweep (the trunk convention: docs/methods/scaling-design.md)."""
        if self.decay_fraction is None:
            return float(self.seeds * np.sum(self.C))
        f, total = self.decay_fraction, 0.0
        for t in range(int(self.trunk.max()) + 1):
            D, F = self.D[self.trunk == t], self.F[self.trunk == t][0]
            total += F * ((1.0 - f) * D.max() + f * D.sum())
        return float(self.seeds * total)


@dataclass
class DesignSpec:
    """A checked spec (:func:`load_spec`)."""

    plan: Plan
    families: dict  # name -> Law; the first is the reference
    noise: Noise = field(default_factory=Noise)
    sims: int = 200
    seed: int = 0
    n_polish: int = 20
    huber_delta: float = 1e-3
    budget_tolerance: float = 0.1
    bootstrap: int = 0
    flops_per_s: Optional[float] = None
    data_tokens: Optional[float] = None  # unique training tokens of the corpus (None: not checked)
    max_epochs: float = 4.0
    ref_flops: Optional[float] = None
    description: str = ""
    multipliers: dict = field(default_factory=dict)  # name -> the compute multiplier the spec named
    plans: dict = field(default_factory=dict)  # name -> the family's own grid or seeds (others: ``plan``)

    def plan_of(self, family: str) -> Plan:
        return self.plans.get(family, self.plan)


def _err(key: str, value, rule: str) -> ValueError:
    shown = f"{value:g}" if isinstance(value, float) else repr(value)
    return ValueError(f"design spec: {key}={shown}: {rule}")


def _keys(d, key: str, valid: Sequence[str]) -> dict:
    if not isinstance(d, dict):
        raise _err(key, d, f"expected a mapping with keys {', '.join(valid)}")
    unknown = sorted(set(d) - set(valid))
    if unknown:
        where = f"{key}: " if key else ""
        raise ValueError(f"design spec: {where}unknown key(s) {unknown}; valid: {', '.join(valid)}")
    return d


def _number(d: dict, key: str, default, *, lo: float = 0.0, lo_open: bool = True, hi: Optional[float] = None,
            hi_open: bool = False, integer: bool = False, where: str = ""):
    name = f"{where}{key}"
    value = d.get(key, default)
    if value is None:
        return None
    try:
        x = int(value) if integer and float(value) == int(value) else float(value)
    except (TypeError, ValueError):
        raise _err(name, value, "expected a number") from None
    if integer and not isinstance(x, int):
        raise _err(name, value, "expected a whole number")
    below = x <= lo if lo_open else x < lo
    above = hi is not None and (x >= hi if hi_open else x > hi)
    if not math.isfinite(x) or below or above:
        rng = f"{'(' if lo_open else '['}{lo:g}, {'inf)' if hi is None else f'{hi:g}' + (')' if hi_open else ']')}"
        raise _err(name, value, f"must lie in {rng}")
    return x


def _positive(value, key: str, what: str) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise _err(key, value, f"expected a number ({what})") from None
    if not (math.isfinite(x) and x > 0):
        raise _err(key, value, f"must be positive and finite ({what})")
    return x


def _positive_list(value, key: str, what: str) -> list:
    if not isinstance(value, (list, tuple)) or not value:
        raise _err(key, value, f"expected a non-empty list of {what}")
    out = [_positive(v, f"{key}[{i}]", what) for i, v in enumerate(value)]
    if len(set(out)) != len(out):
        raise _err(key, value, "holds a value twice")
    return sorted(out)


def _budget_points(kind: str, budget: float, sizes: Sequence[float],
                   fpt: Optional[FlopsPerToken] = None) -> list[tuple[float, float, Optional[float]]]:
    """(N, D, FLOPs tag) of one budget's points: a FLOPs budget C gives D = C / F(N), F the size's training
    FLOPs per token (``fpt``; 6 N without it)."""
    if kind == "flops":
        return [(N, budget / (6.0 * N if fpt is None else float(fpt(N))), budget) for N in sizes]
    return [(N, budget, None) for N in sizes]


def flops_per_token_of(value) -> Optional[FlopsPerToken]:
    """The spec's ``flops_per_token: [[N, F], ...]`` (each size's training FLOPs per token, e.g. from archlab's
    cost model: ``archlab.costs.training_flops_per_token``) as F(N); None when absent (C = 6 N D)."""
    if value is None:
        return None
    hint = "expected a list of [N, F] pairs: N parameters, F training FLOPs per token of that size"
    if not isinstance(value, (list, tuple)) or not value:
        raise _err("flops_per_token", value, hint)
    pairs = []
    for i, pair in enumerate(value):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise _err(f"flops_per_token[{i}]", pair, hint)
        pairs.append((_positive(pair[0], f"flops_per_token[{i}][0]", "parameters"),
                      _positive(pair[1], f"flops_per_token[{i}][1]", "training FLOPs per token")))
    return FlopsPerToken.measured([n for n, _ in pairs], [f for _, f in pairs])


def _plan(spec: dict, fpt: Optional[FlopsPerToken] = None) -> list[tuple[float, float, Optional[float]]]:
    grid_hint = ("give sizes: [N...] (parameters) with tokens: [D...] or flops: [C...], or "
                 "budgets: [{flops: C, sizes: [N...]}, ...]")
    if "budgets" in spec:
        clash = [k for k in ("sizes", "tokens", "flops") if k in spec]
        if clash:
            raise ValueError(f"design spec: budgets: and {clash} both given; {grid_hint}")
        budgets = spec["budgets"]
        if not isinstance(budgets, (list, tuple)) or not budgets:
            raise _err("budgets", budgets, f"expected a non-empty list; {grid_hint}")
        points = []
        for j, b in enumerate(budgets):
            where = f"budgets[{j}]"
            _keys(b, where, BUDGET_KEYS)
            if ("flops" in b) == ("tokens" in b):
                raise _err(where, b, "give exactly one of flops: C or tokens: D, and sizes: [N...]")
            if "sizes" not in b:
                raise _err(where, b, "sizes is missing: add sizes: [N...] (parameters)")
            kind = "flops" if "flops" in b else "tokens"
            value = _positive(b[kind], f"{where}.{kind}", "training FLOPs" if kind == "flops" else "tokens")
            points += _budget_points(kind, value, _positive_list(b["sizes"], f"{where}.sizes", "parameters"), fpt)
        if len(set((N, D) for N, D, _ in points)) != len(points):
            raise _err("budgets", budgets, "two budgets give the same (N, D) point")
        return points
    if "sizes" not in spec:
        raise ValueError(f"design spec: sizes is missing: {grid_hint}")
    sizes = _positive_list(spec["sizes"], "sizes", "parameters")
    if ("flops" in spec) == ("tokens" in spec):
        raise ValueError("design spec: give exactly one of tokens: [D...] or flops: [C...] (C = 6 N D, or F(N) D with "
                         f"flops_per_token:) with sizes:; "
                         f"{grid_hint}")
    kind = "flops" if "flops" in spec else "tokens"
    budgets = _positive_list(spec[kind], kind, "training FLOPs" if kind == "flops" else "tokens")
    return [p for b in budgets for p in _budget_points(kind, b, sizes, fpt)]


def _law(d, base: Law, key: str) -> Law:
    d = _keys(d if d is not None else {}, key, LAW_KEYS)
    values = {k: _number(d, k, getattr(base, k), where=f"{key}.") for k in LAW_KEYS}
    return Law(**values)


def load_spec(source: Union[str, Path, dict]) -> DesignSpec:
    """Read and check a design spec (a YAML file or a mapping); every mistake is a ValueError that
    names the key, its value and the rule."""
    if isinstance(source, dict):
        spec = source
    else:
        path = Path(source)
        if not path.is_file():
            raise ValueError(f"design spec: no such file {str(path)!r}")
        spec = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    if not isinstance(spec, dict):
        raise ValueError(f"design spec: expected a mapping of keys ({', '.join(SPEC_KEYS)}), got {type(spec).__name__}")
    _keys(spec, "", SPEC_KEYS)
    fpt = flops_per_token_of(spec.get("flops_per_token"))
    points = _plan(spec, fpt)
    seeds = _number(spec, "seeds", 1, lo=1, lo_open=False, integer=True)
    cooldown = spec.get("cooldown")
    decay = None
    if cooldown is True:
        cooldown = {}
    if cooldown not in (None, False):
        decay = _number(_keys(cooldown, "cooldown", COOLDOWN_KEYS), "decay_fraction", 0.2, hi=1.0, hi_open=True,
                        where="cooldown.")
    plan = Plan(N=[p[0] for p in points], D=[p[1] for p in points], budget=[p[2] for p in points], seeds=seeds,
                decay_fraction=decay, fpt=fpt)
    law = _law(spec.get("law"), Law(), "law")
    noise_d = _keys(spec.get("noise") or {}, "noise", NOISE_KEYS)
    noise = Noise(sigma=_number(noise_d, "sigma", 0.012, lo=0.0, lo_open=False, where="noise."),
                  trunk_share=_number(noise_d, "trunk_share", 0.5, lo=0.0, lo_open=False, hi=1.0, where="noise."))
    fit_d = _keys(spec.get("fit") or {}, "fit", FIT_KEYS)
    thr = _keys(spec.get("throughput") or {}, "throughput", THROUGHPUT_KEYS)
    data_d = _keys(spec.get("data") or {}, "data", DATA_KEYS)
    flops_per_s = _number(thr, "flops_per_s", None, where="throughput.")
    if "tokens_per_s" in thr:
        if flops_per_s is not None or "size" not in thr:
            raise _err("throughput", thr, "give flops_per_s: F, or tokens_per_s: T with size: N (the model "
                                          "size it was measured at; F = 6 N T)")
        flops_per_s = 6.0 * _number(thr, "tokens_per_s", None, where="throughput.") \
            * _number(thr, "size", None, where="throughput.")
    families, multipliers, plans = {}, {}, {}
    fam = spec.get("families")
    if fam is None:
        families["assumed"] = law
    else:
        if not isinstance(fam, dict) or not fam:
            raise _err("families", fam, "expected a mapping name -> {law: {...}} or {compute_multiplier: k}; "
                                        "the first is the reference")
        for name, d in fam.items():
            d = _keys(d if d is not None else {}, f"families.{name}", FAMILY_KEYS)
            f_law = _law(d.get("law"), law, f"families.{name}.law")
            k = _number(d, "compute_multiplier", None, where=f"families.{name}.")
            if k is not None:
                f_law, multipliers[str(name)] = f_law.with_compute_multiplier(k), k
            families[str(name)] = f_law
            if any(key in d for key in (*GRID_KEYS, "seeds")):  # the family's own grid (and/or seeds)
                own = {key: d[key] for key in GRID_KEYS if key in d}
                try:
                    f_points = _plan(own, fpt) if own else points
                except ValueError as e:
                    raise ValueError(f"families.{name}: {e}") from None
                plans[str(name)] = Plan(N=[p[0] for p in f_points], D=[p[1] for p in f_points],
                                        budget=[p[2] for p in f_points], decay_fraction=decay, fpt=fpt,
                                        seeds=_number(d, "seeds", seeds, lo=1, lo_open=False, integer=True,
                                                      where=f"families.{name}."))
    return DesignSpec(
        plan=plan, families=families, noise=noise,
        sims=_number(spec, "sims", 200, lo=1, lo_open=False, integer=True),
        seed=_number(spec, "seed", 0, lo=0, lo_open=False, integer=True),
        n_polish=_number(fit_d, "n_polish", 20, lo=1, lo_open=False, integer=True, where="fit."),
        huber_delta=_number(fit_d, "huber_delta", 1e-3, where="fit."),
        budget_tolerance=_number(fit_d, "budget_tolerance", 0.1, lo=0.0, lo_open=False, where="fit."),
        bootstrap=_number(fit_d, "bootstrap", 0, lo=0, lo_open=False, integer=True, where="fit."),
        flops_per_s=flops_per_s, ref_flops=_number(spec, "ref_flops", None),
        data_tokens=_number(data_d, "tokens", None, where="data."),
        max_epochs=_number(data_d, "max_epochs", 4.0, where="data."),
        description=str(spec.get("description") or ""), multipliers=multipliers, plans=plans)
