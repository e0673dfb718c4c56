"""Command line: ``python -m archlab.train <recipe.yaml> [key=value ...] [--print-config]``.

Also under a launcher: ``accelerate launch [--multi_gpu --num_processes N | --use_deepspeed
--deepspeed_config_file recipes/launch/zero2.json] -m archlab.train <recipe.yaml> ...``.
Exit status: 0 trained (or interrupted and checkpointed), 1 stopped on non-finite numbers,
2 bad input (recipe, data, checkpoint), printed as one line.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from archlab.config import RecipeError, load_recipe
from archlab.config.keys import keys_help
from archlab.config.load import warmup_note
from archlab.train import CheckpointError, NonFiniteError, train
from archlab.train.console import closing_lines
from archlab.train.dist import shutdown_distributed


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m archlab.train", description="Train a recipe.",
                                     epilog=keys_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe", help="recipe YAML file, e.g. recipes/llama/tiny.yaml")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. train.max_steps=100")
    parser.add_argument("--print-config", action="store_true",
                        help="print the resolved, validated recipe (YAML, every key) and exit without training")
    args = parser.parse_args(argv)
    if args.print_config:
        return _print_config(args.recipe, args.overrides)

    status = 1  # an unexpected exception: Python prints it and exits 1
    try:
        status = _train(args.recipe, args.overrides)
    finally:
        # every rank tears its process groups down, in order, on every exit path; the barrier
        # only where all ranks are known to have finished (completed or stopped by a signal)
        shutdown_distributed(synchronize=status == 0)
    return status


def _origin(recipe: str, overrides: Sequence[str]) -> str:
    """How the recipe was given, as the start block names it."""
    return " ".join([recipe, *(["+", *overrides] if overrides else [])])


def _print_config(recipe: str, overrides: Sequence[str]) -> int:
    from omegaconf import OmegaConf

    try:
        cfg = load_recipe(recipe, overrides)
    except RecipeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"# {_origin(recipe, overrides)}: resolved and validated")
    if (note := warmup_note(cfg.train)) is not None:
        print(f"# {note}")
    print(OmegaConf.to_yaml(cfg), end="")
    return 0


def _train(recipe: str, overrides: Sequence[str]) -> int:
    try:
        cfg = load_recipe(recipe, overrides)
        summary = train(cfg, _origin(recipe, overrides))
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
        print(closing_lines(summary), file=sys.stderr)
    return 0


if __name__ == "__main__":
    from archlab.train.dist import exit_process

    exit_process(main())  # an unexpected exception propagates: traceback, exit status 1
