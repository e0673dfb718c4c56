"""The non-finite policy (``train.on_nonfinite``): what a step whose loss or gradient norm is not
finite does. The weights are never updated by such a step; ``stop`` ends the run with a
NonFiniteError naming the last good checkpoint, ``skip`` counts the step, drops its batch and writes a
``skip`` row. Always chosen (first, so that the other callbacks see the step counted).
"""

from __future__ import annotations

from typing import Any

from archlab.train.callbacks.base import Callback, Trainer
from archlab.train.faults import NonFiniteError


class NonFinitePolicy(Callback):
    def __init__(self, skip: bool) -> None:
        self.skip = skip

    def after_step(self, trainer: Trainer, result: dict[str, Any]) -> None:
        if result["updated"]:
            return
        loss, grad_norm = result["loss"], result["grad_norm"]
        if not self.skip:
            raise NonFiniteError(nonfinite_message(trainer, loss, grad_norm))
        trainer.step += 1
        trainer.log(f"step {trainer.step}: non-finite loss/grad norm ({loss}, {grad_norm}): batch skipped")
        trainer.write({"kind": "skip", "step": trainer.step, "tokens": trainer.tokens,
                       **{k: result[k] for k in ("loss", "aux_loss", "grad_norm")}})


def nonfinite_message(trainer: Trainer, loss: float, grad_norm: float) -> str:
    keep = f"the last good checkpoint is {trainer.last_ckpt}" if trainer.last_ckpt else "no checkpoint was written yet"
    return (f"non-finite numbers at step {trainer.step + 1} (loss={loss}, grad_norm={grad_norm}): stopped before "
            f"updating the weights; {keep}. Lower train.lr, check the data, or set train.on_nonfinite=skip")
