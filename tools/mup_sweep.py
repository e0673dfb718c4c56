"""muP learning-rate transfer: a learning rate x width sweep under standard and muP parametrisation.

    python -m tools.mup_sweep                                   # llama/tiny, widths 64 128 256, 5 lrs
    python -m tools.mup_sweep --recipe recipes/dense/tiny.yaml --widths 64 128 256 512 \\
        --lrs 1e-3 3e-3 1e-2 3e-2 --steps 500 --out runs/mup-sweep-dense
    python -m tools.mup_sweep --quick --out /tmp/mup-quick      # end-to-end check in seconds
    python -m tools.mup_sweep --parametrizations mup --widths 32 --lrs 5e-3 1e-2 2e-2   # tune muP's base lr only

Every point (parametrisation x width x lr) is one ``archlab.train.train`` run on the recipe's data
(by default the embedded corpus), in ``<out>/<parametrization>-w<width>-lr<lr>/``. A width sets
``model.d_model``; ``n_heads`` stays the recipe's (the head dim grows with width, as
``archlab.nn.mup`` assumes) and an explicit ``ffn.hidden`` or ``moe.expert_hidden`` is scaled
with it. muP points use ``model.mup_base_width`` = ``--base-width`` (default: the smallest
width), so at that width both parametrisations are the same model. Each run has a constant lr
after a warmup of 10% of the steps (``train.schedule=constant``; ``--set`` overrides it) and is
evaluated once, at the end.

Outputs: ``<out>/mup_sweep.json`` (every point: status, final train and validation loss; and the
best lr per width) and ``<out>/mup_sweep.png`` (final loss against lr, one curve per width, one
panel per parametrisation: under muP the minimum should stay at the same lr across widths, under
standard parametrisation it should move left as the width grows). The sweep is resumable: a
point whose run folder has a ``summary.json`` of a finished run (completed or stopped on
non-finite numbers) is read, not retrained.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Optional, Sequence

from analysis.plotting import COLORS, pyplot, save_figure, style_axes
from archlab.config import RecipeError, load_recipe
from archlab.io import write_json_atomic
from archlab.train import NonFiniteError, train
from archlab.train.run_folder import SUMMARY

PARAMETRIZATIONS = ("standard", "mup")
DEFAULT_WIDTHS = [64, 128, 256]
DEFAULT_LRS = [3e-4, 1e-3, 3e-3, 1e-2, 3e-2]
QUICK_WIDTHS, QUICK_LRS, QUICK_STEPS = [16, 32], [3e-3, 3e-2], 4
QUICK = ["model.vocab_size=384", "model.n_layers=1", "model.max_seq_len=64", "train.seq_len=32",
         "train.micro_batch_size=4", "train.eval_batches=2", "data.max_bytes=120000"]
RESULTS, PLOT = "mup_sweep.json", "mup_sweep.png"
FINISHED = ("completed", "nonfinite")


def point_name(parametrization: str, width: int, lr: float) -> str:
    return f"{parametrization}-w{width}-lr{lr:g}"


def width_overrides(model, width: int) -> list[str]:
    """d_model = width, and the hidden sizes the recipe fixes explicitly scaled along with it."""
    r = width / model.d_model
    out = [f"model.d_model={width}"]
    if model.ffn.hidden is not None:
        out.append(f"model.ffn.hidden={max(1, round(model.ffn.hidden * r))}")
    if model.get("moe") is not None:
        out.append(f"model.moe.expert_hidden={max(1, round(model.moe.expert_hidden * r))}")
        if model.moe.shared_hidden is not None:
            out.append(f"model.moe.shared_hidden={max(1, round(model.moe.shared_hidden * r))}")
    return out


def plan(recipe: str, widths: Sequence[int], lrs: Sequence[float], steps: int, base_width: int,
         out: Path, user_set: Sequence[str], parametrizations: Sequence[str] = PARAMETRIZATIONS) -> list[dict]:
    """One dict per point: its name, parametrisation, width, lr and the overrides of its run.
    Every point's recipe is loaded (and so validated) here, before anything trains."""
    common = [f"train.max_steps={steps}", f"train.warmup_steps={max(1, steps // 10)}", "train.schedule=constant",
              f"train.eval_every={steps}", f"train.ckpt_every={steps}", "train.keep_last=1",
              "train.eval_context_multipliers=[1]", "train.tensorboard=false", *user_set]
    base = load_recipe(recipe, common).model
    points = []
    for parametrization in parametrizations:
        for width in widths:
            for lr in lrs:
                name = point_name(parametrization, width, lr)
                overrides = [*common, *width_overrides(base, width), f"model.parametrization={parametrization}",
                             f"train.lr={lr}", f"train.out_dir={out}", f"train.run_name={name}", "train.resume=auto"]
                if parametrization == "mup":
                    overrides.append(f"model.mup_base_width={base_width}")
                load_recipe(recipe, overrides)
                points.append({"name": name, "parametrization": parametrization, "width": width, "lr": lr,
                               "overrides": overrides})
    return points


def run_point(recipe: str, point: dict, out: Path) -> dict:
    """Train one point (or read its finished summary) -> the point with status and losses."""
    summary_file = out / point["name"] / SUMMARY
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else None
    if summary is None or summary.get("status") not in FINISHED:
        try:
            summary = train(load_recipe(recipe, point["overrides"]))
        except NonFiniteError:
            summary = json.loads(summary_file.read_text())
    val = summary.get("final_val_loss") or {}
    status = summary["status"]
    if status == "completed" and not val:  # a summary without its final evaluation: the folder lost its metrics
        status = "incomplete"
        print(f"[mup_sweep] {point['name']}: summary.json says completed but holds no final validation loss; "
              f"delete {out / point['name']} and run again", file=sys.stderr)
    return {**{k: v for k, v in point.items() if k != "overrides"}, "status": status,
            "steps": summary.get("step"), "final_train_loss": summary.get("final_train_loss"),
            "final_val_loss": next(iter(val.values()), None), "n_params": summary.get("n_params"),
            "run_dir": str(out / point["name"])}


def _finite(x: Optional[float]) -> bool:
    return x is not None and math.isfinite(x)


def best_lrs(results: list[dict]) -> dict[str, dict[str, Optional[float]]]:
    """parametrisation -> width -> the lr of the lowest final validation loss (None if all diverged)."""
    best: dict[str, dict[str, Optional[float]]] = {}
    for r in results:
        best.setdefault(r["parametrization"], {}).setdefault(str(r["width"]), None)
    finished = [r for r in results if r["status"] == "completed" and _finite(r["final_val_loss"])]
    for r in sorted(finished, key=lambda r: r["final_val_loss"], reverse=True):  # the lowest loss comes last
        best[r["parametrization"]][str(r["width"])] = r["lr"]
    return best


def plot(results: list[dict], base_width: int, path: Path) -> Path:
    """Final validation (solid) and train (dashed) loss against lr; one curve per width, one panel
    per parametrisation, the best lr of each width starred."""
    from matplotlib.ticker import NullFormatter

    plt = pyplot()
    shown = [p for p in PARAMETRIZATIONS if any(r["parametrization"] == p for r in results)]
    fig, axes = plt.subplots(1, len(shown), figsize=(11, 4.2) if len(shown) == 2 else (7.5, 4.2), sharey=True,
                             squeeze=False)
    axes = axes[0]
    widths = sorted({r["width"] for r in results})
    finite = [r[k] for r in results for k in ("final_val_loss", "final_train_loss") if _finite(r[k])]
    best = best_lrs(results)
    for ax, parametrization in zip(axes, shown):
        for i, width in enumerate(widths):
            rows = sorted((r for r in results if r["parametrization"] == parametrization and r["width"] == width),
                          key=lambda r: r["lr"])
            lrs = [r["lr"] for r in rows]

            def losses(key: str) -> list[float]:
                return [r[key] if r["status"] == "completed" and _finite(r[key]) else math.nan for r in rows]

            color = COLORS[i % len(COLORS)]
            ax.plot(lrs, losses("final_val_loss"), "o-", color=color, label=f"d_model {width}")
            ax.plot(lrs, losses("final_train_loss"), "--", color=color, alpha=0.5)
            star = best.get(parametrization, {}).get(str(width))
            if star is not None:
                ax.plot([star], [next(r["final_val_loss"] for r in rows if r["lr"] == star)], "*", color=color,
                        markersize=14)
        ax.set_xscale("log")
        ax.set_xticks(sorted({r["lr"] for r in results}), [f"{lr:g}" for lr in sorted({r["lr"] for r in results})])
        ax.xaxis.set_minor_formatter(NullFormatter())
        title = "standard parametrisation" if parametrization == "standard" else f"muP (base width {base_width})"
        style_axes(ax, title, "learning rate (constant after warmup)", "final loss (nats/token)", legend=False,
                   grid="both")
    axes[-1].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, title="width", title_fontsize=8)
    if finite:
        lo = min(finite)
        axes[0].set_ylim(lo - 0.1, min(max(finite), lo + 3.0) + 0.1)
    fig.suptitle(("muP learning-rate transfer: " if len(shown) == 2 else "")
                 + "final validation (solid) and train (dashed) loss against lr; star: best lr, gap: diverged")
    fig.tight_layout()  # the legend outside the last panel stays inside the figure
    return save_figure(fig, path)


def run_sweep(recipe: str, widths: Sequence[int], lrs: Sequence[float], steps: int, base_width: Optional[int],
              out: Path, user_set: Sequence[str] = (), parametrizations: Sequence[str] = PARAMETRIZATIONS) -> dict:
    """Plan, train every point, write the JSON and the plot; returns the JSON's content."""
    base_width = base_width or min(widths)
    points = plan(recipe, widths, lrs, steps, base_width, out, user_set, parametrizations)
    results = []
    for i, point in enumerate(points, 1):
        print(f"[mup_sweep] {i}/{len(points)} {point['name']}", file=sys.stderr, flush=True)
        results.append(run_point(recipe, point, out))
    report = {"recipe": recipe, "parametrizations": list(parametrizations), "widths": list(widths),
              "lrs": list(lrs), "steps": steps, "base_width": base_width,
              "set": list(user_set), "best_lr": best_lrs(results), "points": results}
    write_json_atomic(out / RESULTS, report)
    plot(results, base_width, out / PLOT)
    return report


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.mup_sweep", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--recipe", default="recipes/llama/tiny.yaml", help="recipe file (default: llama/tiny)")
    ap.add_argument("--widths", nargs="+", type=int, help=f"d_model values (default {DEFAULT_WIDTHS})")
    ap.add_argument("--lrs", nargs="+", type=float, help=f"learning rates (default {DEFAULT_LRS})")
    ap.add_argument("--steps", type=int, help="optimizer steps per run (default 300)")
    ap.add_argument("--base-width", type=int, help="muP base width (default: the smallest width)")
    ap.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", help="overrides for every run")
    ap.add_argument("--parametrizations", nargs="+", choices=PARAMETRIZATIONS, default=list(PARAMETRIZATIONS),
                    help="which to train (default both: the transfer check; mup alone tunes muP's base lr)")
    ap.add_argument("--out", type=Path, default=Path("runs/mup-sweep"), help="sweep folder (default runs/mup-sweep)")
    ap.add_argument("--quick", action="store_true",
                    help=f"end-to-end check: widths {QUICK_WIDTHS}, lrs {QUICK_LRS}, {QUICK_STEPS} steps, "
                         "a tiny vocabulary, corpus and batch (explicit flags still win)")
    args = ap.parse_args(argv)
    widths = args.widths or (QUICK_WIDTHS if args.quick else DEFAULT_WIDTHS)
    lrs = args.lrs or (QUICK_LRS if args.quick else DEFAULT_LRS)
    steps = args.steps or (QUICK_STEPS if args.quick else 300)
    user_set = [*(QUICK if args.quick else []), *args.set]
    try:
        if steps < 1 or min(widths) < 1 or min(lrs) <= 0 or (args.base_width is not None and args.base_width < 1):
            raise RecipeError("--steps, --widths and --base-width must be >= 1 and --lrs positive")
        report = run_sweep(args.recipe, widths, lrs, steps, args.base_width, args.out, user_set,
                           list(dict.fromkeys(args.parametrizations)))
    except RecipeError as e:
        print(f"mup_sweep: {e}", file=sys.stderr)
        return 2
    for parametrization, row in report["best_lr"].items():
        print(f"{parametrization:>8}: best lr by width " + ", ".join(f"{w}: {lr}" for w, lr in row.items()))
    print(f"wrote {args.out / RESULTS} and {args.out / PLOT}")
    incomplete = [r["name"] for r in report["points"] if r["status"] == "incomplete"]
    if incomplete:  # a diverged run is a result; a run without its final evaluation is not
        print(f"mup_sweep: {len(incomplete)} point(s) without a final validation loss: {', '.join(incomplete)}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
