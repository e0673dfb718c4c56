"""The sweep's design check: its planned points read as the designer's grid (:mod:`analysis.scaling.design.check`).

A sweep's scaling points are its full runs and cooldown branches (stable trunks are not points); each
ladder x grid cell other than ``train.seed`` is one family, its ``train.seed`` values its seeds. N is
``analysis.scaling``'s (total parameters, every expert of an MoE), D the planned tokens, C = F(N) D with each
size's training FLOPs per token F from archlab's cost model, and a point's FLOPs budget (``flops:``,
``cooldown.flops`` or ``cooldown.budgets``) puts it on that budget's IsoFLOP line. The unigram entropy is measured
on the training data (built or found in its cache, as the runs will) unless the spec's ``check.unigram`` states it.

Spec keys (all optional)::

    check:
      law: {E: 2.472, A: 1780, alpha: 0.656, B: 6873, beta: 0.636}  # planning law in total N (default: the CPU study's)
      noise: {sigma: 0.012, trunk_share: 0.5}   # seed noise of ln L per run, as analysis.scaling design's
      unigram: 6.3          # nats/token; default: measured on the training split
      margin: 0.2           # a point predicted within this of the unigram entropy is near it
      max_a_width: 0.5      # the widest expected 95% interval of a that passes
      sims: 40              # simulated studies per family
      seed: 0
      flops_per_s: 1.2e10   # training FLOPs a second per run, for the planned CPU time (default: about what the
                            # CPU study's smallest widths ran at on one thread)
"""

from __future__ import annotations

from typing import Optional

from analysis.scaling.design.check import CPU_LAW, MARGIN, MAX_A_WIDTH, GridCheck, check_grid, check_text
from analysis.scaling.design.spec import Noise, _keys, _law, _number
from analysis.scaling.fits.allocation import FlopsPerToken
from archlab.config import RecipeError, load_recipe, model_config
from archlab.costs import param_counts
from archlab.data import unigram_entropy
from archlab.objectives import token_data

CHECK_KEYS = ("law", "noise", "unigram", "margin", "max_a_width", "sims", "seed", "flops_per_s")
SEED_KEY = "train.seed"
FLOPS_PER_S = 1.2e10


def check_options(value) -> dict:
    """The spec's ``check:`` mapping, checked (RecipeError naming the key)."""
    try:
        d = _keys(value if value is not None else {}, "check", CHECK_KEYS)
        noise = _keys(d.get("noise") or {}, "check.noise", ("sigma", "trunk_share"))
        return {
            "law": _law(d.get("law"), CPU_LAW, "check.law"),
            "noise": Noise(sigma=_number(noise, "sigma", 0.012, lo=0.0, lo_open=False, where="check.noise."),
                           trunk_share=_number(noise, "trunk_share", 0.5, lo=0.0, lo_open=False, hi=1.0,
                                               where="check.noise.")),
            "unigram": _number(d, "unigram", None, where="check."),
            "margin": _number(d, "margin", MARGIN, lo=0.0, lo_open=False, where="check."),
            "max_a_width": _number(d, "max_a_width", MAX_A_WIDTH, where="check."),
            "sims": _number(d, "sims", 40, lo=1, lo_open=False, integer=True, where="check."),
            "seed": _number(d, "seed", 0, lo=0, lo_open=False, integer=True, where="check."),
            "flops_per_s": _number(d, "flops_per_s", FLOPS_PER_S, where="check."),
        }
    except ValueError as e:
        raise RecipeError(str(e).replace("design spec: ", "sweep spec: ")) from None


def _unigram(cfg, cache: dict, log) -> tuple[Optional[float], str]:
    """The unigram entropy of a recipe's training split (nats/token) and where it came from."""
    key = (str(cfg.data), int(cfg.model.vocab_size))
    if key not in cache:
        log("design check: reading the training data for its unigram entropy (built once, reused by the runs)")
        try:
            cache[key] = (float(unigram_entropy(token_data(cfg).train)), "measured on the training split")
        except RecipeError as e:
            cache[key] = (None, f"the training data could not be read ({e})")
    return cache[key]


def design_checks(spec: dict, points: list, log=print) -> tuple[list[GridCheck], str]:
    """Check every family of planned sweep ``points`` (:func:`tools.sweep.plan.plan_point` done); returns the
    checks and their text."""
    opts = check_options(spec.get("check"))
    families: dict[tuple, list] = {}
    for p in points:
        if p.role == "stable":
            continue
        cell = tuple(sorted((k, str(v)) for k, v in p.cell.items() if k != SEED_KEY))
        families.setdefault((p.ladder, "cooldown" if p.role == "cooldown" else "full", cell), []).append(p)
    checks, data_cache, unigrams = [], {}, []
    counts_cache: dict[tuple, float] = {}
    six_nd: dict[tuple, float] = {}
    for (ladder, role, cell), members in families.items():
        rows: dict[tuple, list] = {}  # (N, D, budget) -> the points (one per seed)
        fpt_of: dict[float, float] = {}  # N -> the size's training FLOPs per token
        for p in members:
            key = (p.recipe, tuple(p.overrides))
            if key not in counts_cache:
                counts = param_counts(model_config(load_recipe(p.recipe, p.overrides)))
                counts_cache[key] = float(counts.total)
                # what the point's FLOPs budget counts per token: measured, or 6 N (cooldown.compute: 6nd)
                six_nd[key] = 6.0 * counts.active_no_head
            six = bool(p.cooldown) and p.cooldown.get("compute") == "6nd"
            fpt_of[counts_cache[key]] = six_nd[key] if six else float(p.flops_per_token)
            tag = float(p.budget) if p.budget_kind == "flops" else None
            rows.setdefault((counts_cache[key], float(p.planned_tokens), tag), []).append(p)
        unigram, source = opts["unigram"], "stated in check.unigram"
        if unigram is None:
            unigram, source = _unigram(load_recipe(members[0].recipe, members[0].overrides), data_cache, log)
        unigrams.append((unigram, source))
        name = ladder + (" (cooldown branches)" if role == "cooldown" and any(
            f[1] == "full" for f in families if f[0] == ladder) else "") + "".join(f" {k}={v}" for k, v in cell)
        decay = members[0].cooldown.get("decay_fraction") if role == "cooldown" else None
        checks.append(check_grid(
            name, [ps[0].name for ps in rows.values()], [k[0] for k in rows], [k[1] for k in rows],
            [k[2] for k in rows], seeds=max(len(ps) for ps in rows.values()), decay_fraction=decay, law=opts["law"],
            noise=opts["noise"], unigram=unigram, margin=opts["margin"], max_a_width=opts["max_a_width"],
            sims=opts["sims"], seed=opts["seed"], fpt=FlopsPerToken.measured(list(fpt_of), list(fpt_of.values()))))
        if unigram is None:
            checks[-1].notes.append(f"unigram entropy unknown: {source}; near-unigram points not checked")
    flops = sum(_own_flops(p) for p in points)
    text = check_text(checks, opts["law"], *next(((u, s) for u, s in unigrams if u is not None),
                                                 (None, unigrams[0][1] if unigrams else "")))
    text += (f"\nplanned: {len(points)} runs, {flops:.3g} training FLOPs (archlab's count of the model's FLOPs; a "
             f"cooldown branch: its decay only), about {flops / opts['flops_per_s'] / 60:.2g} CPU-min at "
             f"{opts['flops_per_s']:.3g} FLOP/s per run (check.flops_per_s)")
    return checks, text


def _own_flops(p) -> float:
    """The training FLOPs of the steps a planned point trains itself (a branch starts at its trunk's step)."""
    start = p.cooldown.get("branch_step", 0) if p.role == "cooldown" and p.cooldown else 0
    return (p.max_steps - start) * p.tokens_per_step * p.flops_per_token
