"""``python -m tools.explore RUN [RUN_B] [key=value ...]``: serve the explorer, or ``--export`` one
offline page. A mistake prints one line on stderr and exits 2."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

import torch

from tools.explore.export import export
from tools.explore.load import Explorable, ExploreError, load
from tools.explore.server import Explorer, serve, unicode_text

DEFAULT_PORT = 8765


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tools.explore", description=__doc__.split("\n\n")[0])
    p.add_argument("paths", nargs="+", metavar="RUN",
                   help="one or two run folders, checkpoint folders or recipes (random init); key=value "
                        "arguments are overrides for the recipes")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 = any free)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; another one prints a warning)")
    p.add_argument("--tokenizer", type=Path, default=None, help="tokenizer.json instead of the run folder's")
    p.add_argument("--export", type=Path, default=None, metavar="PAGE.html",
                   help="write one self-contained offline page for --prompt instead of serving")
    p.add_argument("--prompt", default=None,
                   help="the text of the exported page (default: the start of the first run's validation split)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default 1: on a small shared CPU one thread answers fastest)")
    return p.parse_args(argv)


def load_runs(args: argparse.Namespace) -> list[Explorable]:
    overrides = [a for a in args.paths if "=" in a and not Path(a).exists()]
    paths = [Path(a) for a in args.paths if a not in overrides]
    if not 1 <= len(paths) <= 2:
        raise ExploreError(f"give one run, or two to compare side by side (got {len(paths)})")
    recipe_count = sum(p.is_file() for p in paths)
    if overrides and not recipe_count:
        raise ExploreError("key=value overrides apply to a recipe only; a run's architecture is fixed")
    return [load(p, overrides if p.is_file() else (), args.tokenizer) for p in paths]


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    try:
        if args.threads < 1:
            raise ExploreError(f"--threads={args.threads}: must be >= 1")
        if not 0 <= args.port <= 65535:
            raise ExploreError(f"--port={args.port}: must lie in [0, 65535]")
        if args.export is None and args.prompt is not None:
            raise ExploreError("--prompt is the text of an --export page; the served page takes it in the browser")
        if args.prompt is not None:
            unicode_text(args.prompt, "--prompt")
        torch.set_num_threads(args.threads)
        runs = load_runs(args)
        if args.prompt is None:
            print(runs[0].prompt.note, file=sys.stderr)
        if args.export is not None:
            export(runs, runs[0].prompt.text if args.prompt is None else args.prompt, args.export)
            print(f"wrote {args.export}")
            return 0
        serve(Explorer(runs), args.host, args.port)
        return 0
    except ExploreError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("explorer stopped")
        return 0


if __name__ == "__main__":
    sys.exit(main())
