"""Re-read a committed experiment report's verdicts with the current inference, from its report.json alone.

A report.json keeps every run's final loss and training FLOPs (``runs``), the reference's compute-curve
branches (``curve_runs``) and each arm's tuning grid (``tuning``): enough to decide every comparison again
(``analysis.ceg_report.compare``, one paired inference per comparison, ``analysis.verdicts``) and to choose
each lr again from the whole grid (``analysis.lr_choice``) without any run folder. Nothing is retrained:
the seeded runs stay at the lr they trained at, and the lr table says whether that lr lies within seed
noise of the grid's fitted minimum.

    python -m analysis.reanalyse docs/experiments/*/report.json

writes ``reanalysis/verdicts.md`` and ``reanalysis/verdicts.json`` (with the section figures) beside each
report.json, and puts a pointer to them under the report's title.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Optional

from analysis import ceg_report, experiment_report, lr_choice, tuning_report
from analysis.experiment_spec import Spec
from analysis.experiments import context_from_rows, table
from archlab.io import write_json_atomic, write_text_atomic

FOLDER = "reanalysis"
POINTER = "<!-- reanalysis -->"


def reanalyse(report_json: Path) -> dict:
    """Decide the report's comparisons again; write reanalysis/verdicts.{md,json}; return the json's data."""
    report_json = Path(report_json)
    rep = json.loads(report_json.read_text())
    spec = Spec.from_dict(rep["spec"])
    name = spec.name
    if spec.grid:  # a grid's cells are compared in its own sections, without a compute curve
        return {"experiment": name, "source": str(report_json), "changes": [], "lr": {}, "skipped": "a grid"}
    out = report_json.parent / FOLDER
    out.mkdir(exist_ok=True)
    record = {"spec": rep["spec"], "arms": rep["arms"], "runs": rep["runs"], "tuning": rep.get("tuning"),
              "tune_wall_s": rep.get("tune_wall_s")}
    costs = {a["name"]: a.get("costs") for a in rep["arms"]}
    ctx = context_from_rows(record, rep["runs"], rep.get("curve_runs") or [], {}, out, costs=costs)
    md = [f"# {spec.title or name}: verdicts re-read", "",
          f"From [report.json](../report.json) alone (`python -m analysis.reanalyse {report_json}`): the same "
          f"{len(rep['runs'])} seeded runs and {len(rep.get('curve_runs') or [])} compute-curve runs, decided "
          "again by one paired inference per comparison (`analysis/verdicts.py`), each lr chosen again from its "
          "whole tuning grid (`analysis/lr_choice.py`). Nothing was retrained.", ""]
    data: dict = {"experiment": name, "source": str(report_json), "changes": [], "lr": {}}
    ctx.comparison = ceg_report.compare(ctx)
    data["comparison"] = ctx.comparison
    data["changes"] = changes(rep.get("comparison") or {}, ctx.comparison)
    md += ["## What changed", "", changes_table(data["changes"], ctx), "",
           "## Results (re-read)", "", experiment_report.main_table(ctx), ""]
    sec = ceg_report.section(ctx, (rep.get("sections") or {}).get("val_sampling"))
    md += [f"## {sec.title}", "", sec.markdown.strip(), ""]
    if rep.get("tuning"):
        data["lr"] = lr_checks(ctx)
        md += ["## The lr each arm trained at, against the fitted choice", "",
               lr_table(data["lr"], ctx, data["changes"]), ""]
    write_text_atomic(out / "verdicts.md", "\n".join(md))
    write_json_atomic(out / "verdicts.json", data)
    point_to(report_json.parent / "report.md")
    return data


def changes(old: dict, new: dict) -> list[dict]:
    """Per arm: the earlier verdict and CEG beside the re-read ones."""
    rows = []
    for arm, n in new.get("arms", {}).items():
        o = (old.get("arms") or {}).get(arm) or {}
        v = n.get("verdict") or {}
        o_ceg = o.get("ceg") or {}
        rows.append({"arm": arm, "old_against": (o.get("tests") or {}).get("against"), "old_class": o.get("class"),
                     "old_ceg": o_ceg.get("ceg"), "old_low": o_ceg.get("low"), "old_high": o_ceg.get("high"),
                     "against": v.get("against"), "class": n.get("class"), "scale": v.get("scale"),
                     "estimate": v.get("ceg") if v.get("scale") == "ln CEG" else v.get("mean"),
                     "low": v.get("ceg_low") if v.get("scale") == "ln CEG" else v.get("low"),
                     "high": v.get("ceg_high") if v.get("scale") == "ln CEG" else v.get("high"),
                     "level": None if v.get("alpha_interval") is None else 1 - v["alpha_interval"],
                     "seeds_needed": v.get("seeds_needed"),
                     "changed": bool(v) and o.get("class") != n.get("class")})
    return rows


def _iv(est: Optional[float], lo: Optional[float], hi: Optional[float], unit: str = "x") -> str:
    if est is None:
        return "-"
    if unit == "x":
        return f"{est:.2f}x" + ("" if lo is None or hi is None else f" [{lo:.2f}, {hi:.2f}]")
    return f"{est:+.3f}" + ("" if lo is None or hi is None else f" [{lo:+.3f}, {hi:+.3f}]")


def changes_table(rows: list[dict], ctx) -> str:
    body = []
    for r in rows:
        if r["class"] is None:
            continue  # an arm with a CEG against the reference but no verdict of its own
        unit = "x" if r["scale"] == "ln CEG" else "nats"
        new = _iv(r["estimate"], r["low"], r["high"], unit) + ("" if unit == "x" else " nats")
        level = "-" if r["level"] is None else f"{100 * r['level']:.1f}%"
        body.append([f"{ctx.arms[r['arm']].label} (`{r['arm']}`)", f"`{r['old_against'] or '-'}`",
                     r["old_class"] or "-", _iv(r["old_ceg"], r["old_low"], r["old_high"]), f"`{r['against']}`",
                     f"**{r['class']}**", new, level, "yes" if r["changed"] else "no"])
    return ("The earlier verdicts came from a paired t-test on the losses while the CEG beside them came from an "
            "unpaired bootstrap at 95%: an interval could exclude 1 beside 'unresolved'. Now both are one "
            "inference, the interval printed at the verdict's Holm level.\n\n"
            + table(["arm", "earlier: against", "earlier verdict", "earlier CEG [95%, unpaired bootstrap]",
                     "now: against", "verdict", "estimate [interval at the verdict's level]", "level", "changed"],
                    body))


def lr_checks(ctx) -> dict:
    """Per tuned arm: the lr its seeded runs trained at, the fitted choice and its range within seed noise."""
    noise = tuning_report.seed_sd(ctx)
    out = {}
    for arm, t in (ctx.record.get("tuning") or {}).items():
        fit = tuning_report.refit(t, noise)
        trained = t["lr"]  # the seeded runs' lr: the grid's best run in older records, the fitted choice in newer
        cost = lr_choice.regret(fit, trained) if fit else None
        out[arm] = {"trained_lr": trained, "fitted_lr": fit["lr"] if fit else None,
                    "kind": fit["kind"] if fit else "grid", "flat_low": fit.get("flat_low") if fit else None,
                    "flat_high": fit.get("flat_high") if fit else None, "regret": cost, "noise_sd": noise,
                    "within_noise": None if cost is None or not noise else cost <= noise,
                    "ratio": (fit["lr"] / trained) if fit else None, "fitted_record": "choice" in t}
    return out


def lr_table(checks: dict, ctx, comparisons: list[dict]) -> str:
    """Per arm: the trained and fitted lr and the fitted loss the trained lr costs; per comparison: the
    difference of the two arms' costs, the share of the verdict's loss difference an lr off its optimum
    could explain."""
    rows = []
    for arm, c in checks.items():
        flat = "-" if c["flat_low"] is None else f"{c['flat_low']:.2g} .. {c['flat_high']:.2g}"
        fitted = "-" if c["fitted_lr"] is None else f"{c['fitted_lr']:.2g} ({c['kind']})"
        cost = "-" if c["regret"] is None else f"{c['regret']:.4f}" + ("" if c["within_noise"] else " (> seed sd)")
        rows.append([f"{ctx.arms[arm].label} (`{arm}`)", f"{c['trained_lr']:g}", fitted,
                     "-" if c["ratio"] is None else f"{c['ratio']:.2f}", flat, cost])
    sd = next((c["noise_sd"] for c in checks.values() if c["noise_sd"]), None)
    md = ((f"Seed noise: {sd:.4f} nats (pooled sd of the seeded runs within arms). " if sd else "")
          + ("The seeded runs trained at each arm's fitted choice" if all(c.get("fitted_record") for c in
             checks.values()) else "The seeded runs trained at each grid's best run")
          + "; 'cost' is the fitted loss at that lr above the "
          "fitted minimum (nats, on the grid's fitted curve: an asymmetric parabola, its own curvature each side "
          "of the optimum). A cost is a bias of the arm's loss, not noise.\n\n"
          + table(["arm", "trained at" + ("" if all(c.get("fitted_record") for c in checks.values())
                           else " (the grid's best run)"), "fitted choice", "fitted / trained",
                   "lrs within seed noise of the fitted minimum", "cost of the trained lr (nats)"], rows))
    bias = []
    for r in comparisons:
        a, o = checks.get(r["arm"]) or {}, checks.get(_tuned_source(ctx, r["against"]) or "") or {}
        a = a or checks.get(_tuned_source(ctx, r["arm"]) or "") or {}
        if r["class"] is None or a.get("regret") is None or o.get("regret") is None:
            continue
        b = a["regret"] - o["regret"]  # > 0: the arm's lr is the worse choice, its loss biased up
        bias.append([f"`{r['arm']}` vs `{r['against']}`", f"{b:+.4f}", r["class"]])
    if bias:
        md += ("\n\nPer comparison, the bias the two lr choices put on the loss difference (arm minus the other; "
               "> 0: the arm is handicapped):\n\n" + table(["comparison", "lr bias on the difference (nats)",
                                                             "verdict"], bias))
    return md


def _tuned_source(ctx, arm: Optional[str]) -> Optional[str]:
    """The arm whose tuned lr ``arm`` trains at (itself, or its parent for a time-matched arm)."""
    if arm is None:
        return None
    tuning = ctx.record.get("tuning") or {}
    if arm in tuning:
        return arm
    return ctx.arms[arm].parent if arm in ctx.arms else None


def point_to(report_md: Path) -> None:
    """A line under the report's title naming the re-read verdicts (once)."""
    if not report_md.is_file():
        return
    text = report_md.read_text()
    if POINTER in text:
        return
    head, _, rest = text.partition("\n")
    note = (f"\n\n> {POINTER} The verdicts below were read with an earlier inference (a verdict from one test, "
            f"the CEG beside it from another). Re-read from this report's runs with one paired inference per "
            f"comparison: [{FOLDER}/verdicts.md]({FOLDER}/verdicts.md).")
    write_text_atomic(report_md, head + note + "\n" + rest)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="Re-read committed experiment reports' verdicts from report.json "
                                "(module docstring).")
    p.add_argument("reports", nargs="+", type=Path, help="report.json files")
    a = p.parse_args(argv)
    for path in a.reports:
        if not path.is_file():
            raise SystemExit(f"{path}: no such report.json (give the report.json of a committed report, e.g. "
                             "docs/experiments/evolution/report.json)")
        data = reanalyse(path)
        if data.get("skipped"):
            print(f"{data['experiment']}: {data['skipped']}: its cells are compared in its own sections; nothing "
                  "to re-read")
            continue
        changed = [c["arm"] for c in data["changes"] if c["changed"]]
        off = [a for a, c in data["lr"].items() if c["within_noise"] is False]
        print(f"{data['experiment']}: {len(data['changes'])} arms re-read, verdict changed for "
              f"{changed or 'none'}; trained lr costs more than the seed sd: {off or 'none'}")


if __name__ == "__main__":
    main()
