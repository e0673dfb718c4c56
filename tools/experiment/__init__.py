"""Experiments: named arms (a recipe + overrides) x seeds at one budget, trained by ``tools.sweep``,
measured, and reported with intervals.

    python -m tools.experiment run experiments/evolution.yaml              # train, measure, write the report
    python -m tools.experiment run experiments/evolution.yaml --quick      # tiny models, a few steps, one seed
    python -m tools.experiment report experiments/evolution.yaml           # the report again from the runs
    python -m tools.experiment plan experiments/evolution.yaml             # arms, steps and costs; trains nothing
    python -m tools.experiment status experiments/evolution.yaml           # each stage's runs: done, to go, failed

The package, one module per job: ``load`` (the YAML, checked once, into the typed spec of
``analysis.experiment_spec``), ``arms`` (each arm's recipe and overrides), ``run`` (the stages and the record),
``plan``, ``cli``; the stages' own modules are ``tools.experiment_tuning``, ``experiment_ceg``, ``experiment_seeds``
and ``experiment_status``.

Three stages train. (1) Tuning (``tools.experiment_tuning``, ``<out>/tune/``): each arm's lr is
chosen on its own by a log grid at the full budget, extended until the best lr is interior (or
tuned at the muP base width and transferred, or shared by design, said so). (2) The seeded runs:
every arm at its tuned lr once per seed (and per cell of ``grid``, if any) as one point of a
``tools.sweep`` sweep under ``<out>/sweep/``: resumable (a finished run is skipped, a started one continues from
its checkpoint), one run folder per point, ``manifest.json`` with each run's status, wall time and
peak resident memory. Arms whose budget is a wall-clock time (``match_time_of``) train in a second
sweep, ``<out>/sweep-time/``, once the runs that set their time are done. (3) The compute curve
(``tools.experiment_ceg``, ``<out>/ceg/``): WSD trunks of the reference arm with cooldown branches
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

Spec file (YAML):

    name: evolution                    # report title and folder names
    title: The architecture-evolution ladder
    description: ...                   # what is trained and why (quoted in the report)
    claim: ...                         # the published claim the experiment checks
    out: runs/experiments/evolution    # run folders (git-ignored); --quick adds -quick
    report: docs/experiments/evolution # where `run` writes the report (--quick: <out>/report)
    seeds: [0, 1, 2]                   # train.seed of every arm (default: 3 seeds); or a sequential design,
                                       # {min: 3, max: 9, step: 2, spending: pocock}: the unresolved
                                       # comparisons get more seeds (tools.experiment_seeds)
    budget: {flops: 4.0e12}            # or {tokens: 1.0e6}: the same for every arm unless the arm says otherwise
    set: [model.vocab_size=2048]       # overrides for every arm
    grid: {train.lr: [1.0e-3, 3.0e-3]} # optional: crossed with every arm and seed
    reference: vanilla                 # paired differences are taken against it (default: the first arm)
    tune: {lr: [1.0e-3, 2.0e-3, 4.0e-3], budget_fraction: 1.0, seed: 1000, max_extend: 3}
                                       # required: each arm's lr (tools.experiment_tuning); or {lr: [...],
                                       # mup: true} (width-only arms under muP), or {shared: <why>} (by design)
    ceg: {fractions: [0.25, 0.5, 1.0, 2.0], seeds: [0, 1, 2], decay_fraction: 0.2, shape: sqrt}
                                       # optional: the reference's loss against compute (tools.experiment_ceg)
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
      kv_cache: {}                     # validation loss against KV-cache bytes per token
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

from analysis.experiment_spec import Arm, Budget, Spec
from tools.experiment.arms import resolve_arms
from tools.experiment.cli import main, regenerate_command
from tools.experiment.load import QUICK_BUDGET, QUICK_SET, QUICK_TUNE, load_spec
from tools.experiment.plan import plan
from tools.experiment.run import (
    RECORD,
    Stopped,
    grid_of,
    match_time_budgets,
    measure,
    planned_points,
    read_record,
    run_experiment,
    sweep_spec,
    with_current_words,
    write_record,
)

__all__ = ["Arm", "Budget", "Spec", "resolve_arms", "main", "regenerate_command", "QUICK_BUDGET", "QUICK_SET",
           "QUICK_TUNE", "load_spec", "plan", "RECORD", "Stopped", "grid_of", "match_time_budgets", "measure",
           "planned_points", "read_record", "run_experiment", "sweep_spec", "with_current_words", "write_record"]
