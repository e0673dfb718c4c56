"""The interface every training backend implements, and the launch facts a backend is chosen by.

A backend is how one kind of launch trains: which optimizer it builds over what this rank holds,
how ``accelerate.prepare`` wraps model and optimizer, how a loss is back-propagated and the
weights updated, what the global gradient norm is, and which files of a checkpoint hold its state.
The :class:`~archlab.train.Trainer` calls these methods in one order and never asks which backend
it holds::

    backend.check_resume(ckpt_dir, state)         # resuming: can this backend restore the optimizer?
    backend.shard(model)                          # keep on this rank what it holds
    optimizer = backend.build_optimizer(model, restore_from)
    backend.prepare(model, module, optimizer, restore_from)   # -> backend.model_t, backend.optimizer_t
    for step ...:
        for micro ...: backend.backward(loss)     # False: a rank saw a non-finite loss, nothing updated
        norm = backend.clip_grad_norm()
        backend.step()                            # (or backend.zero_grad() to drop the batch)
        backend.eval_module(model)                # evaluation forwards (in lockstep if collective_forward)
    weights = backend.save(folder, model)         # collective; the rank-0 weights to write
    backend.close()

The model never learns which backend trains it; the backend only wraps it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Optional, Union

import torch
from omegaconf import DictConfig
from torch import Tensor, nn

from archlab.train.checkpoint import CheckpointError
from archlab.train.dist import DistInfo


@dataclass(frozen=True)
class Launch:
    """What the launcher set up and the recipe asks for: the facts a backend is chosen by.

    ``deepspeed``: accelerate runs a DeepSpeed engine (``--use_deepspeed`` or a DeepSpeed accelerate
    config); ``zero_stage``: its ``zero_optimization.stage`` (0 without DeepSpeed); ``ep_size``: the
    recipe's ``model.moe.ep_size`` (1 for dense models and unsharded experts); ``world_size``: the
    processes torch.distributed holds (1 in a single process).
    """

    deepspeed: bool = False
    zero_stage: int = 0
    ep_size: int = 1
    world_size: int = 1


WeightsToSave = Union[nn.Module, dict[str, Tensor], None]


def _launch_name(state: dict) -> str:
    """The launch a checkpoint's state.json records, in words: ``DeepSpeed ZeRO-2, model.moe.ep_size=2``."""
    name = f"DeepSpeed ZeRO-{state.get('zero_stage', 0)}" if state.get("deepspeed") else "DDP or one process"
    return name + (f", model.moe.ep_size={state['ep_size']}" if int(state.get("ep_size", 1)) > 1 else "")


class Backend(ABC):
    """One way of training a model, as launched. Subclasses live one per module in this package and
    are listed in :data:`archlab.train.backends.BACKENDS`; :func:`~archlab.train.backends.select_backend`
    picks the one whose :meth:`handles` accepts the launch, after its :meth:`refusal` found nothing.

    After :meth:`prepare`, ``model_t`` is the wrapped model the training forward runs through (DDP,
    a DeepSpeed engine, or the model itself) and ``optimizer_t`` the wrapped optimizer.
    """

    name: ClassVar[str]  # short, recorded in env.json ("backend")

    def __init__(self, accelerator, info: DistInfo, cfg: DictConfig, launch: Launch):
        self.accelerator, self.info, self.cfg, self.launch = accelerator, info, cfg, launch
        self.optimizer: Optional[torch.optim.Optimizer] = None  # the plain optimizer, before any wrapping
        self.model_t: Optional[nn.Module] = None
        self.optimizer_t: Optional[torch.optim.Optimizer] = None

    # ------------------------------------------------------------------ which launches, what is refused

    @classmethod
    @abstractmethod
    def handles(cls, launch: Launch) -> bool:
        """Whether this backend trains ``launch``. Exactly one backend of ``BACKENDS`` handles each launch."""

    @classmethod
    def refusal(cls, launch: Launch, cfg: DictConfig) -> Optional[str]:
        """Why this backend cannot train ``cfg`` as launched (a message naming the recipe key or the
        launch, and what to use instead), or None. Asked before anything is built."""
        return None

    # ------------------------------------------------------------------ resuming

    def check_resume(self, ckpt_dir: Path, state: dict) -> Optional[str]:
        """Before anything is built, for a checkpoint whose weights are loaded into the model: None when
        this backend will restore its optimizer state, else a warning saying why the optimizer state
        (AdamW moments) restarts from zero. Raises CheckpointError when the checkpoint lacks the files
        this backend restores from, or holds them in a form it cannot read (another ZeRO stage, another
        ``train.optimizer``; a checkpoint without the field was written by AdamW), or was written by another
        number of processes where :meth:`world_size_refusal` says why that cannot be restored."""
        saved_opt, opt = str(state.get("optimizer", "adamw")), str(self.cfg.train.get("optimizer", "adamw"))
        if saved_opt != opt:  # another optimizer's state (its groups and moments) cannot be restored
            raise CheckpointError(f"{ckpt_dir}: written with train.optimizer={saved_opt}, this run uses "
                                  f"train.optimizer={opt}: resume with train.optimizer={saved_opt}")
        saved_ep = int(state.get("ep_size", 1))
        if saved_ep != self.launch.ep_size:  # the experts' optimizer states are laid out per ep rank
            return (f"checkpoint was written at model.moe.ep_size={saved_ep}, this run uses {self.launch.ep_size}: "
                    "weights loaded, the optimizer state (AdamW moments) restarts from zero")
        self.check_checkpoint(ckpt_dir, state)
        saved_world, why = state.get("world_size"), self.world_size_refusal()
        if saved_world is not None and int(saved_world) != self.info.world_size and why is not None:
            raise CheckpointError(
                f"{ckpt_dir}: checkpoint was written by {saved_world} process{'es' * (int(saved_world) != 1)} "
                f"({_launch_name(state)}), this run has "
                f"{self.info.world_size}: {why}; resume with {saved_world} processes (accelerate launch "
                f"--num_processes {saved_world})")
        return None

    def world_size_refusal(self) -> Optional[str]:
        """Why this backend cannot restore an optimizer state that another number of processes wrote
        (None: it can; the data then continues by the global batch, see the checkpointer)."""
        return "its optimizer state is split over the processes"

    @abstractmethod
    def check_checkpoint(self, ckpt_dir: Path, state: dict) -> None:
        """CheckpointError when ``ckpt_dir`` (written at the same ep_size) cannot restore this backend's
        optimizer state: its files are missing or of another launch kind."""

    # ------------------------------------------------------------------ building

    def shard(self, model: nn.Module) -> None:
        """Keep on this rank only what it holds (expert parallelism: its experts). Called after the
        full weights are loaded and before :meth:`build_optimizer`. Nothing by default."""

    @abstractmethod
    def build_optimizer(self, model: nn.Module, restore_from: Optional[Path]) -> torch.optim.Optimizer:
        """The recipe's optimizer (``train.optimizer``: ``archlab.train.optim.build_optimizer``) over
        what this rank holds, kept as ``self.optimizer``; a state this backend keeps in that plain
        optimizer is restored from ``restore_from`` here (None: a fresh optimizer)."""

    @abstractmethod
    def prepare(self, model: nn.Module, module: nn.Module, optimizer: torch.optim.Optimizer,
                restore_from: Optional[Path]) -> None:
        """Wrap ``module`` (``model``, or its ``torch.compile``'d version) and ``optimizer`` with
        ``accelerate.prepare`` into ``self.model_t`` and ``self.optimizer_t``; a state this backend keeps
        in the wrapped objects (a DeepSpeed engine's) is restored from ``restore_from`` after."""

    # ------------------------------------------------------------------ one step

    def backward(self, loss: Tensor) -> bool:
        """Back-propagate one micro batch's loss (inside ``accelerator.accumulate``). False when nothing
        was back-propagated because a loss of this step is not finite on some rank and this backend
        would update the weights inside this backward (the caller stops); True otherwise."""
        self.accelerator.backward(loss)
        return True

    @abstractmethod
    def clip_grad_norm(self) -> Union[float, Tensor]:
        """The global 2-norm of this step's gradient (of the whole model, over all ranks) before
        clipping; the update clips it to ``train.grad_clip`` (> 0), here or inside :meth:`step`.
        NaN or inf when the gradient is not finite. A float, or a 0-d tensor that the caller reads
        (``float``) when it needs the value: no host read here."""

    def step(self) -> None:
        """Update the weights with the accumulated gradient, then clear it."""
        self.optimizer_t.step()
        self.optimizer_t.zero_grad(set_to_none=True)

    def zero_grad(self) -> None:
        """Drop the accumulated gradient without updating (a skipped batch)."""
        self.optimizer_t.zero_grad(set_to_none=True)

    # ------------------------------------------------------------------ evaluation

    @property
    def collective_forward(self) -> bool:
        """Every forward is a collective (tokens exchanged, parameters gathered): in evaluation every
        rank must run as many forwards as the busiest one."""
        return False

    def eval_module(self, model: nn.Module) -> nn.Module:
        """What the evaluation forward runs through: the plain model, unless its parameters are
        partitioned (then the wrapped one, which gathers them)."""
        return model

    # ------------------------------------------------------------------ checkpoints

    @abstractmethod
    def save(self, folder: Path, model: nn.Module) -> WeightsToSave:
        """Write this backend's optimizer state into the checkpoint folder being built (collective: every
        rank calls it) and return what rank 0 writes as ``model.safetensors``: the model, or a state dict
        of the full (unsharded) weights. The checkpoint layout is in :mod:`archlab.train.checkpoint`."""

    def checkpoint_fields(self) -> dict[str, Any]:
        """The launch facts a checkpoint's state.json records (read back by :meth:`check_resume`)."""
        return {"deepspeed": self.launch.deepspeed, "zero_stage": self.launch.zero_stage,
                "ep_size": self.launch.ep_size, "optimizer": str(self.cfg.train.get("optimizer", "adamw"))}

    def describe(self) -> dict[str, Any]:
        """What env.json records about this backend."""
        return {"backend": self.name, "deepspeed_config": None}

    def close(self) -> None:
        """Let go of the wrapped model and optimizer (after ``accelerator.free_memory``)."""
        self.model_t = self.optimizer_t = None
