"""Router tracing (``train.router_trace_every``): every n steps, what each MoE router decided for a
fixed sample of the step's first micro batch (the files: :mod:`archlab.train.router_trace`).

The sample's rows are chosen before the first forward and recorded during it only (not during a
recomputation, not for later micro batches); the trace goes to the host after the backward, and is
written once the step is counted (marked skipped when its batch was dropped). Chosen on the main
process of an MoE run with tracing on.
"""

from __future__ import annotations

import time
from typing import Any, Optional

from torch import Tensor

from archlab.nn.moe import start_trace, stop_trace, take_trace
from archlab.train.callbacks.base import Callback, Trainer
from archlab.train.router_trace import RouterTracer


class RouterTracing(Callback):
    def __init__(self, tracer: RouterTracer) -> None:
        self.tracer = tracer
        self.traced = False  # this step is traced
        self.trace: Optional[tuple] = None  # (trace, token ids, seconds) of this step, written after it

    def on_build(self, trainer: Trainer) -> None:
        self.tracer.start(trainer.step)  # a resumed run traces the steps after its checkpoint again

    def before_step(self, trainer: Trainer) -> None:
        self.traced = self.tracer.due(trainer.step + 1)

    def before_forward(self, trainer: Trainer, micro: int, x_BW: Tensor) -> None:
        if self.traced and micro == 0:
            self.inputs_BS = trainer.objective.split(x_BW, trainer.objective.window_ahead)[0]
            self.index_T = self.tracer.sample(trainer.step + 1, self.inputs_BS.numel())
            start_trace(trainer.model, self.index_T.to(trainer.device))

    def after_forward(self, trainer: Trainer, micro: int, x_BW: Tensor) -> None:
        if self.traced and micro == 0:
            stop_trace(trainer.model)  # the step's first forward only
            self.token_ids_T = self.inputs_BS.reshape(-1).index_select(0, self.index_T.to(x_BW.device))

    def after_backward(self, trainer: Trainer) -> None:
        if self.traced:
            t0 = time.perf_counter()
            trace = take_trace(trainer.model)  # to the host: the only synchronisation tracing adds
            self.trace = (trace, self.token_ids_T.cpu(), time.perf_counter() - t0) if trace is not None else None

    def after_step(self, trainer: Trainer, result: dict[str, Any]) -> None:
        if self.trace is None:
            return
        trace, token_ids, seconds = self.trace
        self.trace = None
        self.tracer.write(trainer.step, trace, token_ids, trainer.cfg.train.seq_len, seconds,
                          skipped=not result["updated"])
