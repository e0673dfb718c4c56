"""The markdown tables of fits.md: one function per section, each from the results it shows."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from analysis.scaling.compare import MultiplierCurve
from analysis.scaling.fits.common import OK, reported_status
from analysis.scaling.fits.noise import DesignNoise, NoiseFloor
from analysis.scaling.fits.power_law import PowerLawFit
from analysis.scaling.prediction import prediction_rows
from analysis.scaling.read import N_KINDS, Point, n_params
from analysis.scaling.study import FamilyStudy, n_sensitivity


def _v(value, ci=None, fmt: str = ".3f") -> str:
    """'1.700 [1.650, 1.750]'; '-' for no value; an unbounded side of an interval reads inf."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"

    def f(x):
        return "inf" if x is None or not math.isfinite(x) else format(x, fmt)

    return format(value, fmt) + (f" [{f(ci[0])}, {f(ci[1])}]" if ci else "")


def _ci(fit: PowerLawFit, name: str, fmt: str) -> str:
    lo_hi = fit.ci.get(name)
    return f" [{format(lo_hi[0], fmt)}, {format(lo_hi[1], fmt)}]" if lo_hi else ""


def _status(obj) -> str:
    """A table's status cell: a computed result's flags in place of "ok" (:func:`reported_status`) and
    its message; a failed one's status and flags."""
    flags = getattr(obj, "flags", None) or []
    if obj.status != OK:
        return f"{obj.status}: {'; '.join(flags)}" if flags else obj.status
    return reported_status(obj) + (f" ({obj.message})" if obj.message else "")


def fits_table(fits: dict[str, PowerLawFit]) -> str:
    """Markdown table of the fitted parameters with 95% bootstrap intervals."""
    lines = ["| family | points | E (nats) [95% CI] | alpha [95% CI] | A_ref at c_ref [95% CI] | c_ref (FLOPs) "
             "| A (C in FLOPs) | rms log residual | status |",
             "|---|---|---|---|---|---|---|---|---|"]
    for fam, f in fits.items():
        if f.status != "ok":
            lines.append(f"| {fam} | {f.n_points} | - | - | - | - | - | - | {f.status}: {f.message} |")
            continue
        lines.append(f"| {fam} | {f.n_points} | {f.E:.3f}{_ci(f, 'E', '.3f')} | "
                     f"{f.alpha:.3f}{_ci(f, 'alpha', '.3f')} | "
                     f"{f.A_ref:.3f}{_ci(f, 'A_ref', '.3f')} | {f.c_ref:.3g} | {f.A:.4g} | {f.rms_log_residual:.4f} | "
                     f"{reported_status(f)} ({f.n_boot} bootstrap fits over {f.ci_method or '-'}) |")
    return "\n".join(lines)


def points_table(points: list[Point], n_kind: str = "total") -> str:
    lines = [f"| run | family | N: {N_KINDS[n_kind]} | params (total / active) | tokens | training FLOPs "
             "| final val loss | seeds |", "|---|---|---|---|---|---|---|---|"]
    for p in sorted(points, key=lambda p: (p.family, p.flops)):
        seeds = f"{p.n_seeds} (std {p.loss_std:.4f}: {', '.join(p.seed_runs)})" if p.n_seeds > 1 else "1"
        lines.append(f"| {p.run} | {p.family} | {n_params(p, n_kind):,.0f} | {p.params_total:,} / {p.params_active:,} "
                     f"| {p.tokens:.3g} | "
                     f"{p.flops:.3g} | {p.loss:.4f} | {seeds} |")
    return "\n".join(lines)


def nd_table(studies: dict[str, FamilyStudy]) -> str:
    """Approach 3 parameters with 95% bootstrap intervals."""
    lines = ["| family | points (sizes x token counts) | E (nats) | A | alpha | B | beta | rms log residual "
             "| status |", "|---|---|---|---|---|---|---|---|---|"]
    for fam, st in studies.items():
        f = st.nd
        pts = f"{f.n_points} ({f.n_sizes} x {f.n_token_counts})"
        if f.status != OK:
            lines.append(f"| {fam} | {pts} | - | - | - | - | - | - | {f.status}: {f.message} |")
            continue
        ci = f.ci
        lines.append(f"| {fam} | {pts} | {_v(f.E, ci.get('E'))} | {_v(f.A, ci.get('A'), '.4g')} | "
                     f"{_v(f.alpha, ci.get('alpha'))} | {_v(f.B, ci.get('B'), '.4g')} | {_v(f.beta, ci.get('beta'))} | "
                     f"{f.rms_log_residual:.4f} | {reported_status(f)} ({f.n_boot} bootstrap fits over "
                     f"{f.ci_method or '-'}"
                     f"{'; ' + f.message if f.message else ''}) |")
    return "\n".join(lines)


def optimum_table(studies: dict[str, FamilyStudy]) -> str:
    """Compute-optimal N, D, D/N at the reference compute and a: C = F(N) D with each size's own measured training
    FLOPs per token (fits.allocation; a over the family's measured compute range), and C = 6 N D (Chinchilla's
    closed form, where a = beta / (alpha + beta)) beside it."""
    lines = ["| family | C counted as | C_ref (FLOPs) | N_opt | D_opt (tokens) | D_opt / N_opt | L_opt (nats) "
             "| a: slope of ln N_opt in ln C | FLOPs/token/N at N_opt | status |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for fam, st in studies.items():
        for opt, how in ((st.optimum, "measured"), (st.optimum_6nd, "6nd")):
            shapes = getattr(st.fpt, "shapes", ())
            which = (f"the cheapest of its {len(shapes)} ladders' measured F at each N" if shapes
                     else "each size's measured F")
            kdesc = (f"F(N) D, {which} (F/N {st.k_range[0]:.3g}-{st.k_range[1]:.3g} over sizes)"
                     if how == "measured" and st.k_range else "6 N D (Chinchilla)")
            if opt.C is None:
                lines.append(f"| {fam} | - | - | - | - | - | - | - | - | {_status(opt)} |")
                continue
            if opt.status != OK:
                lines.append(f"| {fam} | {kdesc} | {opt.C:.3g} | - | - | - | - | - | - | {opt.status} |")
                continue
            ci = opt.ci
            lines.append(f"| {fam} | {kdesc} | {opt.C:.3g} | {_v(opt.N_opt, ci.get('N_opt'), '.3g')} | "
                         f"{_v(opt.D_opt, ci.get('D_opt'), '.3g')} | "
                         f"{_v(opt.tokens_per_param, ci.get('tokens_per_param'), '.3g')} | "
                         f"{_v(opt.L_opt, ci.get('L_opt'))} | {_v(opt.a, ci.get('a'), '.2f')} | "
                         f"{_v(opt.k, ci.get('k'), '.3g')} | {_status(opt)} |")
    return "\n".join(lines)


def isoflop_table(studies: dict[str, FamilyStudy]) -> str:
    lines = ["| family | budget C (FLOPs) | points | sizes | N* [95% CI] | L* (nats) | interval from | status |",
             "|---|---|---|---|---|---|---|---|"]
    for fam, st in studies.items():
        if not st.iso.profiles:
            lines.append(f"| {fam} | - | 0 | 0 | - | - | - | {_status(st.iso)} |")
        for p in st.iso.profiles:
            lines.append(f"| {fam} | {p.budget:.3g} | {p.n_points} | {p.n_sizes} | "
                         f"{_v(p.N_opt, p.ci.get('N_opt'), '.3g')} | {_v(p.L_opt, None, '.4f')} | "
                         f"{p.ci_method or '-'} | {_status(p)} |")
    return "\n".join(lines)


def exponent_table(studies: dict[str, FamilyStudy]) -> str:
    """The three estimates of a in N_opt ∝ C^a side by side (b = 1 - a for D_opt when C ∝ N D)."""
    lines = ["| family | N | approach 1: envelope | approach 2: IsoFLOP minima | approach 3: L(N, D) fit "
             "| approaches 2 and 3 |", "|---|---|---|---|---|---|"]

    def cell(e: dict) -> str:
        if e["flags"] and e["a"] is not None:  # computed, but not to be read as ok
            return f"{_v(e['a'], e['ci'])} (b = {1 - e['a']:.3f}); {e['status']}"
        if e["status"] != OK or e["a"] is None:
            return f"{e['status']}: {e['message']}" if e["message"] else e["status"]
        return f"{_v(e['a'], e['ci'])} (b = {1 - e['a']:.3f})"

    for fam, st in studies.items():
        ex = st.exponents()
        lines.append(f"| {fam} | {N_KINDS[st.n_kind]} | {cell(ex['approach_1_envelope'])} | "
                     f"{cell(ex['approach_2_isoflop'])} | {cell(ex['approach_3_loss_nd'])} | "
                     f"{st.agreement()['verdict']} |")
    lines += ["", "Approach 1: N of the run on the lowest-loss-per-FLOP envelope of the validation curves against C "
              "(envelope points won by the smallest or largest size left out; interval: bootstrap over runs). "
              "Approach 2: N*(C) through the IsoFLOP minima whose parabola's vertex lies within the trained sizes "
              "(one whose lowest loss is at its smallest or largest size stays in, flagged 'minimum not bracketed'; "
              "interval: the minima's bootstrap draws; with "
              "WSD trunks, whole trunks resampled jointly over the budgets). "
              "Approach 3: beta / (alpha + beta) of the L(N, D) fit. b = 1 - a is the exponent of D_opt when "
              "C = k N D with k constant. Approaches 2 and 3 agree when the 95% interval of a3 - a2 (their bootstrap "
              "draws paired at random, as if independent: wider than a joint interval) holds 0."]
    return "\n".join(lines)


def n_sensitivity_table(sens: dict[str, dict[str, FamilyStudy]], n_kind: str) -> str:
    """The fitted exponents under each definition of N, side by side (the default first, marked)."""
    lines = ["| family | N | N range | alpha | beta | a (approach 3) "
             "| a at measured FLOPs over the study's C (approach 3) "
             "| a (approach 2) | status |", "|---|---|---|---|---|---|---|---|---|"]
    for fam, by_kind in n_sensitivity(sens).items():
        for kind, r in sorted(by_kind.items(), key=lambda kv: kv[0] != n_kind):
            name = N_KINDS[kind] + (" (used)" if kind == n_kind else "")
            rng = f"{r['N_range'][0]:.3g}-{r['N_range'][1]:.3g}" if r["N_range"] else "-"
            lines.append(f"| {fam} | {name} | {rng} | {_v(r['alpha'], r['alpha_ci'])} | "
                         f"{_v(r['beta'], r['beta_ci'])} | {_v(r['a_approach_3'], r['a_approach_3_ci'])} | "
                         f"{_v(r['a_measured'], r['a_measured_ci'])} | "
                         f"{_v(r['a_approach_2'], r['a_approach_2_ci'])} | {r['status']}"
                         + "".join(f"; approach 2: {g}" for g in r["approach_2_flags"]) + " |")
    return "\n".join(lines)


def multiplier_table(curves: list[MultiplierCurve]) -> str:
    if not curves:
        return "(one family: no compute multiplier)"
    lines = ["| reference | family | compared at equal N = | C range (FLOPs) | m at the smallest C [95%] "
             "| m at the middle C | m at the largest C | status |", "|---|---|---|---|---|---|---|---|"]

    def at(c: MultiplierCurve, j: int) -> str:
        return _v(c.multiplier[j], [c.lo[j], c.hi[j]] if c.lo else None, ".3g")

    for c in curves:
        if c.status != OK:
            lines.append(f"| {c.reference} | {c.family} | {N_KINDS[c.n_kind]} | - | - | - | - | {_status(c)} |")
            continue
        mid = len(c.C) // 2
        lines.append(f"| {c.reference} | {c.family} | {N_KINDS[c.n_kind]} | {c.C[0]:.3g}-{c.C[-1]:.3g} | "
                     f"{at(c, 0)} | {at(c, mid)} (C = {c.C[mid]:.3g}) | {at(c, -1)} | {_status(c)} |")
    lines += ["", "m(C): the reference family needs m times the compute to reach, compute-optimally, the loss the "
              "family reaches compute-optimally at C (from the two approach-3 fits, C = F(N) D with each size's own "
              "measured training FLOPs per token; m > 1: the family is more compute-efficient). Band: 95% over paired "
              "bootstrap fits. The N of a row changes the fits, not what C is: an MoE family is fitted with N = its "
              "active and with N = its total parameters."]
    return "\n".join(lines)


def holdout_table(studies: dict[str, FamilyStudy]) -> str:
    lines = ["| family | held out | fitted on | N | D (tokens) | measured (nats) | predicted [95% prediction interval] "
             "| error (predicted / measured - 1) | inside |", "|---|---|---|---|---|---|---|---|---|"]
    for fam, st in studies.items():
        h = st.holdout
        if h is None:
            continue
        what = (f"largest size N = {h.held_N:.3g}" if h.by == "size" and h.held_N else
                f"largest budget C = {h.held_budget:.3g} FLOPs" if h.held_budget else h.by)
        if h.status != OK:
            lines.append(f"| {fam} | {what} | {h.n_fit} points | - | - | - | - | - | {_status(h)} |")
            continue
        for r in h.rows:
            lines.append(f"| {fam} | {what} | {h.n_fit} points | {r['N']:.3g} | {r['D']:.3g} | {r['measured']:.4f} | "
                         f"{_v(r['predicted'], [r['lo'], r['hi']], '.4f')} | {r['rel_error']:+.2%} | "
                         f"{'yes' if r['inside'] else 'NO'} |")
    lines += ["", "Approach 3 refitted without the held-out points, then asked for their losses: "
              + "; ".join(f"{fam}: {st.holdout.n_inside} of {len(st.holdout.rows)} inside" for fam, st in
                          studies.items() if st.holdout is not None and st.holdout.status == OK) + "."]
    return "\n".join(lines)


def design_noise_table(dn: dict[str, DesignNoise]) -> str:
    lines = ["For `analysis.scaling design` (`noise: {sigma, trunk_share}`): sigma = std of ln L of one run, from "
             "the seed pairs' differences; trunk share = the share of it that the branches of one WSD trunk have in "
             "common, 1 - within-trunk variance / variance of the differences.", "",
             "| family | seed pairs | sigma (of ln L per run) | trunks with >= 2 branch pairs | trunk share | status |",
             "|---|---|---|---|---|---|"]
    for fam, d in dn.items():
        sig = "-" if d.sigma is None else f"{d.sigma:.4f}"
        share = "-" if d.trunk_share is None else f"{d.trunk_share:.2f}"
        lines.append(f"| {fam} | {d.n_pairs} | {sig} | {d.n_trunks} | {share} | {_status(d)} |")
    return "\n".join(lines)


def noise_table(noise: dict[str, NoiseFloor], overall: NoiseFloor) -> str:
    lines = ["| family | seed groups (>= 2 seeds) | runs | noise floor: pooled std (nats) | dof |",
             "|---|---|---|---|---|"]
    for fam, nf in [*noise.items(), ("all families", overall)]:
        std = f"{nf.std:.4f}" if nf.std is not None else f"- ({nf.status})"
        lines.append(f"| {fam} | {nf.n_groups} | {nf.n_runs} | {std} | {nf.dof} |")
    return "\n".join(lines)


def comparison_table(rows: list[dict]) -> str:
    if not rows:
        return "(no MoE runs: no dense-vs-MoE comparison)"
    lines = ["| MoE run | loss | dense family | dense loss at equal FLOPs (MoE - dense) "
             f"| dense loss at equal N = {N_KINDS['active']} (MoE - dense) |",
             "|---|---|---|---|---|"]

    def cell(d):
        return f"{d['loss']:.4f} ({d['moe_minus_dense']:+.4f})" if d else "out of range"

    for r in rows:
        fams = r["dense_families"] or ["-"]
        for fam in fams:
            ef, ea = r["equal_flops"].get(fam), r["equal_active_params"].get(fam)
            lines.append(f"| {r['run']} | {r['loss']:.4f} | {fam} | {cell(ef)} | {cell(ea)} |")
    return "\n".join(lines)


def equal_params_table(comparisons: list[dict]) -> str:
    if not comparisons:
        return "(no pair of a dense reference and an MoE family)"
    lines = ["| MoE point | reference | N active / total | D (tokens) | loss | MoE - reference at equal active N [95%] "
             "| MoE - reference at equal total N [95%] | N_eq / N active [95%] | N_eq / N total |",
             "|---|---|---|---|---|---|---|---|---|"]

    def diff(d: dict) -> str:
        return _v(d["moe_minus_reference"], d["ci"], "+.3f") + (" (extrapolated)" if d["extrapolated"] else "")

    for comp in comparisons:
        if comp["status"] != OK:
            lines.append(f"| - | {comp['reference']} | - | - | - | - | - | - | {comp['status']} |")
        for r in comp["rows"]:
            ext = " (extrapolated)" if r["N_eq_extrapolated"] else ""
            lines.append(f"| {r['run']} | {comp['reference']} | {r['N_active']:.3g} / {r['N_total']:.3g} "
                         f"| {r['D']:.3g} "
                         f"| {r['loss']:.4f} | {diff(r['equal_active'])} | {diff(r['equal_total'])} | "
                         f"{_v(r['N_eq_over_active'], r['N_eq_over_active_ci'], '.2f')}{ext} | "
                         f"{_v(r['N_eq_over_total'], r['N_eq_over_total_ci'], '.2f')} |")
    lines += ["", "The reference's approach-3 law L(N, D) evaluated at the MoE point's D and at its active or total N "
              f"({N_KINDS['non_embedding']}); N_eq: the reference's N that reaches the MoE's loss at that D. "
              "Intervals over the reference's bootstrap fits, "
              + "; ".join(f"{c['reference']} pair: the MoE loss moved by {c['loss_sd']:.4f} nats of seed noise"
                          if c.get("loss_sd") else f"{c['reference']} pair: no seed noise known, not included"
                          for c in comparisons) + "."]
    return "\n".join(lines)


def prediction_table(preds: list[dict], studies: dict[str, FamilyStudy], multipliers: list) -> str:
    """One table per --prediction: the design's expected 95% interval widths against the obtained ones."""
    if not preds:
        return "(no design given: --prediction FAM=PATH)"
    lines = ["| family | estimate | designer's spread of the estimate [range] | designer's one-study interval "
             "[range] | obtained [95% interval] | obtained width | verdict |", "|---|---|---|---|---|---|---|"]
    notes = []
    for pred in preds:
        for r in prediction_rows(pred, studies, multipliers):
            unit = "x" if r["ratio"] else ""
            rng = r["predicted_width_range"]
            predicted = f"{r['predicted_width']:.3g}{unit}" + (f" [{rng[0]:.3g}, {rng[1]:.3g}]" if rng else "")
            own, orng = r["predicted_own_width"], r["predicted_own_range"]
            own = "-" if own is None else f"{own:.3g}{unit}" + (f" [{orng[0]:.3g}, {orng[1]:.3g}]" if orng else "")
            got = "-" if r["value"] is None else _v(r["value"], r["ci"])
            width = "-" if r["width"] is None else f"{r['width']:.3g}{unit}"
            lines.append(f"| {pred['family']} ({Path(pred['path']).name}) | {r['quantity']} | {predicted} | {own} | "
                         f"{got} | {width} | {r['verdict']} |")
        noise = pred["design"].get("noise") or {}
        st = studies[pred["family"]]
        measured = (f"measured: seed std {st.noise.std:.4f} nats, {st.noise.std / float(np.mean(st.L)):.2%} of the "
                    "mean loss" if st.noise.status == OK else f"not measured ({st.noise.message})")
        notes.append(f"{pred['family']}: design {pred['path']} (family {pred['design_family']!r}, "
                     f"{pred['design'].get('sims')} simulated studies); noise assumed sigma = "
                     f"{noise.get('sigma', float('nan')):.3g} of ln L per run, {measured}.")
    lines += ["", "Designer's spread: the 97.5th - 2.5th percentile of the estimate over simulated studies of the "
              "planned grid under its planning law and noise, with the 95% range of that width over the "
              "simulations; one-study interval (designs with `fit.bootstrap`): the median width of each simulated "
              "study's own bootstrap interval, resampled as the study's, with its 2.5-97.5 percentile range, which "
              "the verdict then uses; obtained: the study's 95% bootstrap interval (multiplier widths as hi / lo). "
              + " ".join(notes)]
    return "\n".join(lines)
