"""Command line: ``python -m archlab.train <recipe.yaml> [key=value ...]``.

Also under a launcher: ``accelerate launch [--multi_gpu --num_processes N | --use_deepspeed
--deepspeed_config_file recipes/launch/zero2.json] -m archlab.train <recipe.yaml> ...``.
Exit status: 0 trained (or interrupted and checkpointed), 1 stopped on non-finite numbers,
2 bad input (recipe, data, checkpoint), printed as one line.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m archlab.train", description="Train a recipe.")
    parser.add_argument("recipe", help="recipe YAML file, e.g. recipes/llama/tiny.yaml")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. train.max_steps=100")
    args = parser.parse_args(argv)

    from archlab.train.dist import shutdown_distributed

    status = 1  # an unexpected exception: Python prints it and exits 1
    try:
        status = _train(args.recipe, args.overrides)
    finally:
        # every rank tears its process groups down, in order, on every exit path; the barrier
        # only where all ranks are known to have finished (completed or stopped by a signal)
        shutdown_distributed(synchronize=status == 0)
    return status


def _train(recipe: str, overrides: Sequence[str]) -> int:
    from archlab.config import RecipeError, load_recipe
    from archlab.train import CheckpointError, NonFiniteError, train

    try:
        cfg = load_recipe(recipe, overrides)
        summary = train(cfg)
    except RecipeError as e:  # includes data errors
        print(f"error: {e}", file=sys.stderr)
        return 2
    except NonFiniteError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except CheckpointError as e:  # missing, corrupt or foreign checkpoint / run folder
        print(f"error: {e}", file=sys.stderr)
        return 2
    if summary["rank"] == 0:
        print(_closing_lines(summary), file=sys.stderr)
    return 0


def _closing_lines(summary: dict) -> str:
    """What a user wants at the end: where the run is, how good it got, where the plot is."""
    run = summary["run_dir"]
    lines = [f"[archlab] {summary['status']}: step {summary['step']}, run folder {run}"]
    val = summary.get("final_val_loss") or {}
    if val:
        by_len = ", ".join(f"{loss:.3f} at {ctx} tokens" for ctx, loss in val.items())
        lines.append(f"[archlab] final validation loss (nats/token): {by_len}")
    if summary.get("unigram_entropy_train") is not None:
        lines.append(f"[archlab] unigram entropy of the training split: {summary['unigram_entropy_train']:.3f}")
    lines.append(f"[archlab] loss curve: {run}/loss.png")
    return "\n".join(lines)


if __name__ == "__main__":
    from archlab.train.dist import exit_process

    exit_process(main())  # an unexpected exception propagates: traceback, exit status 1
