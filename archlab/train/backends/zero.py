"""DeepSpeed ZeRO stages 0-3 through accelerate, for models whose experts are not sharded.

:class:`DeepSpeedBackend` is what every DeepSpeed launch shares (expert parallelism builds on it):
the recipe's batch geometry and clipping written into the DeepSpeed config before the engine is
built, the engine updating inside the last micro batch's backward (so a non-finite loss must stop
the run before that backward, and ``train.on_nonfinite=skip`` is refused), and the engine's global
gradient norm. :class:`ZeroBackend` keeps the engine's own checkpoint under ``zero/``: per rank its
partition of the fp32 weights and AdamW moments; at ZeRO-3 the parameters are partitioned too, so
evaluation runs through the engine and ``model.safetensors`` is gathered onto rank 0.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Union

import torch
from omegaconf import DictConfig
from torch import Tensor, nn

from archlab.train import checkpoint as ckpt
from archlab.train.backends.base import Backend, Launch, WeightsToSave
from archlab.train.dist import all_reduce_sum
from archlab.train.optim import build_optimizer
from archlab.train.parallel import (
    deepspeed_engine,
    fill_deepspeed_config,
    safe_deepspeed_load,
    zero3_consolidated_state_dict,
    zero3_traceable_outputs,
    zero_stage_refusal,
)

ZERO_DIR = "zero"  # the engine's own checkpoint inside a checkpoint folder (tag "state")


class DeepSpeedBackend(Backend):
    """What every DeepSpeed launch shares. Subclasses say which launches they handle, adjust the
    DeepSpeed config and the model before the engine is built (:meth:`before_engine`), and finish
    the wiring and restore their state after it (:meth:`after_engine`)."""

    _nonfinite: Optional[Tensor] = None  # the non-finite losses of this step's micro batches so far (a count)

    @classmethod
    def refusal(cls, launch: Launch, cfg: DictConfig) -> Optional[str]:
        if cfg.train.on_nonfinite == "skip":
            return ("train.on_nonfinite='skip' is not supported under DeepSpeed (the engine updates inside "
                    "backward); use train.on_nonfinite=stop or launch without DeepSpeed")
        return zero_stage_refusal(launch.zero_stage, cfg)

    def build_optimizer(self, model: nn.Module, restore_from: Optional[Path]) -> torch.optim.Optimizer:
        self.optimizer = build_optimizer(model, self.cfg.train, expert_groups=self.launch.ep_size > 1)
        return self.optimizer

    def prepare(self, model: nn.Module, module: nn.Module, optimizer: torch.optim.Optimizer,
                restore_from: Optional[Path]) -> None:
        t = self.cfg.train
        conf = fill_deepspeed_config(self.accelerator, t, self.info.world_size, d_model=self.cfg.model.d_model)
        self.before_engine(model, conf)
        self.model_t, self.optimizer_t = self.accelerator.prepare(module, optimizer)
        self.after_engine(model, restore_from)

    def before_engine(self, model: nn.Module, conf: dict) -> None:
        """Adjust the filled DeepSpeed config ``conf`` and the model before ``prepare`` builds the engine."""

    def after_engine(self, model: nn.Module, restore_from: Optional[Path]) -> None:
        """Finish the wiring once the engine exists; restore its state from ``restore_from`` (or None)."""

    @property
    def engine(self):
        """The DeepSpeedEngine accelerate built (after :meth:`prepare`)."""
        return deepspeed_engine(self.accelerator)

    def backward(self, loss: Tensor) -> bool:
        """The engine updates inside the backward of the step's last micro batch (accelerate's
        ``sync_gradients``): before it, every micro batch's loss on every rank is checked, at once (one
        all-reduce and one host read per step; the earlier micro batches' non-finite losses only
        reach the accumulated gradient, which the stopping run never applies)."""
        bad = torch.isfinite(loss.detach()).logical_not().float()
        self._nonfinite = bad if self._nonfinite is None else self._nonfinite + bad
        if self.accelerator.sync_gradients:
            bad, self._nonfinite = self._nonfinite, None
            if bool(all_reduce_sum(bad) > 0):
                return False
        self.accelerator.backward(loss)
        return True

    def world_size_refusal(self) -> Optional[str]:
        return ("DeepSpeed keeps one optimizer file per process (its ZeRO partition; under expert parallelism "
                "its experts' state), read back by the same process only")

    def clip_grad_norm(self) -> Union[float, Tensor]:
        """The engine clipped inside its step; it reports the norm before clipping (a float, or a tensor
        the trainer reads with the step's other numbers)."""
        norm = self.engine.get_global_grad_norm()
        return 0.0 if norm is None else norm

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "deepspeed_config": self.accelerator.state.deepspeed_plugin.deepspeed_config}


class ZeroBackend(DeepSpeedBackend):
    """DeepSpeed at ZeRO stage 0 (data parallel through the engine), 1 (optimizer states sharded),
    2 (and gradients) or 3 (and parameters); experts, if any, whole on every rank (ep_size 1).
    ZeRO-3 refuses MoE models and ``train.compile`` (:func:`archlab.train.parallel.zero_stage_refusal`)."""

    name = "zero"

    @classmethod
    def handles(cls, launch: Launch) -> bool:
        return launch.deepspeed and launch.ep_size == 1

    @property
    def collective_forward(self) -> bool:  # ZeRO-3: every forward gathers the partitioned parameters
        return self.launch.zero_stage == 3

    def eval_module(self, model: nn.Module) -> nn.Module:
        return self.model_t if self.launch.zero_stage == 3 else model  # ZeRO-3: the engine's forward gathers

    def check_checkpoint(self, ckpt_dir: Path, state: dict) -> None:
        stage = self.launch.zero_stage
        if state.get("deepspeed") and (state.get("zero_stage", 0) == 3) != (stage == 3):
            raise ckpt.CheckpointError(f"{ckpt_dir}: written at DeepSpeed ZeRO stage {state.get('zero_stage', '0-2')}, "
                                       f"this launch uses stage {stage} (ZeRO-3 partitions the parameters, "
                                       "stages 0-2 do not): resume with the ZeRO stage the checkpoint was trained with")
        if not (ckpt_dir / ZERO_DIR).is_dir():
            raise ckpt.CheckpointError(f"{ckpt_dir / ZERO_DIR}: missing (the checkpoint was not written under "
                                       "DeepSpeed; resume it with the launcher it was trained with)")

    def before_engine(self, model: nn.Module, conf: dict) -> None:
        if self.launch.zero_stage == 3:
            zero3_traceable_outputs(model)  # ZeRO-3 re-gathers the LM head for the fused loss's backward

    def after_engine(self, model: nn.Module, restore_from: Optional[Path]) -> None:
        if restore_from is None:
            return
        zero = restore_from / ZERO_DIR
        engine = self.engine
        safe_deepspeed_load(engine)
        try:
            engine.load_checkpoint(str(zero), tag="state", load_module_strict=True, load_optimizer_states=True,
                                   load_lr_scheduler_states=False)
        except Exception as e:
            raise ckpt.CheckpointError(f"{zero}: cannot load the DeepSpeed state ({str(e).splitlines()[0]})") from None

    def save(self, folder: Path, model: nn.Module) -> WeightsToSave:
        self.engine.save_checkpoint(str(folder / ZERO_DIR), tag="state", save_latest=False)
        if self.launch.zero_stage == 3:  # the parameters are partitioned: gathered, onto rank 0 (collective)
            return zero3_consolidated_state_dict(self.engine)
        return model
