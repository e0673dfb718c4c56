"""Training backends: how each kind of launch builds the optimizer, wraps the model, steps, measures
the gradient norm and checkpoints its state, behind one interface (:class:`Backend`).

    backend = select_backend(accelerator, info, cfg)   # from the accelerate state and the recipe

| backend | launch | module |
|---|---|---|
| ``plain`` | one process, or DDP (``--multi_gpu``) | :mod:`.plain` |
| ``zero`` | DeepSpeed ZeRO 0-3, experts unsharded | :mod:`.zero` |
| ``expert-zero0`` | DeepSpeed ZeRO-0 with ``model.moe.ep_size`` > 1 | :mod:`.expert` |
| ``expert-zero`` | DeepSpeed ZeRO-1/2 with ``model.moe.ep_size`` > 1 | :mod:`.expert` |

A new backend is one module with a :class:`Backend` subclass, listed in :data:`BACKENDS`.
"""

from __future__ import annotations

from omegaconf import DictConfig

from archlab.config.validate import RecipeError
from archlab.optim import optimizer_class
from archlab.train.backends.base import Backend, Launch
from archlab.train.backends.expert import ExpertZero0Backend, ExpertZeroBackend
from archlab.train.backends.plain import PlainBackend
from archlab.train.backends.zero import ZeroBackend
from archlab.train.dist import DistInfo
from archlab.train.parallel import check_data_parallel, uses_deepspeed, zero_stage_of

BACKENDS: tuple[type[Backend], ...] = (PlainBackend, ZeroBackend, ExpertZero0Backend, ExpertZeroBackend)


def launch_of(accelerator, world_size: int, cfg: DictConfig) -> Launch:
    """The launch facts of this process: DeepSpeed or not and its ZeRO stage (from the accelerate
    state), the recipe's ``model.moe.ep_size`` and the torch.distributed world size."""
    moe = cfg.model.get("moe")
    ep_size = int(moe.ep_size) if moe is not None else 1
    return Launch(deepspeed=uses_deepspeed(accelerator), zero_stage=zero_stage_of(accelerator),
                  ep_size=max(1, ep_size), world_size=world_size)


def backend_class(launch: Launch) -> type[Backend]:
    """The one backend of :data:`BACKENDS` that handles ``launch``."""
    found = [b for b in BACKENDS if b.handles(launch)]
    if len(found) != 1:
        raise RuntimeError(f"{launch}: handled by {len(found)} backends ({[b.name for b in found]}), expected one")
    return found[0]


def select_backend(accelerator, info: DistInfo, cfg: DictConfig) -> Backend:
    """The backend that trains ``cfg`` as launched. Raises RecipeError with the backend's refusal
    (e.g. MoE under ZeRO-3, expert parallelism without DeepSpeed) or the optimizer's (``train.optimizer``
    names the backends it runs under: Muon refuses DeepSpeed), and RuntimeError when several
    processes run without data parallelism; both before anything is built."""
    check_data_parallel(accelerator, info.world_size)
    launch = launch_of(accelerator, info.world_size, cfg)
    cls = backend_class(launch)
    why = cls.refusal(launch, cfg) or optimizer_class(cfg.train).refusal(cls.name, launch.zero_stage)
    if why is not None:
        raise RecipeError(why)
    return cls(accelerator, info, cfg, launch)


__all__ = ["BACKENDS", "Backend", "ExpertZero0Backend", "ExpertZeroBackend", "Launch", "PlainBackend",
           "ZeroBackend", "backend_class", "launch_of", "select_backend"]
