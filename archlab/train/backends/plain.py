"""One process, or DDP through accelerate (``--multi_gpu``; MULTI_CPU over gloo without GPUs).

accelerate averages the gradients over the ranks in backward; the norm is measured and clipped by
``accelerator.clip_grad_norm_`` before the plain AdamW step. A checkpoint holds the AdamW state in
``optimizer.pt`` (identical on every rank, written by rank 0).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch
from omegaconf import DictConfig
from torch import Tensor, nn

from archlab.train import checkpoint as ckpt
from archlab.train.backends.base import Backend, Launch, WeightsToSave
from archlab.train.optim import build_optimizer


class PlainBackend(Backend):
    """Every launch that is not DeepSpeed: one process, or DDP over all ranks."""

    name = "plain"

    @classmethod
    def handles(cls, launch: Launch) -> bool:
        return not launch.deepspeed

    @classmethod
    def refusal(cls, launch: Launch, cfg: DictConfig) -> Optional[str]:
        if launch.ep_size > 1:
            return (f"model.moe.ep_size={launch.ep_size}: expert parallelism runs under DeepSpeed; launch with "
                    "accelerate launch --config_file recipes/launch/zero0.yaml (or set model.moe.ep_size=1)")
        return None

    def check_checkpoint(self, ckpt_dir: Path, state: dict) -> None:
        if not (ckpt_dir / ckpt.OPTIMIZER).is_file():
            raise ckpt.CheckpointError(f"{ckpt_dir / ckpt.OPTIMIZER}: missing (was this checkpoint written under "
                                       "DeepSpeed? resume it with the same launcher)")

    def world_size_refusal(self) -> Optional[str]:
        return None  # optimizer.pt is the whole AdamW state, the same on every rank

    def build_optimizer(self, model: nn.Module, restore_from: Optional[Path]) -> torch.optim.Optimizer:
        self.optimizer = build_optimizer(model, self.cfg.train)
        if restore_from is not None:
            self.optimizer.load_state_dict(ckpt.load_optimizer_state(restore_from))
        return self.optimizer

    def prepare(self, model: nn.Module, module: nn.Module, optimizer: torch.optim.Optimizer,
                restore_from: Optional[Path]) -> None:
        self.model_t, self.optimizer_t = self.accelerator.prepare(module, optimizer)

    def clip_grad_norm(self) -> Tensor:
        """The norm as a tensor on the device: the trainer reads it with the step's other numbers."""
        clip = self.cfg.train.grad_clip
        return self.accelerator.clip_grad_norm_(self.model_t.parameters(), clip if clip > 0 else float("inf"))

    def save(self, folder: Path, model: nn.Module) -> WeightsToSave:
        if self.info.is_main:
            torch.save(self.optimizer.state_dict(), folder / ckpt.OPTIMIZER)
        return model
