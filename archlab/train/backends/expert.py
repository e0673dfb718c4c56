"""Expert parallelism (``model.moe.ep_size`` > 1) under DeepSpeed, at ZeRO stage 0 or 1-2.

Each rank keeps E / ep_size of every MoE layer's E experts (:mod:`archlab.parallel.expert`); the
engine reduces expert gradients over the expert-data-parallel group, the dense ones over all
ranks; every forward exchanges tokens with the other ranks of the expert-parallel group, so every
rank runs as many evaluation forwards as the busiest one. A checkpoint holds the full weights in
``model.safetensors`` (experts gathered over the group: loadable at any ep_size) and, per rank r,
``optimizer_rank<r>.pt``: its AdamW state at stage 0, its ZeRO partition at stages 1-2 (resumed
with the same number of processes, ep_size and ZeRO kind).

- :class:`ExpertZero0Backend` (ZeRO-0): the engine's clipping is off; the gradient is clipped by the
  norm of the whole model (experts' squared norms summed over the group) in a pre-step hook of the
  plain AdamW (``ExpertParallelClipping``).
- :class:`ExpertZeroBackend` (ZeRO-1/2): the ZeRO optimizer partitions the expert groups over the
  expert-data-parallel group; its norm (summed over all partitions) is the global one, and it clips.
"""

from __future__ import annotations

from abc import abstractmethod
from pathlib import Path
from typing import Optional

import torch
from omegaconf import DictConfig
from torch import nn

from archlab.parallel.expert import (
    ExpertParallelClipping,
    attach_to_deepspeed_engine,
    consolidated_state_dict,
    enable_expert_parallel,
)
from archlab.train import checkpoint as ckpt
from archlab.train.backends.base import Launch, WeightsToSave
from archlab.train.backends.zero import DeepSpeedBackend
from archlab.train.parallel import _deepspeed_safe_globals


def rank_optimizer_state(ckpt_dir: Path, rank: int, zero: bool) -> dict:
    """An expert-parallel rank's optimizer file: a ZeRO-1/2 partition (``zero``) or a plain AdamW
    state (ZeRO stage 0); the other kind is refused, naming the stage to resume with."""
    path = ckpt_dir / ckpt.rank_optimizer_name(rank)
    with torch.serialization.safe_globals(_deepspeed_safe_globals()):  # ZeRO's loss scaler, stage enum
        state = ckpt.load_optimizer_state(ckpt_dir, path.name)
    written_zero = "base_optimizer_state" in state
    if written_zero != zero:
        raise ckpt.CheckpointError(
            f"{path}: written at DeepSpeed ZeRO stage {'1-2' if written_zero else '0'}, this launch uses "
            f"{'1-2' if zero else '0'}: resume with the ZeRO stage the checkpoint was trained with")
    return state


class ExpertBackend(DeepSpeedBackend):
    """What expert parallelism shares at every ZeRO stage (not a backend of its own: the two below are)."""

    @classmethod
    def refusal(cls, launch: Launch, cfg: DictConfig) -> Optional[str]:
        why = super().refusal(launch, cfg)  # ZeRO-3 included: MoE is refused there
        if why is None and launch.world_size % launch.ep_size:
            why = f"model.moe.ep_size={launch.ep_size} must divide the number of processes ({launch.world_size})"
        return why

    @property
    def collective_forward(self) -> bool:  # every forward exchanges tokens with the other ranks of the group
        return True

    def check_checkpoint(self, ckpt_dir: Path, state: dict) -> None:
        name = ckpt.rank_optimizer_name(self.info.rank)
        if not (ckpt_dir / name).is_file():
            raise ckpt.CheckpointError(f"{ckpt_dir / name}: missing (the checkpoint was written with fewer "
                                       "processes; resume with the same number of processes)")

    def shard(self, model: nn.Module) -> None:
        enable_expert_parallel(model, self.launch.ep_size)

    def after_engine(self, model: nn.Module, restore_from: Optional[Path]) -> None:
        attach_to_deepspeed_engine(self.engine, model)  # expert gradients reduced over their group

    @abstractmethod
    def rank_optimizer(self):
        """What holds this rank's optimizer state (saved as ``optimizer_rank<r>.pt``)."""

    def save(self, folder: Path, model: nn.Module) -> WeightsToSave:
        weights = consolidated_state_dict(model)  # each rank holds its experts: gathered (collective)
        torch.save(self.rank_optimizer().state_dict(), folder / ckpt.rank_optimizer_name(self.info.rank))
        return weights


class ExpertZero0Backend(ExpertBackend):
    """Expert parallelism at ZeRO stage 0: this rank's plain AdamW (its experts and the dense
    weights), the gradient clipped by the norm of the whole model in the optimizer's pre-step hook."""

    name = "expert-zero0"

    @classmethod
    def handles(cls, launch: Launch) -> bool:
        return launch.deepspeed and launch.ep_size > 1 and launch.zero_stage == 0

    def build_optimizer(self, model: nn.Module, restore_from: Optional[Path]) -> torch.optim.Optimizer:
        super().build_optimizer(model, restore_from)  # expert parameters in DeepSpeed's MoE groups
        if restore_from is not None:  # this rank's AdamW state
            self.optimizer.load_state_dict(rank_optimizer_state(restore_from, self.info.rank, zero=False))
        return self.optimizer

    def before_engine(self, model: nn.Module, conf: dict) -> None:
        conf["gradient_clipping"] = 0.0  # clipped by ExpertParallelClipping (true global norm)

    def after_engine(self, model: nn.Module, restore_from: Optional[Path]) -> None:
        super().after_engine(model, restore_from)
        self.clipping = ExpertParallelClipping(self.optimizer, self.cfg.train.grad_clip)

    def clip_grad_norm(self) -> float:
        """Measured (and clipped) in the optimizer's pre-step hook, which the engine ran in backward."""
        norm = self.clipping.last_norm
        return float("nan") if norm is None else norm

    def rank_optimizer(self):
        return self.optimizer


class ExpertZeroBackend(ExpertBackend):
    """Expert parallelism at ZeRO stage 1 or 2: the ZeRO optimizer partitions the state (the expert
    groups over the expert-data-parallel group), clips by the global norm and reports it. Stage 3
    is refused (DeepSpeed's MoE support ends at stage 2)."""

    name = "expert-zero"

    @classmethod
    def handles(cls, launch: Launch) -> bool:
        return launch.deepspeed and launch.ep_size > 1 and launch.zero_stage > 0

    def after_engine(self, model: nn.Module, restore_from: Optional[Path]) -> None:
        super().after_engine(model, restore_from)
        if restore_from is None:
            return
        # this rank's ZeRO state (its partition of the dense groups, its experts' groups: AdamW moments
        # and fp32 master weights); DeepSpeed indexes the list by the data-parallel rank, each rank
        # reads only its own file
        sd = rank_optimizer_state(restore_from, self.info.rank, zero=True)
        self.rank_optimizer().load_state_dict([sd] * self.info.world_size, load_optimizer_states=True,
                                              load_from_fp32_weights=True)

    def rank_optimizer(self):
        return self.engine.optimizer  # the ZeRO optimizer: this rank's partition
