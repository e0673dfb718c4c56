"""Scaling-study designer: before any run trains, how precisely will a planned grid determine the exponents?

    python -m analysis.scaling design docs/scaling/design/llama.yaml --sims 200 --seed 0   # --out design.json
    python -m analysis.scaling design docs/scaling/design/llama.yaml --propose 3e10 3e11   # a grid from C_MIN to
    #     C_MAX (--budgets 5 --sizes 7 --spread 4, --ladder N ..., --write-spec proposed.yaml; the SPEC is optional)

The designer simulates the whole analysis of :mod:`analysis.scaling` many times: it draws losses from
an assumed law L(N, D) on the planned grid with a seed-noise model, fits every draw as the real study
will (approach 3, :func:`analysis.scaling.fits.loss_nd.fit_loss_nd`; approach 2,
:func:`analysis.scaling.fits.isoflop.isoflop_profiles`) and reports the spread of the point estimates of
alpha, beta and the compute-optimal exponent a (N_opt ∝ C^a) across the simulated studies. That
spread is what the real study's 95% interval should come out as; a grid whose spread is wide cannot
answer the question, however many seeds it trains.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional, Sequence

from omegaconf import OmegaConf

from analysis.scaling.design.propose import propose_grid, spec_yaml
from analysis.scaling.design.simulate import simulate
from analysis.scaling.design.spec import Law, _law, load_spec


def main(argv: Optional[Sequence[str]] = None) -> int:
    doc = __doc__.split("\nConventions:")[0]
    ap = argparse.ArgumentParser(prog="python -m analysis.scaling design", description=doc.split("\n\n")[0],
                                 epilog=doc.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("spec", nargs="?", help="design spec (YAML; see docs/methods/scaling-design.md)")
    ap.add_argument("--sims", type=int, default=None, help="simulated studies per family (default: the spec's, 200)")
    ap.add_argument("--seed", type=int, default=None, help="simulation seed (default: the spec's, 0)")
    ap.add_argument("--out", type=Path, help="write every number as JSON to this file")
    ap.add_argument("--propose", type=float, nargs=2, metavar=("C_MIN", "C_MAX"),
                    help="replace the spec's grid (or design from defaults) by an IsoFLOP grid over this FLOPs range")
    ap.add_argument("--budgets", type=int, default=5, help="--propose: FLOPs budgets (default 5)")
    ap.add_argument("--sizes", type=int, default=7, help="--propose: sizes per budget (default 7)")
    ap.add_argument("--spread", type=float, default=4.0,
                    help="--propose: sizes from N_opt / spread to N_opt * spread (default 4)")
    ap.add_argument("--ladder", type=float, nargs="+", metavar="N",
                    help="--propose: pick each budget's sizes from these N (the sizes you can build)")
    ap.add_argument("--write-spec", type=Path, help="--propose: write the proposed spec (YAML) to this file")
    args = ap.parse_args(argv)
    try:
        if args.ladder is not None and args.propose is None:
            raise ValueError("--ladder is the sizes --propose picks from: add --propose C_MIN C_MAX")
        if args.spec is None and args.propose is None:
            raise ValueError("give a design spec (YAML), or --propose C_MIN C_MAX")
        if args.write_spec is not None and args.propose is None:
            raise ValueError("--write-spec writes the --propose grid: add --propose C_MIN C_MAX")
        if args.sims is not None and args.sims < 1:
            raise ValueError(f"--sims {args.sims}: must be >= 1")
        raw = {}
        if args.spec is not None:
            path = Path(args.spec)
            if not path.is_file():
                raise ValueError(f"design spec: no such file {args.spec!r}")
            raw = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
            if not isinstance(raw, dict):
                raise ValueError(f"design spec {args.spec}: expected a mapping")
        if args.propose is not None:
            law = _law(raw.get("law"), Law(), "law")
            raw = {k: v for k, v in raw.items() if k not in ("sizes", "tokens", "flops", "budgets")}
            raw.update(propose_grid(args.propose[0], args.propose[1], n_budgets=args.budgets, n_sizes=args.sizes,
                                    spread=args.spread, law=law, ladder=args.ladder))
            raw["description"] = (f"proposed grid, {args.budgets} budgets {args.propose[0]:g}-{args.propose[1]:g} "
                                  f"FLOPs x {args.sizes} sizes (x{args.spread:g} around N_opt)"
                                  + (f" from a ladder of {len(set(args.ladder))} sizes" if args.ladder else ""))
        spec = load_spec(raw)
        design = simulate(spec, sims=args.sims, seed=args.seed)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(design.table(), end="")
    if args.propose is not None:
        print("\nProposed grid (spec YAML):\n")
        print(spec_yaml(raw), end="")
        if args.write_spec is not None:
            args.write_spec.parent.mkdir(parents=True, exist_ok=True)
            args.write_spec.write_text(spec_yaml(raw))
            print(f"\nwrote {args.write_spec}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(design.to_json(), indent=1) + "\n")
        print(f"\nwrote {args.out}")
    return 0
