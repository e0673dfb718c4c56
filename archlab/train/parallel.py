"""The accelerate / DeepSpeed wiring: which Accelerator, which precision, a consistent DeepSpeed config.

Parallelism is the launcher's choice (``accelerate launch`` flags or an accelerate config file from
``recipes/launch/``), never the recipe's. The recipe fixes the micro batch, gradient accumulation
and clipping; this module writes them into the DeepSpeed config (whose values may be ``"auto"``)
and refuses a config that contradicts the recipe.
"""

from __future__ import annotations

import os

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, parse_flag_from_env

from archlab.config.validate import RecipeError


def resolve_precision(precision: str) -> str:
    """Recipe precision -> accelerate mixed_precision: auto = bf16 on a GPU that supports it, else fp32."""
    if precision == "fp32":
        return "no"
    if precision == "bf16":
        return "bf16"
    if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return "bf16"
    return "no"


def _multi_process_without_gpu() -> bool:
    """Launched as several processes (``--multi_gpu``) on a machine without GPUs, not DeepSpeed.

    accelerate 1.15 then reports ``DistributedType.NO`` (no DDP wrapping, gradients never
    averaged) although torch.distributed holds every process, unless told ``cpu=True``, which
    selects ``MULTI_CPU`` over gloo.
    """
    return (not torch.cuda.is_available() and not parse_flag_from_env("ACCELERATE_USE_DEEPSPEED")
            and int(os.environ.get("WORLD_SIZE", "1")) > 1)


def make_accelerator(train_cfg) -> Accelerator:
    """An Accelerator for the launcher's setup with the recipe's precision and accumulation."""
    return Accelerator(
        cpu=_multi_process_without_gpu(),
        mixed_precision=resolve_precision(train_cfg.precision),
        gradient_accumulation_steps=train_cfg.grad_accum,
        step_scheduler_with_optimizer=False,  # the lr is set from the step (archlab.train.optim.lr_at)
    )


def check_data_parallel(accelerator: Accelerator, world_size: int) -> None:
    """Refuse to train several processes whose gradients nothing would average."""
    if world_size > 1 and accelerator.distributed_type == DistributedType.NO:
        raise RuntimeError(f"torch.distributed holds {world_size} processes but accelerate set up no data "
                           "parallelism (DistributedType.NO); launch with --multi_gpu or a config from recipes/launch/")


def uses_deepspeed(accelerator: Accelerator) -> bool:
    return accelerator.distributed_type == DistributedType.DEEPSPEED


def fill_deepspeed_config(accelerator: Accelerator, train_cfg, world_size: int) -> dict:
    """Write the recipe's batch geometry and clipping into the DeepSpeed config before ``prepare``.

    ``"auto"`` (or absent) entries are filled; an explicit value that differs from the recipe is
    an error naming both. ``train_batch_size`` uses the torch.distributed world size, which is
    right even where accelerate reports one process (DeepSpeed on a machine without GPUs).
    """
    conf = accelerator.state.deepspeed_plugin.deepspeed_config
    wanted = {
        "train_micro_batch_size_per_gpu": ("train.micro_batch_size", int(train_cfg.micro_batch_size)),
        "gradient_accumulation_steps": ("train.grad_accum", int(train_cfg.grad_accum)),
        "train_batch_size": ("train.micro_batch_size * train.grad_accum * world size",
                             int(train_cfg.micro_batch_size * train_cfg.grad_accum * world_size)),
        "gradient_clipping": ("train.grad_clip", float(train_cfg.grad_clip)),
    }
    for key, (recipe_key, value) in wanted.items():
        current = conf.get(key, "auto")
        if current != "auto" and current != value:
            raise RecipeError(
                f"DeepSpeed config {key}={current!r} contradicts the recipe ({recipe_key} = {value!r}); "
                f"set it to \"auto\" in the DeepSpeed config file or change the recipe")
        conf[key] = value
    if conf.get("optimizer") is not None:
        raise RecipeError("the DeepSpeed config names an optimizer; archlab builds AdamW from the recipe: "
                          "remove the 'optimizer' section")
    if conf.get("scheduler") is not None:
        raise RecipeError("the DeepSpeed config names a scheduler; archlab sets the lr from the recipe: "
                          "remove the 'scheduler' section")
    stage = conf.get("zero_optimization", {}).get("stage", 0)
    if stage not in (0, 1, 2):
        raise RecipeError(f"DeepSpeed zero_optimization.stage={stage}: archlab trains with stages 0-2 "
                          "(stage 3 shards the parameters, which the checkpoint and eval code do not gather)")
    return conf


def deepspeed_engine(accelerator: Accelerator):
    """The DeepSpeedEngine accelerate built (after ``prepare``)."""
    return accelerator.deepspeed_engine_wrapped.engine


def safe_deepspeed_load(engine) -> None:
    """Make the engine load its checkpoint files with ``torch.load(weights_only=True)``.

    DeepSpeed's own loader unpickles arbitrary objects (weights_only=False). The few DeepSpeed
    classes its ZeRO optimizer state holds are allow-listed instead, so a crafted file fails.
    """
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

    class _SafeEngine(TorchCheckpointEngine):
        def load(self, path: str, map_location=None):
            with torch.serialization.safe_globals(_deepspeed_safe_globals()):
                return torch.load(path, map_location=map_location, weights_only=True)

    safe = _SafeEngine.__new__(_SafeEngine)
    safe.__dict__.update(engine.checkpoint_engine.__dict__)
    engine.checkpoint_engine = safe


def _deepspeed_safe_globals() -> list:
    """Plain-data classes that DeepSpeed ZeRO 1/2 checkpoints contain."""
    import collections

    names = []
    try:
        from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler

        names += [LossScaler, DynamicLossScaler]
    except ImportError:
        pass
    try:
        from deepspeed.utils.tensor_fragment import fragment_address

        names.append(fragment_address)
    except ImportError:
        pass
    try:
        from deepspeed.runtime.zero.config import ZeroStageEnum

        names.append(ZeroStageEnum)
    except ImportError:
        pass
    return names + [collections.OrderedDict]
