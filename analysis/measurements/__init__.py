"""The measurements an experiment spec can name (``measurements:`` in ``experiments/*.yaml``, run
by ``python -m tools.experiment``), besides the final validation loss and the costs that every
report has. One module per measurement, named as in the spec; each owns

- the settings it accepts (``keys``), checked when the spec loads (``check``: an unknown key or a
  bad value is an error naming it),
- what it computes beyond the run folders after training, if anything (``run``; cached under
  ``<out>/measurements/``), and
- its section of the report (``section``; ``analysis.experiment_report`` writes them in the spec's
  order, the ones marked ``last`` (``throughput``) after the others).

What a measurement computes (a model evaluated again, a step timed) lives in its module too, beside the
settings and the section that read it: one measurement, one module.

Each module registers its measurement in :data:`MEASUREMENTS` (``@register``, ``base.py``) when
it is imported below; to add a measurement, write its module and import it here.

- ``ladder``: each arm against the arm it extends; waterfall plot.
- ``extrapolation``: loss at multiples of the training context, as trained and with evaluation-time variants.
- ``init_grad_norms``: per-layer gradient norms at initialisation, per arm, depth and seed.
- ``stability``: the outcome of every cell of the grid per arm: learned | did not learn | diverged.
- ``routing``: MoE load imbalance (MaxVio) against validation loss; load heat maps.
- ``wall_clock``: equal training FLOPs against equal training time (time-matched arms).
- ``kv_cache``: validation loss against KV-cache bytes per token.
- ``moe_breakdown``: each feed-forward layer's time phase by phase (router, dispatch, experts, combine), MoE
  against the dense FFN, beside the whole training step.
- ``throughput``: every arm's training step timed side by side (interleaved rounds).
- ``val_sampling``: the validation set's own sampling error (bootstrap over windows) beside the seed intervals.
- ``finetune``: the fine-tuning stage's runs on the labelled task's test split, per pre-training budget, each arm
  against the reference of its budget (paired by seed, Holm).
- ``cloze``: one held-out id per window, each model type (decoder, encoder, encoder-decoder) through its own
  interface: the task arms of different objectives are compared on.
- ``mqar``, ``mad``: synthetic probes (multi-query associative recall; the MAD tasks), each arm's architecture
  trained from scratch on the task, accuracy at the answer positions.
"""

from analysis.measurements import (  # noqa: F401  (each registers its measurement)
    cloze,
    extrapolation,
    finetune,
    init_grad_norms,
    kv_cache,
    ladder,
    mad,
    moe_breakdown,
    mqar,
    routing,
    stability,
    throughput,
    val_sampling,
    wall_clock,
)
from analysis.measurements.base import MEASUREMENTS, Measurement, register  # noqa: F401
