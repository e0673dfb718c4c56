"""The accelerate / DeepSpeed wiring: which Accelerator, which precision, a consistent DeepSpeed config.

Parallelism is the launcher's choice (``accelerate launch`` flags or an accelerate config file from
``recipes/launch/``), never the recipe's. The recipe fixes the micro batch, gradient accumulation
and clipping; this module writes them into the DeepSpeed config (whose values may be ``"auto"``)
and refuses a config that contradicts the recipe.
"""

from __future__ import annotations

import collections
import dataclasses
import os
from typing import Optional, Sequence

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, InitProcessGroupKwargs, ProjectConfiguration, parse_flag_from_env
from torch import nn

from archlab.config.validate import RecipeError
from archlab.trackers import check_accepted
from archlab.train.dist import process_group_timeout


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


def make_accelerator(train_cfg, trackers: Sequence[str] = ()) -> Accelerator:
    """An Accelerator for the launcher's setup with the recipe's precision and accumulation, and
    ``trackers`` (``log_with``; :mod:`archlab.trackers` points them at the run folder once
    it is known: accelerate wants a logging folder now, the output folder stands in)."""
    logging = {}
    if trackers:
        out = str(train_cfg.out_dir)
        logging = {"log_with": list(trackers), "project_config": ProjectConfiguration(project_dir=out, logging_dir=out)}
    accelerator = Accelerator(
        cpu=_multi_process_without_gpu(),
        mixed_precision=resolve_precision(train_cfg.precision),
        gradient_accumulation_steps=train_cfg.grad_accum,
        step_scheduler_with_optimizer=False,  # the lr is set from the step (archlab.train.optim.lr_at)
        kwargs_handlers=_timeout_handlers(train_cfg),
        **logging,
    )
    if trackers:
        check_accepted(accelerator, trackers)
    return accelerator


def _timeout_handlers(train_cfg) -> list:
    """``train.dist_timeout_s`` as the process group's timeout (a long first pass over token shards, a slow
    checkpoint); none set keeps torch's default (NCCL 10 min, gloo 30 min)."""
    timeout = process_group_timeout(train_cfg)
    return [] if timeout is None else [InitProcessGroupKwargs(timeout=timeout)]


def check_data_parallel(accelerator: Accelerator, world_size: int) -> None:
    """Refuse to train several processes whose gradients nothing would average."""
    if world_size > 1 and accelerator.distributed_type == DistributedType.NO:
        raise RuntimeError(f"torch.distributed holds {world_size} processes but accelerate set up no data "
                           "parallelism (DistributedType.NO); launch with --multi_gpu or a config from recipes/launch/")


def uses_deepspeed(accelerator: Accelerator) -> bool:
    return accelerator.distributed_type == DistributedType.DEEPSPEED


def fill_deepspeed_config(accelerator: Accelerator, train_cfg, world_size: int, d_model: Optional[int] = None) -> dict:
    """Write the recipe's batch geometry and clipping into the DeepSpeed config before ``prepare``.

    ``"auto"`` (or absent) entries are filled; an explicit value that differs from the recipe is
    an error naming both. ``train_batch_size`` uses the torch.distributed world size, which is
    right even where accelerate reports one process (DeepSpeed on a machine without GPUs).
    ``"auto"`` bucket sizes and the ZeRO-3 persistence threshold are filled from the model width
    ``d_model`` with accelerate's formulas (accelerate would look for an HF ``model.config``):
    ``reduce_bucket_size`` D^2, ``stage3_prefetch_bucket_size`` 0.9 D^2,
    ``stage3_param_persistence_threshold`` 10 D (DeepSpeed keeps parameters up to that size, e.g. norm
    gains, whole on every rank instead of gathering them for each use).
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
    zero = conf.get("zero_optimization", {})
    stage = zero.get("stage", 0)
    if stage not in (0, 1, 2, 3):
        raise RecipeError(f"DeepSpeed zero_optimization.stage={stage!r}: ZeRO stages are 0, 1, 2 and 3")
    if d_model is not None:
        by_width = {"reduce_bucket_size": d_model * d_model, "stage3_prefetch_bucket_size": int(0.9 * d_model ** 2),
                    "stage3_param_persistence_threshold": 10 * d_model}
        for key, value in by_width.items():
            if zero.get(key) == "auto":
                zero[key] = value
    return conf


def zero_stage_refusal(stage: int, cfg) -> Optional[str]:
    """Why archlab does not train ``cfg`` at this ZeRO stage (a message naming the recipe key and the
    launch to use instead), or None. Stage 3: MoE models (expert parallelism included) and
    ``train.compile``."""
    if stage != 3:
        return None
    moe = cfg.model.get("moe")
    if moe is not None:
        ep = int(moe.get("ep_size", 1))
        what = f"model.moe (with model.moe.ep_size={ep})" if ep > 1 else "model.moe"
        return (f"{what} under DeepSpeed ZeRO stage 3: archlab trains MoE models, and expert parallelism, at ZeRO "
                "stages 0-2 only (DeepSpeed's MoE support ends at stage 2, and stage 3 would partition the experts "
                "that routing and checkpoints read whole); launch with recipes/launch/zero2.yaml (optimizer states "
                "and gradients sharded; zero0.yaml or zero1.yaml also work with ep_size > 1), or use zero3.yaml "
                "with a dense recipe")
    if cfg.train.compile:
        return ("train.compile=true under DeepSpeed ZeRO stage 3: DeepSpeed's ZeRO-3 forward hooks fail on a "
                "torch.compile'd module (seen with DeepSpeed 0.19.8); set train.compile=false, or launch with "
                "recipes/launch/zero2.yaml to compile")
    return None


def check_zero_stage(stage: int, cfg) -> None:
    """Refuse (RecipeError, :func:`zero_stage_refusal`'s message) what archlab does not train at this
    ZeRO stage. The trainer asks before anything is built (through its backend's refusal)."""
    why = zero_stage_refusal(stage, cfg)
    if why is not None:
        raise RecipeError(why)


def zero_stage_of(accelerator: Accelerator) -> int:
    """The DeepSpeed config's ``zero_optimization.stage`` (0 without DeepSpeed); RecipeError unless
    it is one of 0, 1, 2, 3."""
    if not uses_deepspeed(accelerator):
        return 0
    stage = accelerator.state.deepspeed_plugin.deepspeed_config.get("zero_optimization", {}).get("stage", 0)
    if stage not in (0, 1, 2, 3):
        raise RecipeError(f"DeepSpeed zero_optimization.stage={stage!r}: ZeRO stages are 0, 1, 2 and 3")
    return int(stage)


def zero3_traceable_outputs(model: nn.Module) -> torch.utils.hooks.RemovableHandle:
    """ZeRO-3: let DeepSpeed see the tensors of ``model``'s output. Call before ``prepare``.

    ZeRO-3 gathers a module's parameters again for its backward through hooks on the tensors of its
    output, which it finds in tensors, tuples, lists and dicts only. The decoder returns a dataclass
    and its fused loss reads ``lm_head.weight`` inside the decoder's own forward (DeepSpeed then
    registers it as an external parameter of the decoder), so without this hook the weight stays
    partitioned in backward. The hook, run before DeepSpeed's, hands on the output as a named tuple
    with the same fields (read by attribute as before); model code stays free of DeepSpeed.
    """
    def as_named_tuple(module: nn.Module, args, out):
        if not dataclasses.is_dataclass(out):
            return None
        cls = _OUTPUT_TUPLES.get(type(out))
        if cls is None:
            names = [f.name for f in dataclasses.fields(out)]
            cls = _OUTPUT_TUPLES[type(out)] = collections.namedtuple(type(out).__name__, names)
        return cls(**{name: getattr(out, name) for name in cls._fields})

    return model.register_forward_hook(as_named_tuple)


_OUTPUT_TUPLES: dict = {}


def zero3_consolidated_state_dict(engine) -> Optional[dict]:
    """ZeRO-3: the full state dict of the engine's module, gathered one module at a time (every rank
    holds only its partition of each parameter). Collective: every rank calls it; rank 0 gets the
    tensors on the CPU, in the parameters' dtype (fp32 here, bf16 under bf16 training, as the weights
    of stages 0-2), tied parameters as one shared tensor; the other ranks get None."""
    return engine._zero3_consolidated_16bit_state_dict()


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
    """Plain-data classes that DeepSpeed ZeRO 1-3 checkpoints contain (stage 3's optimizer files hold
    the same loss scaler and stage enum as stages 1-2; its model files only tensors and containers)."""
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
