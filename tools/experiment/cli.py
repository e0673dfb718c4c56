"""Experiments: named arms (a recipe + overrides) x seeds at one budget, trained by ``tools.sweep``,
measured, and reported with intervals.

    python -m tools.experiment run experiments/evolution.yaml              # train, measure, write the report
    python -m tools.experiment run experiments/evolution.yaml --quick      # tiny models, a few steps, one seed
    python -m tools.experiment run experiments/evolution.yaml --amend "why"  # accept a changed design (recorded)
    python -m tools.experiment report experiments/evolution.yaml           # the report again from the runs
    python -m tools.experiment plan experiments/evolution.yaml             # arms, steps and costs; trains nothing
    python -m tools.experiment status experiments/evolution.yaml           # each stage's runs: done, to go, failed
    python -m tools.experiment archive experiments/evolution.yaml          # the finished runs, slim, to commit
    python -m tools.experiment restore experiments/evolution.yaml          # ... written back to go on elsewhere

The package, one module per job: ``load`` (the YAML, checked once, into the typed spec of
``analysis.experiment_spec``), ``arms`` (each arm's recipe and overrides), ``run`` (the stages and the record),
``plan``, ``status``, ``archive`` (an experiment carried to another checkout: its finished runs without
checkpoints), ``cli``; each stage is one module of ``tools.experiment.stages`` (``tuning``, ``seeded``, ``ceg``,
``looks``, ``finetune``, ``measure``), run in the order of ``stages.STAGES``.

Three stages train. (1) Tuning (``stages.tuning``, ``<out>/tune/``): each arm's lr is
chosen on its own by a log grid at the full budget, extended until the best lr is interior (or
tuned at the muP base width and transferred, or shared by design, said so). (2) The seeded runs:
every arm at its tuned lr once per seed (and per cell of ``grid``, if any) as one point of a
``tools.sweep`` sweep under ``<out>/sweep/``: resumable (a finished run is skipped, a started one continues from
its checkpoint), one run folder per point, ``manifest.json`` with each run's status, wall time and
peak resident memory. Arms whose budget is a wall-clock time (``match_time_of``) train in a second
sweep, ``<out>/sweep-time/``, once the runs that set their time are done. (3) The compute curve
(``stages.ceg``, ``<out>/ceg/``): WSD trunks of the reference arm with cooldown branches
from below to above the budget, so that each arm's loss converts to a compute-equivalent gain
(CEG), and every comparison is classified (paired t-test and TOST against the margin, Holm across
the report's comparisons): better, worse, equivalent within the margin, or unresolved. Every run is
a typed record (arm, seed, lr, grid cell, role: tune | seeded | ceg-stable | ceg-cooldown) in
``experiment.json``. Then the measurements
that need more than the run folders (evaluation at longer contexts, gradient norms at
initialisation, the throughput benchmark) run in this process, each cached under
``<out>/measurements/``; then the report (``analysis.experiment_report``): ``report.md`` with the
tables, PNGs, ``report.json`` with every number and the command that regenerates it.

Each measurement is one module of ``analysis.measurements`` (registered in
``analysis.measurements.MEASUREMENTS``): the settings it accepts, checked when the spec loads (an
unknown setting or a bad value is an error naming it), what it computes after training and its
report section.

Pre-registration (``tools.experiment.registration``): before its first stage trains, ``run`` writes the hash of
the spec's decision-relevant part (arms and their settings, seeds and the sequential rule, margin, verdicts, grid,
budgets, tune, ceg, measurements; not the words, paths or --set) to ``<out>/registration.json``, and every run
the record lists carries it (``spec_hash``, ``stated_at``); the report prints it. A spec whose decision-relevant
part changed after its seeded runs began is refused, naming the keys; ``--amend "REASON"`` accepts it and records
old hash, new hash, keys, reason and time, which the report prints.

Spec file (YAML):

    name: evolution                    # report title and folder names
    title: The architecture-evolution ladder
    description: ...                   # what is trained and why (quoted in the report)
    claim: ...                         # the published claim the experiment checks
    out: runs/experiments/evolution    # run folders (git-ignored); --quick adds -quick
    report: docs/experiments/evolution # where `run` writes the report (--quick: <out>/report)
    seeds: [0, 1, 2]                   # train.seed of every arm (default: 3 seeds); or a sequential design,
                                       # {min: 3, max: 9, step: 2, spending: pocock}: the unresolved
                                       # comparisons get more seeds (stages.looks)
    budget: {flops: 4.0e12}            # or {tokens: 1.0e6}: the same for every arm unless the arm says otherwise
    set: [model.vocab_size=2048]       # overrides for every arm
    grid: {train.lr: [1.0e-3, 3.0e-3]} # optional: crossed with every arm and seed
    reference: vanilla                 # paired differences are taken against it (default: the first arm)
    tune: {lr: [1.0e-3, 2.0e-3, 4.0e-3], budget_fraction: 1.0, seed: 1000, max_extend: 3}
                                       # required: each arm's lr (stages.tuning); or {lr: [...],
                                       # mup: true} (width-only arms under muP), or {shared: <why>} (by design)
    ceg: {fractions: [0.25, 0.5, 1.0, 2.0], seeds: [0, 1, 2], decay_fraction: 0.2, shape: sqrt}
                                       # optional: the reference's loss against compute (stages.ceg)
    margin: {ceg: [0.9, 1.1]}          # equivalence margin of the verdicts (default), or {nats: 0.02}
    verdicts: reference                # the verdicts' family: every arm against the reference (default),
                                       # pairs: every arm that names a `compare:` arm against that arm, or
                                       # parent: every arm against the arm it extends (a ladder's steps)
    arms:                              # in order: tables and plots follow it
      - name: vanilla
        label: 2017 Transformer        # short text for tables and plots (default: the name)
        recipe: recipes/vanilla/tiny.yaml
        set: [train.lr=1.0e-3]
      - name: pre-ln
        extends: previous              # or an arm's name: its recipe and overrides, then this arm's `set`
        set: [model.norm.placement=pre]
      - name: dense-time
        extends: dense
        side: true                     # not a step of the ladder (measurements.ladder)
        compare: moe                   # also paired with this arm in the tables (any arm)
        budget: {match_time_of: moe}   # the tokens this arm trains (at its parent's measured tokens/s)
                                       # in the mean training time of arm `moe` (speeds: the throughput
                                       # benchmark if the spec measures it, else the runs' own)
    measurements:                      # besides the final validation loss and the costs (always reported)
      ladder: {}                       # each arm against the arm it extends; waterfall plot
      extrapolation: {multipliers: [1, 2, 4, 8], tokens: 32768, arms: [...], variants: {NAME: {arm, label, set}}}
                                       # loss at multiples of the training context, as trained and with
                                       # evaluation-time overrides (arms: default all)
      init_grad_norms: {depths: [2, 4, 8], batches: 2, seeds: [...], arms: [...]}  # per-layer gradient norms at
                                       # initialisation (seeds: default the spec's; arms: default all)
      stability: {}                    # grid outcome per arm: learned | did not learn | diverged
      routing: {heatmaps: [a, b]}      # MaxVio against validation loss; load heatmaps of two arms
      wall_clock: {}                   # equal-FLOPs and equal-time views
      kv_cache: {contexts: [1, 2, 4, 8]}  # validation loss against KV-cache bytes per token (+ a recurrent
                                       # state per sequence); contexts (optional): KV cache + state per
                                       # sequence at these multiples of the training context
      val_sampling: {}                 # the validation set's own sampling error beside the seed intervals
      throughput: {steps: 10, rounds: 5}  # every arm's training step timed side by side (interleaved rounds):
                                       # tokens/s that compare under the same load; time-matched budgets use it
                                       # (--quick: {steps: 2, rounds: 2}); its section comes last
    quick:                             # --quick: these keys replace the spec's (`set` is appended)
      budget: {tokens: 4096}
      tune: {lr: [1.0e-3, 3.0e-3], max_extend: 0}
      arms: [vanilla, pre-ln]          # train only these arms (all arms are still resolved and checked)

``--quick`` also applies :data:`QUICK_SET` (tiny width, short sequences, a small corpus) before
the spec's ``quick.set`` and the arms' own overrides, trains one seed, and writes to ``<out>-quick``.
Keys that ``quick:`` does not give shrink by default (also without any ``quick:`` block), each named in
the report's setup: budget -> {tokens: 4096}; tune.lr -> the grid's lowest and highest lr, max_extend 0;
ceg.seeds -> the quick seeds ([0]). A spec's grid: and measurements: keep their values (the measurements'
own quick settings apply).
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from pathlib import Path
from typing import Optional, Sequence

from analysis.experiment_report import write_report
from analysis.experiment_spec import Spec
from analysis.runs import RunError
from archlab.config import RecipeError
from tools import launch
from tools.experiment import archive, registration, status
from tools.experiment.arms import resolve_arms
from tools.experiment.load import load_spec
from tools.experiment.plan import plan
from tools.experiment.run import RECORD, Stopped, finish_record, read_record, run_experiment, with_current_words
from tools.sweep.manifest import RefusalRecorder, refusal_line


def regenerate_command(spec: Spec, args) -> str:
    """The command that rebuilds this report from scratch (finished runs are reused)."""
    cmd = ["python", "-m", "tools.experiment", "run", spec.spec_path]
    if spec.quick:
        cmd.append("--quick")
    if getattr(args, "out", None):
        cmd += ["--out", args.out]
    if getattr(args, "report", None):
        cmd += ["--report", args.report]
    if spec.extra_set:
        cmd += ["--set", *spec.extra_set]
    cmd += ["--jobs", str(getattr(args, "jobs", 1))]
    if getattr(args, "threads", None):
        cmd += ["--threads", str(args.threads)]
    return shlex.join(cmd)


def archive_or_restore(spec: Spec, args) -> int:
    """``archive`` / ``restore`` (:mod:`tools.experiment.archive`) between ``<out>`` and the archive folder."""
    default = Path(spec.report) / "runs" if spec.report and not spec.quick else Path(f"{spec.out}-archive")
    folder = Path(getattr(args, "dest", None) or getattr(args, "src", None) or default)
    if args.command == "archive":
        index = archive.archive_experiment(Path(spec.out), folder, finetune=spec.finetune is not None,
                                           measurements=list(spec.wanted))
        for rel, n in index["folders"].items():
            left = (f" ({len(n['left_out'])} finished left out: a run still to train starts from them, or a "
                    "measurement still to score loads them)") if n["left_out"] else ""
            print(f"{rel}: {n['runs']} of {n['points']} runs archived{left}")
        print(f"archive: {folder} ({len(index['files'])} measurement and record files beside)")
        return 0
    restored = archive.restore_experiment(folder, Path(spec.out))
    for rel, n in restored.items():
        print(f"{rel}: {n} runs restored")
    print(f"restored into {Path(spec.out).resolve()}; `run` trains only what is left")
    return 0


def _parser() -> argparse.ArgumentParser:
    doc = __doc__
    ap = argparse.ArgumentParser(prog="python -m tools.experiment", description=doc.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=doc.split("\n\n", 1)[1])
    sub = ap.add_subparsers(dest="command", required=True)
    for name, text in (("run", "train (resumable), measure and write the report"),
                       ("report", "write the report from the finished runs (measuring what is missing)"),
                       ("plan", "print the arms, their costs and the training commands"),
                       ("status", "where the runs stand, stage by stage (trains nothing)"),
                       ("archive", "keep the finished runs slim (no checkpoints) in a folder to commit"),
                       ("restore", "write an archive's runs back into the runs folder, to go on from them")):
        p = sub.add_parser(name, help=text)
        p.add_argument("spec", help="experiment spec, e.g. experiments/evolution.yaml")
        p.add_argument("--quick", action="store_true", help="tiny models, a few steps, one seed (<out>-quick)")
        p.add_argument("--out", help="folder of the runs (default: the spec's out:)")
        p.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                       help="overrides for every arm, after the spec's set: (e.g. data.cache_dir=/tmp/cache)")
        if name in ("archive", "restore"):
            p.add_argument("--dest" if name == "archive" else "--src", metavar="FOLDER",
                           help="the archive folder (default: <report>/runs; --quick: <out>-archive)")
        if name not in ("plan", "status", "archive", "restore"):
            p.add_argument("--report", help="report folder (default: the spec's report:, or <out>/report)")
        if name == "run":
            p.add_argument("--jobs", type=int, default=1, help="runs trained at the same time (default 1)")
            p.add_argument("--threads", type=int, help="torch threads per trainer (default: torch's)")
            p.add_argument("--amend", metavar="REASON",
                           help="accept a spec whose decision-relevant part changed after its seeded runs began; the "
                                "change (old hash, new hash, keys, REASON) is recorded and the report prints it")
            p.add_argument("--launcher", choices=["python", "slurm"], default="python",
                           help="train each run on this machine, or as one SLURM job (submitit; --slurm-* options)")
            launch.add_arguments(p)
    return ap


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    via = None
    try:
        spec = load_spec(args.spec, quick=args.quick, extra_set=args.set)
        if args.out:
            spec = dataclasses.replace(spec, out=args.out)
        if args.command == "plan":
            plan(spec)
            return 0
        if args.command == "status":
            print(status.status_text(Path(spec.out), RECORD))
            return 0
        if args.command in ("archive", "restore"):
            return archive_or_restore(spec, args)
        if args.command == "run":
            if args.jobs < 1 or (args.threads is not None and args.threads < 1):
                raise RecipeError("--jobs and --threads must be >= 1")
            via = RefusalRecorder(launch.from_args(args))  # a refused point: refused in its sweep's manifest
            with launch.use(via):
                ctx = run_experiment(spec, jobs=args.jobs, threads=args.threads,
                                     command=regenerate_command(spec, args), amend=args.amend)
        else:
            record = with_current_words(read_record(Path(spec.out)), spec, resolve_arms(spec))
            record["spec"]["out"] = spec.out  # where the record is now (a restored or moved folder, --out)
            changed = registration.drift(spec, record) if record.get("registration") else []
            if changed:  # the spec file edited since: the report says where
                record["registration"]["spec_file_changed"] = changed
            ctx = finish_record(record, spec)  # the measurements, cached or computed; nothing trains
        report_dir = Path(args.report or (spec.report if not spec.quick else None) or Path(spec.out) / "report")
        # the command of the run that trained it (`report` keeps its --jobs/--threads)
        command = ctx.record.get("command") or regenerate_command(spec, args)
        paths = write_report(ctx.record, ctx.measurements, report_dir, command=command)
    except Stopped as e:
        print(f"stopped: {e}", file=sys.stderr)
        return 1
    except (RecipeError, RunError, ValueError) as e:
        print(f"error: {refusal_line(via, e)}", file=sys.stderr)
        return 2
    print(f"report: {paths['markdown']}")
    for name in paths["unfinished"]:
        print(f"not finished: {name} (see {spec.out}/sweep*/logs/{name}.log)", file=sys.stderr)
    return 1 if paths["unfinished"] else 0
