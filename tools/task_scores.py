"""Score fine-tuned runs on the understanding tasks (``train.objective``: tag, span_qa, bound): dev and test
accuracy with 95% intervals, beside chance and the task's baseline, at the checkpoint of lowest dev loss.

    python -m tools.task_scores runs/gpt-tag runs/gpt-span runs/gpt-bound

Early stopping: every kept checkpoint (``train.ckpt_every`` = ``train.eval_every`` and a large
``train.keep_last``) is a candidate; the one at the validation row of lowest loss is scored. Convergence: the
dev loss is "still falling" when its lowest value is the last row's. Intervals: a bootstrap over documents
(items of one document share windows), 2,000 resamples, percentile 95%. A tagging item's score is its correct
labelled tokens over its labelled tokens. A bad argument prints one line on stderr and exits with status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from analysis.task_scores import bootstrap, chosen_checkpoint
from archlab.checkpoints import TOKENIZER
from archlab.data.tokenizer import Tokenizer
from archlab.errors import RecipeError
from archlab.objectives import objective_for
from archlab.objectives.understanding import UnderstandingObjective
from archlab.train.checkpoint import load_recipe_of, load_weights_into


def score_run(run: Path, limit: int | None = None) -> list[dict]:
    """One row per split (val, test): items, chance, baseline and the model's accuracy with intervals."""
    cfg = load_recipe_of(run)
    objective = objective_for(cfg)
    if not isinstance(objective, UnderstandingObjective):
        raise RecipeError(f"{run}: train.objective={cfg.train.objective.type} is not an understanding task")
    ckpt, step, falling = chosen_checkpoint(run, objective.eval_loss_key)
    data = objective.prepare_data(cfg)
    if data.tokenizer.backend.get_vocab() != Tokenizer.load(run / TOKENIZER).backend.get_vocab():
        raise RecipeError(f"{run}: the task's tokenizer rebuilt from the recipe differs from the run's {TOKENIZER}")
    model = objective.build_model(cfg)
    load_weights_into(model, ckpt)
    task = objective.task_facts()
    rows = []
    for split in ("val", "test"):
        items = data.examples[split]
        c, n = objective.item_scores(model, items, limit=limit)
        k = len(c)
        bc, bn = task.baseline(data.examples["train"], items, int(data.tokenizer.vocab_size))
        rows.append({"run": run.name, "task": task.name, "model": str(cfg.model.type), "split": split,
                     "items": k, "chance": float(items.chance[:k].mean()),
                     "baseline": float(bc[:k].sum() / bn[:k].sum()), "baseline_ci": bootstrap(bc[:k], bn[:k],
                                                                                            items.doc[:k]),
                     "accuracy": float(c.sum() / n.sum()), "accuracy_ci": bootstrap(c, n, items.doc[:k]),
                     "step": step, "still_falling": falling})
    return rows


def table(rows: list[dict]) -> str:
    def ci(v, lo_hi):
        return f"{v:.3f} [{lo_hi[0]:.3f}, {lo_hi[1]:.3f}]"
    out = ["| run | task | split | items | chance | baseline [95%] | model [95%] | step (lowest dev loss) | "
           "dev loss still falling |", "|---|---|---|---:|---:|---|---|---:|---|"]
    out += [f"| {r['run']} | {r['task']} | {r['split']} | {r['items']:,} | {r['chance']:.3f} | "
            f"{ci(r['baseline'], r['baseline_ci'])} | {ci(r['accuracy'], r['accuracy_ci'])} | {r['step']} | "
            f"{'yes' if r['still_falling'] else 'no'} |" for r in rows]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="fine-tuned run folders")
    parser.add_argument("--limit", type=int, default=None, help="score only the first LIMIT items of each split")
    args = parser.parse_args(argv)
    try:
        rows = [r for run in args.runs for r in score_run(run, args.limit)]
    except RecipeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
