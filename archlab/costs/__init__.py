"""What a recipe costs, from its config alone: parameters, FLOPs per token, memory.

    import archlab
    from archlab.costs import training_flops_per_token, param_counts, activation_memory
    cfg = archlab.model_config(archlab.load_recipe("recipes/llama/tiny.yaml"))
    training_flops_per_token(cfg, seq_len=128)   # matmul FLOPs of one training token
    param_counts(cfg).active                     # parameters one token uses
    activation_memory(cfg, batch=8, seq_len=128).total  # bytes the trainer's step keeps for backward
    activation_memory(cfg, 8, 128, checkpointing="selective").total  # with train.activation_checkpointing

``archlab.costs.plan`` turns them into a plan for a launch before a GPU is rented: per-GPU bytes by precision
regime, ZeRO stage and expert parallelism, whether they fit an H100/H200/A100, tokens/s at an MFU and the
hours to the token budget (``python -m analysis.costs plan RECIPE``).

``archlab.costs.measure`` takes the same quantities on a built model (FlopCounterMode,
saved-tensor hooks): the reference the estimates are tested against.
"""

from archlab.costs.flops import (
    FlopsBreakdown,
    forward_flops,
    forward_flops_per_token,
    training_flops,
    training_flops_per_token,
)
from archlab.costs.memory import (
    ActivationMemory,
    ModelStateMemory,
    activation_memory,
    kv_cache_bytes,
    model_state_memory,
    optimizer_state_bytes,
    training_memory,
)
from archlab.costs.params import ParamCounts, param_counts
from archlab.costs.plan import GPUS, Launch, MemoryPlan, TrainingPlan, memory_plan, read_launch, training_plan

__all__ = [
    "GPUS", "ActivationMemory", "FlopsBreakdown", "Launch", "MemoryPlan", "ModelStateMemory", "ParamCounts",
    "TrainingPlan", "activation_memory", "memory_plan", "read_launch", "training_plan",
    "forward_flops", "forward_flops_per_token", "kv_cache_bytes", "model_state_memory", "optimizer_state_bytes",
    "param_counts", "training_flops", "training_flops_per_token", "training_memory",
]
