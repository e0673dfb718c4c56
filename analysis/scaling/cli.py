"""Scaling laws from run folders: L(C) per family, the parametric L(N, D), IsoFLOP profiles,
the compute-optimal allocation and three estimates of its exponent, with seed noise.

    python -m analysis.scaling docs/scaling/runs/llama --out reports/scaling-llama   # N: --n-kind total (default),
    #     non_embedding, with_head or active
    python -m analysis.scaling runs/sweep-quick --out runs/sweep-quick/report   # the quick path: tools.sweep --quick
    python -m analysis.scaling design docs/scaling/design/llama.yaml   # before training (also --propose C_MIN C_MAX)

Outputs (``--out DIR``): loss_vs_flops.png, loss_vs_tokens.png, dense_vs_moe.png, isoflop.png
(loss against N per budget with parabolas and minima; N* against C), loss_nd.png (loss against D
per N with the fitted L(N, D)), compute_multiplier.png (m(C) per pair with its band, one panel
per N), fits.json (every number) and fits.md (the tables, also printed). dense_vs_moe.png needs a
dense and an MoE family, compute_multiplier.png a pair of families with fits: otherwise they are not
written and a line says why.

The method (which runs are points, what N counts, the three approaches, statuses and flags, the
checks of the fits): docs/methods/scaling.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from analysis.runs import LEARN_MARGIN, RunError
from analysis.scaling.design.cli import main as design_main
from analysis.scaling.fits.holdout import HOLDOUT_BY
from analysis.scaling.read import N_KINDS
from analysis.scaling.report import analyse


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["design"]:  # the study designer: how precisely will a planned grid fit?
        return design_main(argv[1:])
    ap = argparse.ArgumentParser(prog="python -m analysis.scaling", description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="+", help="run folders, globs (quote them), sweep folders or folders of runs")
    ap.add_argument("--out", type=Path, help="folder for the plots, fits.json and fits.md (default: print only)")
    ap.add_argument("--n-kind", choices=list(N_KINDS), default="total",
                    help="what N counts: " + "; ".join(f"{k} = {v}" for k, v in N_KINDS.items())
                    + " (default total: Chinchilla's and Pearce & Song's convention)")
    ap.add_argument("--bootstrap", type=int, default=200, help="bootstrap resamples for the intervals (default 200)")
    ap.add_argument("--huber-delta", type=float, default=1e-3,
                    help="Huber loss threshold on log L residuals (default 1e-3, as Chinchilla)")
    ap.add_argument("--budget-tolerance", type=float, default=0.1,
                    help="IsoFLOP: runs without a sweep FLOPs budget share a budget when their training FLOPs "
                         "agree within this fraction (default 0.1)")
    ap.add_argument("--ref-flops", type=float, default=None,
                    help="compute (FLOPs) at which to state N_opt, D_opt and D/N (default: each family's largest run)")
    ap.add_argument("--holdout", choices=[*HOLDOUT_BY, "none"], default="size",
                    help="approach 3 refitted without the largest model size or the largest compute budget, "
                         "predicting the losses left out with 95%% prediction intervals (default size)")
    ap.add_argument("--pairs", nargs="+", metavar="REF:FAM",
                    help="families compared as compute multipliers (how much compute REF needs for FAM's "
                         "compute-optimal loss), e.g. dense:llama llama:mixtral (default: all against --reference)")
    ap.add_argument("--reference", default=None,
                    help="the family every other is compared with when --pairs is not given "
                         "(default: dense if present, else the first family by name)")
    ap.add_argument("--prediction", nargs="+", metavar="FAM=PATH[:DESIGN_FAMILY]",
                    help="the designer's prediction for a family (the JSON of `python -m analysis.scaling design "
                         "--out`), its expected interval widths set beside the obtained ones, e.g. "
                         "llama=docs/scaling/design/prediction.json mixtral=docs/scaling/design/families.json:other")
    ap.add_argument("--keep-unlearned", action="store_true",
                    help=f"keep runs whose final loss is not {LEARN_MARGIN} nats below their unigram entropy as points "
                         "(smoke tests of tiny runs; a scaling study leaves them out, the default)")
    ap.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    args = ap.parse_args(argv)
    try:
        if args.bootstrap < 0:
            raise ValueError(f"--bootstrap {args.bootstrap}: must be >= 0")
        if not args.huber_delta > 0:
            raise ValueError(f"--huber-delta {args.huber_delta}: must be positive")
        if not args.budget_tolerance >= 0:
            raise ValueError(f"--budget-tolerance {args.budget_tolerance}: must be >= 0")
        if args.ref_flops is not None and not args.ref_flops > 0:
            raise ValueError(f"--ref-flops {args.ref_flops}: must be positive")
        notes: list[str] = []  # figures not written, and why: printed after the tables
        result = analyse(args.inputs, args.out, args.bootstrap, args.huber_delta, args.seed, n_kind=args.n_kind,
                         budget_tolerance=args.budget_tolerance, ref_flops=args.ref_flops,
                         holdout=None if args.holdout == "none" else args.holdout, pairs=args.pairs,
                         reference=args.reference, predictions=args.prediction,
                         keep_unlearned=args.keep_unlearned, log=notes.append)
    except (RunError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(result["table_markdown"])
    if args.out is not None:
        print(f"\nwrote {args.out}/" + ", ".join(result["figures"] + ["fits.json", "fits.md"]))
        for note in notes:
            print(note)
    return 0
