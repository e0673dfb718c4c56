"""Families against each other: MoE runs against dense families at equal FLOPs and equal active
parameters, MoE points against a dense reference's L(N, D) at equal active and equal total parameters,
and compute multipliers m(C) between pairs of families."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Optional, Sequence

import numpy as np

from analysis.scaling.fits.allocation import measured_multiplier
from analysis.scaling.fits.common import OK, _interval, json_safe
from analysis.scaling.fits.loss_nd import sample_fits
from analysis.scaling.fits.power_law import PowerLawFit
from analysis.scaling.read import N_KINDS, Point, n_params
from analysis.scaling.study import FamilyStudy

RANGE_SLACK = 1.05  # dense-vs-MoE comparisons reach 5% beyond a dense family's range


def compare_dense_moe(points: list[Point], fits: dict[str, PowerLawFit]) -> list[dict]:
    """For every MoE point: each dense family's loss at the same training FLOPs (from its fit,
    within the fitted range) and at the same active parameters (N of kind "active": non-embedding,
    LM head excluded, as every N of this module; interpolated in log N between
    that family's runs with the same token count, within their range). "Within" allows
    ``RANGE_SLACK`` (5%) beyond the ends: an MoE built to match a dense size sits just past it."""
    out = []
    dense_fams = sorted({p.family for p in points if not p.is_moe})
    for m in (p for p in points if p.is_moe):
        n_m = n_params(m, "active")
        row = {"run": m.run, "family": m.family, "flops": m.flops, "params_active": m.params_active, "N_active": n_m,
               "loss": m.loss, "dense_families": dense_fams, "equal_flops": {}, "equal_active_params": {}}
        for fam in dense_fams:
            ds = [p for p in points if p.family == fam]
            f = fits.get(fam)
            lo, hi = min(p.flops for p in ds), max(p.flops for p in ds)
            if f is not None and f.status == "ok" and lo / RANGE_SLACK <= m.flops <= hi * RANGE_SLACK:
                L = float(f.predict(m.flops))
                row["equal_flops"][fam] = {"loss": L, "moe_minus_dense": m.loss - L}
            same_t = sorted((p for p in ds if abs(p.tokens - m.tokens) <= 0.05 * m.tokens),
                            key=lambda p: n_params(p, "active"))
            n_t = [n_params(p, "active") for p in same_t]
            if len(same_t) >= 2 and n_t[0] / RANGE_SLACK <= n_m <= n_t[-1] * RANGE_SLACK:  # np.interp holds the ends
                L = float(np.interp(np.log(n_m), np.log(n_t), [p.loss for p in same_t]))
                row["equal_active_params"][fam] = {"loss": L, "moe_minus_dense": m.loss - L}
        out.append(row)
    return out


def _equivalent_n(fit, loss: float, D: float) -> float:
    """N at which L(N, D) = loss under ``fit``: inf when the loss is at or below what the law reaches at D
    with unlimited N (E + B / D^beta)."""
    excess = loss - fit.E - fit.B * D ** (-fit.beta)
    return math.inf if excess <= 0 else (fit.A / excess) ** (1.0 / fit.alpha)


def equal_params_comparison(ref: "FamilyStudy", moe_points: list[Point], loss_sd: Optional[float] = None,
                            seed: int = 0) -> dict:
    """Each (seed-averaged) point of an MoE family against the dense reference's approach-3 law L(N, D) at the
    same D: the reference's loss at the MoE's active N and at its total N (non-embedding, LM head excluded:
    the N of every table) and the MoE minus it; and N_eq, the reference's N that reaches the MoE's loss at D,
    over the MoE's active N (> 1: each active parameter is worth more than a dense one) and over its total N
    (< 1: the experts are worth less than as many dense parameters). 95% intervals over the reference's
    bootstrap fits, each draw with the MoE point's loss moved by normal noise of std ``loss_sd`` (its seed
    noise: the MoE family's noise floor, else all families'; None: not included, and the result says so). A
    value at an N outside the N range the reference was fitted on is an extrapolation, flagged."""
    nd = ref.nd
    out = {"reference": ref.family, "status": nd.status, "N_range": [min(ref.N), max(ref.N)] if ref.N else None,
           "loss_sd": loss_sd, "rows": []}
    if nd.status != OK or not moe_points:
        return out
    draws = sample_fits(nd)
    rng = np.random.default_rng(seed)
    lo, hi = out["N_range"]
    for p in sorted(moe_points, key=lambda p: (n_params(p, "active"), p.tokens)):
        n_act, n_tot, D = n_params(p, "active"), n_params(p, "non_embedding"), p.tokens  # total: every expert
        row = {"run": p.run, "family": p.family, "N_active": n_act, "N_total": n_tot, "D": D, "loss": p.loss}
        moe_L = p.loss + rng.normal(0.0, loss_sd or 0.0, len(draws))  # (n_boot,) the point's loss per draw
        for key, n in (("equal_active", n_act), ("equal_total", n_tot)):
            L = float(nd.E + nd.A * n ** (-nd.alpha) + nd.B * D ** (-nd.beta))
            diffs = [m - float(f.E + f.A * n ** (-f.alpha) + f.B * D ** (-f.beta)) for m, f in zip(moe_L, draws)]
            row[key] = {"N": n, "reference_loss": L, "moe_minus_reference": p.loss - L,
                        "ci": _interval(np.array(diffs)), "extrapolated": not (lo <= n <= hi)}
        n_eq = _equivalent_n(nd, p.loss, D)
        eqs = np.array([_equivalent_n(f, m, D) for m, f in zip(moe_L, draws)])
        row["N_eq"] = n_eq
        row["N_eq_extrapolated"] = not (lo <= n_eq <= hi)
        for key, n in (("N_eq_over_active", n_act), ("N_eq_over_total", n_tot)):
            row[key] = n_eq / n
            row[key + "_ci"] = _interval(eqs / n)  # an N_eq beyond the law's reach (inf): an unbounded side
        out["rows"].append(row)
    return out


MOE_KINDS = ("active", "total")  # an MoE family is also compared at equal active and at equal total parameters


def family_pairs(families: Sequence[str], pairs: Optional[Sequence[str]] = None,
                 reference: Optional[str] = None) -> list[tuple[str, str]]:
    """(reference, family) pairs: ``pairs`` as "REF:FAM" strings, else every family against
    ``reference`` (default: "dense" when present, else the first family by name)."""
    fams = sorted(families)
    if pairs:
        out = []
        for text in pairs:
            ref, sep, fam = str(text).partition(":")
            if not sep or ref not in fams or fam not in fams or ref == fam:
                raise ValueError(f"--pairs {text!r}: must be REF:FAM, two different families of {', '.join(fams)}")
            out.append((ref, fam))
        return out
    ref = reference or ("dense" if "dense" in fams else (fams[0] if fams else None))
    if reference is not None and reference not in fams:
        raise ValueError(f"--reference {reference!r}: valid are {', '.join(fams)}")
    return [(ref, f) for f in fams if f != ref]


@dataclass
class MultiplierCurve:
    """m(C) = C' / C, C' the compute at which ``reference`` reaches, compute-optimally, the loss that
    ``family`` reaches compute-optimally at C (:func:`analysis.scaling.fits.allocation.measured_multiplier` on
    the two approach-3 fits, C = F(N) D with each family's sizes' own training FLOPs per token). m > 1:
    ``family`` is m times more compute-efficient than the reference at C. Only over the C range
    both families measured. Band: 95% over the two families' bootstrap fits, draw i with draw i."""

    reference: str
    family: str
    n_kind: str
    status: str
    message: str = ""
    k_reference: Optional[float] = None
    k_family: Optional[float] = None
    C: list = field(default_factory=list)
    multiplier: list = field(default_factory=list)
    lo: list = field(default_factory=list)
    hi: list = field(default_factory=list)
    n_boot: int = 0

    def to_json(self) -> dict:
        return json_safe({**asdict(self), "N": N_KINDS[self.n_kind]})


def multiplier_curve(ref: FamilyStudy, other: FamilyStudy, n_grid: int = 25) -> MultiplierCurve:
    """The compute multiplier of ``other`` against ``ref`` (two studies with one N kind) on a grid of C
    over their common measured range."""
    out = MultiplierCurve(reference=ref.family, family=other.family, n_kind=ref.n_kind, status=OK,
                          k_reference=ref.k, k_family=other.k)
    for st in (ref, other):
        if st.nd.status != OK or not st.fpt:
            out.status, out.message = st.nd.status if st.nd.status != OK else "no-k", \
                f"{st.family}: no L(N, D) fit ({st.nd.message or 'no parameter count'})"
            return out
    lo, hi = max(min(ref.C), min(other.C)), min(max(ref.C), max(other.C))
    if not lo < hi:
        out.status, out.message = "no-common-compute", (f"{ref.family} spans C {min(ref.C):.3g}-{max(ref.C):.3g}, "
                                                        f"{other.family} {min(other.C):.3g}-{max(other.C):.3g} FLOPs")
        return out
    grid = np.geomspace(lo, hi, n_grid)
    out.C = grid.tolist()
    out.multiplier = [measured_multiplier(ref.nd, other.nd, c, ref.fpt, other.fpt) for c in grid]
    draws = [[measured_multiplier(r, o, c, ref.fpt, other.fpt) for c in grid]
             for r, o in zip(sample_fits(ref.nd), sample_fits(other.nd))]
    out.n_boot = len(draws)
    if draws:
        ivs = [_interval(np.asarray(col)) for col in np.asarray(draws, dtype=float).T]
        if all(iv is not None for iv in ivs):
            out.lo, out.hi = [iv[0] for iv in ivs], [iv[1] for iv in ivs]
    if not out.lo:
        out.message = f"{out.n_boot} paired bootstrap fits: no band (need >= 10)"
    return out


def compute_multipliers(sens: dict[str, dict[str, FamilyStudy]], pairs: list[tuple[str, str]], n_kind: str,
                        is_moe: dict[str, bool]) -> list[MultiplierCurve]:
    """Each pair at the report's N; a pair with an MoE family also at N = active and N = total."""
    out = []
    for ref, fam in pairs:
        kinds = [n_kind] + ([k for k in MOE_KINDS if k != n_kind] if is_moe.get(ref) or is_moe.get(fam) else [])
        out += [multiplier_curve(sens[ref][kind], sens[fam][kind]) for kind in kinds]
    return out
