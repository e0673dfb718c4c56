"""The lr chosen from the whole tuning grid, not from one noisy point: a parabola in log lr through the grid's
best point and its neighbours, its minimum taken inside the bracket, and the range of lrs whose fitted loss is
within the seed noise of the minimum (a flat or a sharp optimum).

One tuning run per lr differs from its neighbours by its seed's luck as well as by its lr; the argmin of the
grid follows that luck when neighbouring losses differ by less than the seed sd. A least-squares parabola
through up to five points around the best (two on each side) averages it, and stays inside the bracket
(between the best point's neighbours) so it never extrapolates.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

NEIGHBOURS = 2  # grid points on each side of the best that the parabola is fitted through


def choose(lrs: Sequence[float], losses: Sequence[Optional[float]], noise_sd: Optional[float] = None) -> dict:
    """{lr, grid_lr, kind ("parabola" | "grid"), reason, flat_low, flat_high, curvature, coef, points}.

    ``lrs`` increasing; ``losses`` None or inf for runs that diverged or did not learn. ``lr`` is the parabola's
    minimum, clamped to the bracket, or the grid's best when fewer than 3 finite points surround it or the
    parabola does not curve upwards. ``flat_low`` / ``flat_high``: where the parabola is within ``noise_sd``
    of its minimum, clipped to the fitted points (None without ``noise_sd`` or a parabola)."""
    vals = [math.inf if v is None or not math.isfinite(v) else float(v) for v in losses]
    i = int(np.argmin(vals))
    out = {"lr": float(lrs[i]), "grid_lr": float(lrs[i]), "kind": "grid", "reason": "", "flat_low": None,
           "flat_high": None, "curvature": None, "points": 1}
    if not math.isfinite(vals[i]):
        return {**out, "reason": "no lr learned"}
    if i == 0 or i == len(lrs) - 1:
        return {**out, "reason": "the best lr is at an end of the grid (not bracketed)"}
    idx = [j for j in range(max(0, i - NEIGHBOURS), min(len(lrs), i + NEIGHBOURS + 1)) if math.isfinite(vals[j])]
    if len(idx) < 3:
        return {**out, "reason": f"{len(idx)} finite points around the best (a parabola needs 3)"}
    x = np.log([lrs[j] for j in idx])
    y = np.array([vals[j] for j in idx])
    c2, c1, c0 = np.polyfit(x, y, 2)
    out["points"] = len(idx)
    if not c2 > 0:
        return {**out, "reason": "the points do not curve upwards around the best (flat or noisy): the grid's best"}
    x_star = float(np.clip(-c1 / (2 * c2), math.log(lrs[i - 1]), math.log(lrs[i + 1])))
    q_min = float(np.polyval([c2, c1, c0], x_star))
    out.update(lr=math.exp(x_star), kind="parabola", curvature=float(c2), coef=[float(c2), float(c1), float(c0)])
    if noise_sd is not None and noise_sd > 0:
        lo, hi = _flat(c2, c1, c0, q_min + noise_sd, x_star)
        out.update(flat_low=math.exp(max(lo, x.min())), flat_high=math.exp(min(hi, x.max())),
                   flat_open_low=lo < x.min(), flat_open_high=hi > x.max())
    return out


def regret(res: dict, lr: float) -> Optional[float]:
    """The fitted loss at ``lr`` above the fitted loss at the chosen lr (nats): what training at ``lr``
    instead costs on the parabola; None without one."""
    if res.get("kind") != "parabola":
        return None
    return float(np.polyval(res["coef"], math.log(lr)) - np.polyval(res["coef"], math.log(res["lr"])))


def _flat(c2: float, c1: float, c0: float, level: float, x_star: float) -> tuple[float, float]:
    """The x where the parabola equals ``level`` on both sides of its minimum (x_star when it never drops that
    low: a clamped minimum)."""
    disc = c1 * c1 - 4 * c2 * (c0 - level)
    if disc <= 0:
        return x_star, x_star
    r = math.sqrt(disc) / (2 * c2)
    v = -c1 / (2 * c2)
    return v - r, v + r


def describe(res: dict) -> str:
    """'2.9e-3 (parabola through 3 points; grid 4e-3; within noise 2.1e-3 .. 4.2e-3)'."""
    text = f"{res['lr']:.2g}"
    if res["kind"] == "parabola":
        text += f" (parabola through {res['points']} points; grid best {res['grid_lr']:g}"
    else:
        text += f" (grid best: {res['reason']}"
    if res.get("flat_low") is not None:
        lo = ("<=" if res.get("flat_open_low") else "") + f"{res['flat_low']:.2g}"
        hi = (">=" if res.get("flat_open_high") else "") + f"{res['flat_high']:.2g}"
        text += f"; within seed noise {lo} .. {hi}"
    return text + ")"
