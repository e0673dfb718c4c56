"""What a recipe costs, from its config alone: parameters, FLOPs per token, memory.

    import archlab
    from archlab.costs import training_flops_per_token
    cfg = archlab.model_config(archlab.load_recipe("recipes/llama/tiny.yaml"))
    training_flops_per_token(cfg, seq_len=128)   # matmul FLOPs of one training token
"""

from archlab.costs.flops import (
    FlopsBreakdown,
    forward_flops,
    forward_flops_per_token,
    training_flops,
    training_flops_per_token,
)

__all__ = [
    "FlopsBreakdown", "forward_flops", "forward_flops_per_token", "training_flops",
    "training_flops_per_token",
]
