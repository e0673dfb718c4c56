"""MoE bookkeeping: what an MoE model needs around each optimizer step, and its routing record.

Before a step every balancing term starts it (the global-batch auxiliary loss zeroes its counts);
after an update each term takes its step (the aux-loss-free bias moves, from the counts summed over
ranks). When a step reads the routing statistics (a metrics row is due, or ``train.routing_every``)
they are checked on this rank, summed over ranks and added to the step's metrics row; at the
``routing_every`` steps they are also appended to routing.jsonl. Chosen for a model with MoE layers.
"""

from __future__ import annotations

from typing import Any

from archlab.nn.moe import balance_step, moe_layers, routing_stats, start_step
from archlab.train.callbacks.base import Callback, Trainer
from archlab.train.dist import all_reduce_sum


class MoEBookkeeping(Callback):
    def __init__(self) -> None:
        self.read_at = 0  # the step where the routing statistics' current window starts

    def _every(self, trainer: Trainer) -> int:
        t = trainer.cfg.train
        return t.routing_every or t.log_every

    def on_build(self, trainer: Trainer) -> None:
        self.read_at = trainer.step

    def on_start(self, trainer: Trainer) -> None:
        self.read_at = trainer.step

    def reads_stats(self, trainer: Trainer, step: int) -> bool:
        return step % self._every(trainer) == 0

    def before_step(self, trainer: Trainer) -> None:
        start_step(trainer.model)  # every rank, before the first micro batch

    def after_update(self, trainer: Trainer, result: dict[str, Any], read: bool) -> None:
        balance_step(trainer.model, all_reduce_sum)
        if read:
            check_local_routing(trainer.model, trainer.info.rank)
            result["extra"].update(routing_stats(trainer.model, all_reduce_sum))

    def after_step(self, trainer: Trainer, result: dict[str, Any]) -> None:
        moe = result["extra"]
        if not result["updated"] or not moe:
            return
        moe["moe/window_steps"] = trainer.step - self.read_at  # the steps since the previous read
        self.read_at = trainer.step
        if trainer.step % self._every(trainer) == 0 and trainer.metrics is not None:
            trainer.metrics.write_routing({"step": trainer.step, "tokens": trainer.tokens, **moe})


def check_local_routing(model, rank: int) -> None:
    """This rank's routing window (before the all-rank sum): kept slots per expert must add up to
    tokens * top_k - dropped slots. RuntimeError naming the layer and rank otherwise."""
    for i, layer in enumerate(moe_layers(model)):
        E, K, w = layer.stats.E, layer.stats.K, layer.stats.window  # [counts_E, tokens, dropped, ...]
        counts, tokens, dropped = float(w[:E].sum()), float(w[E]), float(w[E + 1])
        if round(counts) != round(tokens * K - dropped):
            raise RuntimeError(f"routing bookkeeping broken on rank {rank}, MoE layer {i}: sum(counts)={counts} "
                               f"but tokens*K - dropped = {tokens * K - dropped}")
