"""Routing inspection of an MoE run: how the router behaved over training, and what it learned.

    python -m analysis.routing runs/mixtral-tiny --out reports/mixtral-tiny-routing
    python -m analysis.routing runs/mixtral-tiny --checkpoint runs/mixtral-tiny/checkpoints/step_00000300 \\
        --text my_held_out.txt --out reports/routing
    python -m analysis.routing runs/mixtral-tiny --text "def add(a, b): return a + b" --out reports/routing

Over training (from the run's routing.jsonl / metrics.jsonl):
  load_heatmap.png     load per expert against the uniform share (a diverging scale: red above, blue below,
                       white at 1/E), per MoE layer, against the step
  balance.png          MaxVio, router entropy and dropped fraction per layer against the step
  telemetry.png        per layer: tokens per expert (min, max, std), dead experts (zero tokens in
                       the record's window) and starved ones (under 10% of uniform), dropped tokens;
                       across layers: p50/p90/p95/max of MaxVio
  summary.md lists the dead and starved experts of each layer by id over the last steps
  (:mod:`analysis.routing.health`); a figure with nothing to show is not written, and a line says why.
  bias.png             aux-loss-free selection bias per expert (runs that use it)

Router trace (``train.router_trace_every``): ``read_trace(run_dir)`` returns the traced tokens'
chosen experts, gate weights, dropped slots and router logits of every traced step as arrays;
summary.json says how many steps were traced and what collecting and writing them cost.

From a checkpoint (default: the newest complete one) over held-out text (default: the run's own
validation split; ``--text`` files, globs or the text itself instead: an argument with a space in it
is the text), with the top-K expert ids captured per token and layer by a forward hook on each
router; nothing is trained, and a run folder with no training records (imported weights) is read
from its checkpoint alone:
  routed_load.png      each expert's load over that text against the uniform share, per MoE layer;
                       summary.md lists its dead (no slot) and starved experts by id
  specialisation.png   token-id specialisation per layer (OLMoE): for each token id seen at least
                       ``--min-count`` times, the share of its occurrences routed (among its K) to
                       its most frequent expert; mean over token ids, and the uniform baseline K/E
  coactivation.png     per layer, N(a, b) / N(a): how often expert b is chosen with expert a,
                       counting every pair of the K chosen experts (one colour scale for all layers)
  saturation.png       router saturation (OLMoE): mean over tokens of |TopK_ckpt ∩ TopK_ref| / K
                       of each other checkpoint against the analysed one, per layer
  summary.json / summary.md, including each expert's top tokens.

Shape legend: N tokens, K experts per token, E experts, V vocabulary, L MoE layers, P traced
steps, T traced tokens per step.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from analysis.routing.report import analyse
from analysis.runs import RunError
from archlab.nn.moe.stats import STARVED_FRACTION


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.routing", description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", help="an MoE run folder (written by python -m archlab.train)")
    ap.add_argument("--out", type=Path, required=True, help="folder for the PNGs and summary.json / summary.md")
    ap.add_argument("--checkpoint", help="checkpoint folder to analyse (default: the run's newest complete one)")
    ap.add_argument("--compare", nargs="+", default=(), metavar="CKPT",
                    help="checkpoints for router saturation (default: the run's other checkpoints)")
    ap.add_argument("--text", nargs="+", default=(), metavar="FILE",
                    help="held-out UTF-8 text files or globs, or the text itself (an argument with a space in it); "
                         "default: the run's validation split")
    ap.add_argument("--max-tokens", type=int, default=32768, help="held-out tokens to route (default 32768)")
    ap.add_argument("--min-count", type=int, default=5,
                    help="token ids seen fewer times are left out of specialisation")
    ap.add_argument("--no-checkpoint", action="store_true", help="only the over-training plots")
    ap.add_argument("--starved-fraction", type=float, default=STARVED_FRACTION,
                    help=f"an expert under this fraction of the uniform load is starved (default {STARVED_FRACTION:g})")
    ap.add_argument("--starved-window", type=float, metavar="STEPS",
                    help="dead and starved experts over the last STEPS training steps (default: the last fifth)")
    ap.add_argument("--allow-incomplete", action="store_true", help="inspect a run that has not finished")
    args = ap.parse_args(argv)
    try:
        if args.max_tokens <= 0 or args.min_count <= 0:
            raise ValueError("--max-tokens and --min-count must be positive")
        if not 0 < args.starved_fraction < 1:
            raise ValueError(f"--starved-fraction {args.starved_fraction:g}: must lie in (0, 1) (of the uniform load)")
        if args.starved_window is not None and not args.starved_window > 0:
            raise ValueError(f"--starved-window {args.starved_window:g}: must be > 0 (training steps)")
        analyse(args.run, args.out, args.checkpoint, args.compare, args.text, args.max_tokens,
                args.min_count, not args.no_checkpoint, args.allow_incomplete, args.starved_fraction,
                args.starved_window)
    except (RunError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print((args.out / "summary.md").read_text())
    return 0
