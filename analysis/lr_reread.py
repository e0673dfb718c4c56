"""Each committed report's lrs re-chosen from the whole tuning grid, with the interval on the optimal lr.

A report.json keeps every arm's tuning grid (``tuning``: lrs, losses, which diverged or did not learn, the lr the
seeded runs trained at) and the seeded runs from which the report's seed sd is pooled. This module re-chooses each
arm's lr from its stored grid with the runner's own functions (``analysis.tuning_report.refit``, which calls
``analysis.lr_choice.choose``; the seed sd from ``analysis.tuning_report.seed_sd``, the number the report prints)
and asks whether the lr the seeded runs trained at lies inside the interval on the optimal lr. Nothing is
retrained; the verdicts compare arms each at its trained lr, so an arm whose trained lr lies outside its
interval is a caveat on that arm's verdicts.

    python -m analysis.lr_reread docs/experiments/*/report.json
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path
from typing import Optional

from analysis import lr_choice, tuning_report
from analysis.experiments import context_from_rows, table


def seed_sd(rep: dict) -> Optional[float]:
    """The pooled sd of the report's seeded runs within arms (``tuning_report.seed_sd``), None with no repeats."""
    record = {"spec": rep["spec"], "arms": rep["arms"], "runs": rep["runs"], "tuning": rep.get("tuning")}
    costs = {a["name"]: a.get("costs") for a in rep["arms"]}
    with tempfile.TemporaryDirectory() as out:  # the context names an output folder; nothing is written there
        ctx = context_from_rows(record, rep["runs"], [], {}, Path(out), costs=costs)
        return tuning_report.seed_sd(ctx)


def inside(fit: dict, lr: float) -> Optional[bool]:
    """Whether ``lr`` lies in the fit's interval (an open side holds everything beyond the grid's end); None
    without an interval."""
    if fit.get("low") is None:
        return None
    low = 0.0 if fit["open_low"] else fit["low"]
    high = math.inf if fit["open_high"] else fit["high"]
    return low * (1 - 1e-9) <= lr <= high * (1 + 1e-9)  # the trained lr is the old choice rounded to 3 digits


def reread(report_json: Path) -> dict:
    """{experiment, source, sd, arms: {arm: row}} for a report with a tuning section ({..., arms: {}} without
    one). A row: trained lr, the whole-grid fit (``lr_choice.choose``'s dict), whether the trained lr is inside
    its interval, the fitted cost of the trained lr, the grid's points (finite) and lrs tried."""
    rep = json.loads(Path(report_json).read_text())
    out = {"experiment": rep["spec"]["name"], "source": str(report_json), "sd": None, "arms": {}}
    if not rep.get("tuning"):
        return out
    sd = out["sd"] = seed_sd(rep)
    for arm, t in rep["tuning"].items():
        fit = tuning_report.refit(t, sd)
        trained = float(t["lr"])
        out["arms"][arm] = {"trained_lr": trained, "fit": fit, "inside": inside(fit, trained),
                            "cost_trained": lr_choice.regret(fit, trained), "points": fit["points"],
                            "tried": len(t["lrs"])}
    return out


def _ends(fit: dict) -> str:
    if fit.get("cost_low") is None:
        return "-"
    return f"+{fit['cost_low']:.3f} / +{fit['cost_high']:.3f}"


def _interval(fit: dict) -> str:
    """The interval alone ('0.0029 .. 0.0044', '<= 0.002 .. >= 0.008'), or why there is none."""
    if fit.get("low") is None:
        return f"- ({fit['reason']})"
    if fit.get("cost_low") is None:
        return lr_choice.interval_text(fit)
    return ("<= " if fit["open_low"] else "") + f"{fit['low']:.2g} .. " + \
        (">= " if fit["open_high"] else "") + f"{fit['high']:.2g}"


def markdown(res: dict) -> str:
    """One experiment's table (an empty string for a report without a tuning section)."""
    if not res["arms"]:
        return ""
    rows = []
    for arm, r in res["arms"].items():
        fit = r["fit"]
        lr = f"{fit['lr']:.3g}" + ("" if fit["kind"] == "parabola" else " (grid's best)")
        cost = "-" if r["cost_trained"] is None else f"{r['cost_trained']:.4f}"
        rows.append([f"`{arm}`", f"{r['trained_lr']:g}", lr, _interval(fit), _ends(fit),
                     {True: "yes", False: "**no**", None: "-"}[r["inside"]], cost, f"{r['points']} of {r['tried']}"])
    sd = "none (no repeated seeds)" if res["sd"] is None else f"{res['sd']:.4f} nats"
    head = (f"**{res['experiment']}** ([report.json]({Path(res['source']).parent.name}/report.json)); seed sd "
            f"{sd} (the pooled sd of the seeded runs within arms)")
    return head + "\n\n" + table(
        ["arm", "trained lr", "whole-grid lr", f"{100 * lr_choice.LEVEL:.0f}% interval on the optimal lr",
         "fitted loss at the interval's ends (nats above the minimum)", "trained lr inside",
         "fitted cost of the trained lr (nats)", "grid points (finite of tried)"], rows)


def summary(results: list[dict]) -> str:
    """How many arms' trained lrs lie inside their interval and equal the whole-grid lr, the intervals open on
    both sides, the widest closed ones and the largest fitted loss at an interval's end."""
    rows = [(res["experiment"], arm, r) for res in results for arm, r in res["arms"].items()]
    with_iv = [x for x in rows if x[2]["inside"] is not None]
    outside = [f"{e} `{a}`" for e, a, r in with_iv if not r["inside"]]
    same = [x for x in rows if f"{x[2]['fit']['lr']:.3g}" == f"{x[2]['trained_lr']:.3g}"]
    fits = [x for x in with_iv if x[2]["fit"].get("cost_low") is not None]
    both = [f"{e} `{a}`" for e, a, r in fits if r["fit"]["open_low"] and r["fit"]["open_high"]]
    one = [x for x in fits if x[2]["fit"]["open_low"] != x[2]["fit"]["open_high"]]
    closed = [x for x in fits if not (x[2]["fit"]["open_low"] or x[2]["fit"]["open_high"])]
    widest = sorted(closed, key=lambda x: -x[2]["fit"]["high"] / x[2]["fit"]["low"])[:3]
    costly = sorted(fits, key=lambda x: -max(x[2]["fit"]["cost_low"], x[2]["fit"]["cost_high"]))[:5]
    lines = [f"{len(rows)} tuned arms in {len(results)} reports, {len(with_iv)} with an interval: the trained lr "
             f"lies inside it in {len(with_iv) - len(outside)} of {len(with_iv)}"
             + (f" (outside: {', '.join(outside)})" if outside else "")
             + f"; the whole-grid lr equals the trained lr (3 significant digits) in {len(same)} of {len(rows)}.",
             f"Intervals open on both sides (the grid bounds the optimum on neither): {', '.join(both) or 'none'}; "
             f"open on one side: {len(one)}; closed: {len(closed)}"
             + ("; widest closed: " + ", ".join(f"{e} `{a}` {r['fit']['high'] / r['fit']['low']:.1f}x"
                                               for e, a, r in widest) if widest else "") + ".",
             "Largest fitted loss at an interval's end: " + ", ".join(
                 f"{e} `{a}` +{max(r['fit']['cost_low'], r['fit']['cost_high']):.3f}" for e, a, r in costly) + "."]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis.lr_reread", description=__doc__.split("\n\n")[0])
    p.add_argument("reports", nargs="+", type=Path, help="committed report.json files")
    a = p.parse_args(argv)
    results = []
    for path in a.reports:
        if not path.is_file():
            p.error(f"{path}: no such report.json (give a committed report's, e.g. "
                    "docs/experiments/evolution/report.json)")
        res = reread(path)
        if not res["arms"]:
            print(f"{res['experiment']}: no tuning section (its lrs were not tuned per arm); skipped\n")
            continue
        results.append(res)
        print(markdown(res) + "\n")
    print(summary(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
