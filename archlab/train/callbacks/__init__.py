"""The loop's optional features as callbacks (:class:`Callback`: the hooks and their call order).

- ``nonfinite``: the non-finite policy (``train.on_nonfinite``: stop or skip)
- ``moe``: MoE bookkeeping (balancing terms around each step, routing statistics, routing.jsonl)
- ``router_trace``: the router trace (``train.router_trace_every``)
- ``branch``: WSD branching (``train.branch_from``)
- ``metrics``: train rows in metrics.jsonl and the progress bar
- ``trackers``: experiment trackers (``train.trackers``)
"""

from __future__ import annotations

from archlab.nn.moe import moe_layers
from archlab.trackers import requested as trackers_requested
from archlab.train.callbacks.base import Callback, Trainer
from archlab.train.callbacks.branch import Branch
from archlab.train.callbacks.metrics import MetricsLogger
from archlab.train.callbacks.moe import MoEBookkeeping
from archlab.train.callbacks.nonfinite import NonFinitePolicy
from archlab.train.callbacks.router_trace import RouterTracing
from archlab.train.callbacks.trackers import Trackers
from archlab.train.router_trace import tracer_for


def choose(trainer: Trainer) -> list[Callback]:
    """The callbacks of a run, in call order, from its recipe and model (called once, the model built).
    The non-finite policy comes first (a skipped step is counted before the others see it), the MoE
    bookkeeping before the logger (the routing statistics go into the step's row)."""
    t = trainer.cfg.train
    moe = bool(moe_layers(trainer.model))
    tracer = tracer_for(trainer.run_dir, t, trainer.info.is_main, trainer.cfg.model.moe is not None)
    chosen: list[Callback] = [NonFinitePolicy(skip=t.on_nonfinite == "skip")]
    chosen += [MoEBookkeeping()] if moe else []
    chosen += [RouterTracing(tracer)] if tracer is not None else []
    chosen += [Branch()] if t.branch_from is not None else []
    chosen += [MetricsLogger()]
    chosen += [Trackers()] if trainer.info.is_main and trackers_requested(t) else []
    return chosen


__all__ = ["Branch", "Callback", "MetricsLogger", "MoEBookkeeping", "NonFinitePolicy", "RouterTracing", "Trackers",
           "choose"]
