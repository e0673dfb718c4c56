"""The validation set's own sampling error beside each verdict, and the rule that lets a verdict leave it out.

A verdict's interval (``analysis.verdicts``) is the spread over seeds of paired per-seed values. Every run is
scored on the same validation windows, so the part of the evaluation error that changes with the seed (how a
seed's two models differ on those windows) is already in that spread; the part common to every seed is not:
the arms' mean difference on this draw of validation text, against the corpus it is drawn from. Its standard
error is sd_w(d_w) / sqrt(W), d_w the per-window loss difference averaged over the seeds (W windows; a slight
overestimate, as d_w keeps some seed noise). It needs each run's per-window losses (the ``val_sampling``
measurement). The rule: that error is at most a third of the seed error of the same paired difference in nats
(sd of the per-seed differences / sqrt(seeds)); then adding it in quadrature would widen the interval by at most
sqrt(1 + 1/9) - 1 = 5%. Each verdict states the numbers and whether the rule holds; where it does not, the factor
by which including the error would widen the interval. Without per-window losses (a report re-read from its
report.json), the ``val_sampling`` section's per-arm summary against the reference stands in: the mean over seeds
of each seed's own paired bootstrap half-width (/ 1.96, an upper bound on the common part).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from analysis.experiments import table

RATIO = 1 / 3  # evaluation error / seed error (both standard errors of the paired difference, nats): at most this
Z95 = 1.959963984540054  # a 95% bootstrap half-width is about this many standard errors


def paired_eval_se(arm_windows: dict[int, Sequence[float]], other_windows: dict[int, Sequence[float]]
                   ) -> Optional[tuple[float, int, int]]:
    """(se of the seed-averaged paired difference over the windows, windows, seeds) over the seeds both arms
    have per-window losses for (the same windows: equal lengths), or None with fewer than 2 windows."""
    seeds = sorted(s for s in set(arm_windows) & set(other_windows)
                   if len(arm_windows[s]) == len(other_windows[s]) and len(arm_windows[s]) > 1)
    if not seeds:
        return None
    diff_SW = np.array([np.asarray(arm_windows[s], float) - np.asarray(other_windows[s], float) for s in seeds])
    d_W = diff_SW.mean(axis=0)
    return float(d_W.std(ddof=1) / math.sqrt(d_W.size)), int(d_W.size), len(seeds)


def seed_se(arm_losses: dict[int, float], other_losses: dict[int, float]) -> Optional[tuple[float, int]]:
    """(sd of the per-seed paired differences / sqrt(seeds), seeds), or None with fewer than 2 common seeds."""
    seeds = [s for s in arm_losses if s in other_losses and _finite(arm_losses[s]) and _finite(other_losses[s])]
    if len(seeds) < 2:
        return None
    d = np.array([arm_losses[s] - other_losses[s] for s in seeds])
    return float(d.std(ddof=1) / math.sqrt(len(d))), len(d)


def _finite(v) -> bool:
    return v is not None and math.isfinite(v)


def check(ctx, verdicts: list[dict], summary: Optional[dict] = None) -> list[dict]:
    """Per verdict {arm, against, seed_se, eval_se, source, windows, ratio, holds, widen}: the rule of the module
    docstring. Windows from ``ctx.measures["val_sampling"]`` ({run point: per-window losses}); else, for a
    comparison against the reference, the ``val_sampling`` section's per-arm ``summary``; else eval_se None."""
    windows = ctx.measures.get("val_sampling") or {}
    arms = (summary or {}).get("arms") or {}
    out = []
    for r in verdicts:
        ga, go = ctx.group(r["arm"]), ctx.group(r["against"])
        row = {"arm": r["arm"], "against": r["against"], "seed_se": None, "eval_se": None, "source": None,
               "windows": None, "ratio": None, "holds": None, "widen": None}
        if ga is None or go is None:
            out.append(row)
            continue
        seeds = {int(s) for s in r.get("seeds") or []}
        la = {s: v for s, v in ga.losses().items() if s in seeds}
        lo = {s: v for s, v in go.losses().items() if s in seeds}
        ss = seed_se(la, lo)
        row["seed_se"] = ss[0] if ss else None
        wa = {s: windows[ga.runs[s]["point"]] for s in la if ga.runs[s]["point"] in windows}
        wo = {s: windows[go.runs[s]["point"]] for s in lo if go.runs[s]["point"] in windows}
        ev = paired_eval_se(wa, wo)
        if ev:
            row.update(eval_se=ev[0], windows=ev[1], source=f"per-window differences, {ev[2]} seeds")
        elif r["against"] == ctx.reference and (arms.get(r["arm"]) or {}).get("val_paired_half_width") is not None:
            a = arms[r["arm"]]
            row.update(eval_se=a["val_paired_half_width"] / Z95, windows=a.get("windows"),
                       source="per-seed bootstrap half-width / 1.96 (report.json)")
        if row["eval_se"] is not None and row["seed_se"]:
            ratio = row["eval_se"] / row["seed_se"]
            row.update(ratio=ratio, holds=ratio <= RATIO, widen=math.sqrt(1 + ratio * ratio))
        out.append(row)
    return out


def text(rows: list[dict], arm_label=lambda a: f"`{a}`") -> str:
    """The paragraph and table the verdict section prints (module docstring)."""
    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    body = [[arm_label(r["arm"]), f"`{r['against']}`", f(r["seed_se"], ".4f"), f(r["eval_se"], ".4f"),
             f(r["windows"], "d") if isinstance(r["windows"], int) else "-", f(r["ratio"], ".2f"),
             "not measured" if r["holds"] is None else "yes" if r["holds"] else "**no**",
             "-" if r["widen"] is None else f"{r['widen']:.3f}x", r["source"] or "-"] for r in rows]
    measured = [r for r in rows if r["holds"] is not None]
    failing = [r for r in measured if not r["holds"]]
    verdict = ("No verdict has the validation set's error measured (no `val_sampling` measurement): the rule is "
               "not checked, and the intervals hold the seeds' error only." if not measured else
               "The rule holds for every verdict measured." if not failing else
               f"The rule fails for {len(failing)} of {len(measured)} verdicts measured: their intervals leave out "
               "an error that would widen them by the factor in the table.")
    return ("Evaluation-set error (`analysis/eval_error.py`): each interval above is the spread over seeds; the "
            "validation windows are one draw of text, and the part of their error common to every seed is not in "
            "that spread. Its standard error (the per-window loss differences averaged over seeds: sd / "
            "sqrt(windows)) is set beside the seed standard error of the same paired difference in nats; the "
            "rule: at most a third (then including it would widen the interval by at most 5%). "
            + verdict + "\n\n"
            + table(["arm", "against", "seed se (nats)", "evaluation se (nats)", "windows", "ratio",
                     "evaluation <= 1/3 of seeds", "interval with it", "evaluation se from"], body))
