"""The designer's prediction against the study: the 95% widths ``python -m analysis.scaling design``
predicted for a grid beside the intervals the study obtained (``--prediction``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from analysis.scaling.compare import MultiplierCurve
from analysis.scaling.fits.common import OK
from analysis.scaling.study import FamilyStudy


def read_prediction(spec: str, families: Sequence[str]) -> dict:
    """``FAM=PATH[:DESIGN_FAMILY]`` (``--prediction``): the designer's prediction (the JSON of
    ``python -m analysis.scaling design --out``) for the study family FAM; DESIGN_FAMILY names the
    design's family when it holds several (default: FAM if the design has it, else its only one)."""
    fam, sep, rest = spec.partition("=")
    if not sep or not fam or not rest:
        raise ValueError(f"--prediction {spec!r}: write FAM=PATH[:DESIGN_FAMILY], e.g. "
                         "llama=docs/scaling/design/prediction.json")
    path, _, design_family = rest.partition(":")
    if fam not in families:
        raise ValueError(f"--prediction {spec!r}: no family {fam!r} among the runs ({', '.join(families)})")
    try:
        design = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"--prediction {spec!r}: cannot read {path} ({e}); write it with "
                         "`python -m analysis.scaling design SPEC --out PATH`") from None
    spreads = design.get("spreads") or {}
    if not spreads:
        raise ValueError(f"--prediction {spec!r}: {path} holds no predicted spreads (not a design's JSON)")
    if not design_family:
        design_family = fam if fam in spreads else (next(iter(spreads)) if len(spreads) == 1 else "")
    if design_family not in spreads:
        raise ValueError(f"--prediction {spec!r}: name the design's family after the path, one of "
                         f"{', '.join(spreads)} (e.g. {fam}={path}:{next(iter(spreads))})")
    return {"family": fam, "path": path, "design_family": design_family, "design": design}


def _at_compute(curve: "MultiplierCurve", C: float) -> Optional[tuple[float, float, float]]:
    """(m, lo, hi) of a multiplier curve at compute C, interpolated in log C; None outside its range."""
    if curve.status != OK or not curve.lo or not curve.C[0] <= C <= curve.C[-1]:
        return None
    x = np.log(curve.C)
    return tuple(float(np.exp(np.interp(np.log(C), x, np.log(v)))) for v in (curve.multiplier, curve.lo, curve.hi))


def prediction_rows(pred: dict, studies: dict[str, FamilyStudy], multipliers: list) -> list[dict]:
    """The designer's predicted 95% widths beside the intervals the study obtained: approach 3's alpha,
    beta and a, approach 2's a (widths as differences) and the compute multiplier (as a ratio hi / lo)."""
    st = studies[pred["family"]]
    spreads = pred["design"]["spreads"][pred["design_family"]]
    pl = st.iso.power_law
    obtained = {"approach 3 alpha": (st.nd.alpha, st.nd.ci.get("alpha")),
                "approach 3 beta": (st.nd.beta, st.nd.ci.get("beta")),
                "approach 3 a": (st.nd.a_opt, st.nd.ci.get("a_opt")),
                "approach 2 a": (pl.slope if pl is not None and pl.status == OK else None,
                                 pl.ci.get("slope") if pl is not None and pl.status == OK else None)}
    rows = []
    for q, (value, ci) in obtained.items():
        sp = spreads.get(q)
        if sp is None:
            continue
        width = None if not ci else ci[1] - ci[0]
        rows.append({"quantity": q, "predicted_width": sp.get("width"), "predicted_width_range": sp.get("width_ci"),
                     "predicted_own_width": sp.get("own_width"), "predicted_own_range": sp.get("own_width_range"),
                     "planning_value": sp.get("true"), "value": value, "ci": ci, "width": width, "ratio": False})
    mult = (pred["design"].get("multipliers") or {}).get(pred["design_family"])
    C_ref = pred["design"].get("ref_flops")
    if mult and C_ref:  # every pair the family is in, as family or as reference (hi / lo is the same either way)
        mine = [c for c in multipliers if pred["family"] in (c.family, c.reference) and c.n_kind == st.n_kind]
        for c in mine:
            at = _at_compute(c, C_ref)
            rows.append({"quantity": f"compute multiplier of {c.family} vs {c.reference} at C = {C_ref:.3g}",
                         "predicted_width": mult.get("width"), "predicted_width_range": mult.get("width_ci"),
                         "predicted_own_width": None, "predicted_own_range": None,
                         "planning_value": mult.get("true"), "value": at[0] if at else None,
                         "ci": [at[1], at[2]] if at else None, "width": at[2] / at[1] if at else None,
                         "ratio": True})
    for r in rows:  # the obtained width is one study's bootstrap interval: set it against the simulated studies' own
        lo_hi = r["predicted_own_range"] or r["predicted_width_range"]  # intervals when the design computed them
        r["verdict"] = ("not determined" if r["width"] is None or not math.isfinite(r["width"]) else
                        "no predicted range" if not lo_hi else
                        "narrower than predicted" if r["width"] < lo_hi[0] else
                        "wider than predicted" if r["width"] > lo_hi[1] else "as predicted")
    return rows
