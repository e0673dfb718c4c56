"""WSD cooldown branches against full-schedule runs of the same length (Hägele et al. 2024, Fig. 3/4).

    python -m analysis.schedules runs/sweep-cooldown --out docs/scaling/cooldown

Pairs every cooldown branch (``role: cooldown`` in its summary.json) with the full-schedule run
(``role: full``: cosine by default) of the same family, model and token count, and reports the
final validation losses side by side: the branch's loss minus the full run's (negative: the
branch is better), and the tokens the branch shares with its stable trunk. Stable trunks are not
compared (their lr never decays). Outputs with ``--out``: ``schedules.md`` (the table),
``schedules.json`` (every number) and ``schedules.png`` (final validation loss against tokens,
one line per schedule, plus the validation curves of each pair).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from omegaconf import OmegaConf

from analysis.runs import RunError, expand_inputs, pyplot, save_figure, style_axes, write_json_atomic, write_text_atomic

# what may differ between a branch and its full-schedule partner (the schedule, bookkeeping)
SCHEDULE_KEYS = {"schedule", "decay_steps", "decay_fraction", "decay_shape", "ckpt_steps", "branch_from", "resume",
                 "resume_allow_changes", "run_name", "out_dir", "ckpt_every", "eval_every", "log_every", "max_steps",
                 "keep_last"}


def _identity(run) -> str:
    """The run's recipe without the keys that make it a branch or a full run: equal for partners."""
    cfg = OmegaConf.to_container(run.recipe, resolve=True)
    cfg["train"] = {k: v for k, v in cfg.get("train", {}).items() if k not in SCHEDULE_KEYS}
    cfg.pop("name", None)
    return OmegaConf.to_yaml(OmegaConf.create(cfg))


def _role(run) -> str:
    return str((run.summary or {}).get("role") or "full")


def pair_runs(runs) -> tuple[list[dict], list[str]]:
    """([pair rows], [notes on runs left unpaired]). A row: family, tokens, both losses, their
    difference, the branch step, and both run names."""
    finished = [r for r in runs if r.status == "finished" and r.final_val_loss is not None]
    full = {}
    for r in finished:
        if _role(r) == "full":
            full.setdefault((_identity(r), round(r.tokens_seen)), r)
    rows, notes = [], []
    for b in sorted((r for r in finished if _role(r) == "cooldown"), key=lambda r: (r.family, r.tokens_seen)):
        partner = full.get((_identity(b), round(b.tokens_seen)))
        if partner is None:
            notes.append(f"{b.name}: no full-schedule run of the same model and {b.tokens_seen:.0f} tokens")
            continue
        steps = int(b.summary.get("step") or 0)
        rows.append({"family": b.family, "tokens": b.tokens_seen, "cooldown_run": b.name, "full_run": partner.name,
                     "full_schedule": str(partner.recipe.train.schedule), "cooldown_loss": b.final_val_loss,
                     "full_loss": partner.final_val_loss,
                     "cooldown_minus_full": b.final_val_loss - partner.final_val_loss,
                     "branch_step": b.summary.get("branch_step"), "steps": steps,
                     "decay_shape": str(b.recipe.train.get("decay_shape", "linear"))})
    notes += [f"{r.name}: {r.status} ({r.reason})" for r in runs if r.status != "finished"]
    return rows, notes


def table(rows: list[dict]) -> str:
    if not rows:
        return "(no cooldown branch has a full-schedule partner of the same model and length)"
    lines = ["| family | tokens | steps (branch from) | full schedule: loss | cooldown branch: loss | "
             "cooldown - full (nats) |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['family']} | {r['tokens']:.3g} | {r['steps']} (step {r['branch_step']}) | "
                     f"{r['full_schedule']}: {r['full_loss']:.4f} | "
                     f"{r['decay_shape']} decay: {r['cooldown_loss']:.4f} | {r['cooldown_minus_full']:+.4f} |")
    return "\n".join(lines)


def plot(rows: list[dict], runs_by_name: dict, path: Path) -> Path:
    plt = pyplot()
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(12, 4.5))
    for fam in sorted({r["family"] for r in rows}):
        fam_rows = [r for r in rows if r["family"] == fam]
        x = [r["tokens"] for r in fam_rows]
        ax0.plot(x, [r["full_loss"] for r in fam_rows], "o-", label=f"{fam}: {fam_rows[0]['full_schedule']} (full run)")
        ax0.plot(x, [r["cooldown_loss"] for r in fam_rows], "s--",
                 label=f"{fam}: WSD cooldown branch ({fam_rows[0]['decay_shape']})")
    ax0.set_xscale("log")
    style_axes(ax0, "Final validation loss: cooldown branch vs full schedule", "training tokens",
               "validation loss (nats/token)")
    for i, r in enumerate(rows):
        color = f"C{i % 10}"
        for name, style in ((r["full_run"], "-"), (r["cooldown_run"], "--")):
            vals = runs_by_name[name].val_rows
            ax1.plot([v["tokens"] for v in vals if "tokens" in v], [v["loss"] for v in vals if "tokens" in v],
                     style, color=color, label=f"{r['tokens']:.2g} tok: {'full' if style == '-' else 'cooldown'}")
    style_axes(ax1, "Validation curves of each pair (solid: full, dashed: cooldown)", "training tokens",
               "validation loss (nats/token)")
    return save_figure(fig, path)


def analyse(inputs: Sequence[str], out: Optional[Path]) -> dict:
    runs, unreadable = expand_inputs(inputs)
    rows, notes = pair_runs(runs)
    notes += [f"{p}: {why}" for p, why in unreadable]
    report = {"pairs": rows, "notes": notes}
    text = "## Cooldown branches vs full-schedule runs of the same length\n\n" + table(rows)
    if notes:
        text += "\n\nLeft out:\n" + "\n".join(f"- {n}" for n in notes)
    print(text)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out / "schedules.md", text + "\n")
        write_json_atomic(out / "schedules.json", report)
        if rows:
            plot(rows, {r.name: r for r in runs}, out / "schedules.png")
    return report


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.schedules", description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="+", help="run folders, sweep folders or folders of runs")
    ap.add_argument("--out", type=Path, help="folder for schedules.md, schedules.json, schedules.png")
    args = ap.parse_args(argv)
    try:
        analyse(args.inputs, args.out)
    except RunError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
