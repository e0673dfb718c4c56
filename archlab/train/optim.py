"""AdamW with decoupled weight decay, and the learning-rate schedules a recipe names.

Weight decay (Loshchilov & Hutter 2019) applies to matrices only: norms' gains, biases and
embeddings are excluded, as in GPT-3, LLaMA and OLMo, because shrinking them toward zero does not
regularise and hurts. The schedule is a pure function of the optimizer step, so a resumed run sets
exactly the learning rate an uninterrupted one would (no scheduler state to save).
"""

from __future__ import annotations

import math

import torch
from torch import nn


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups: ``decay`` (2-D+ weights of Linear layers) and ``no_decay`` (everything
    else: norm gains, biases, token and position embeddings). Tied weights appear once."""
    embedding_params = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    decay, no_decay = [], []
    for _, p in model.named_parameters():  # named_parameters() yields a tied tensor only once
        if not p.requires_grad:
            continue
        if p.ndim >= 2 and id(p) not in embedding_params:
            decay.append(p)
        else:
            no_decay.append(p)
    return [
        {"params": decay, "weight_decay": weight_decay, "name": "decay"},
        {"params": no_decay, "weight_decay": 0.0, "name": "no_decay"},
    ]


def build_optimizer(model: nn.Module, train_cfg, expert_groups: bool = False) -> torch.optim.AdamW:
    """AdamW over :func:`param_groups`, hyper-parameters from the recipe's ``train`` node.

    ``expert_groups`` (expert parallelism): DeepSpeed's
    ``split_params_into_different_moe_groups_for_optimizer`` moves the expert-parallel parameters
    (tagged ``allreduce=False``) of each group into their own groups flagged ``moe=True`` and named
    after their expert-data-parallel group, as the DeepSpeed engine expects; the weight-decay split
    is kept (an expert group inherits its source group's ``weight_decay``).
    """
    groups = param_groups(model, train_cfg.weight_decay)
    if expert_groups:
        from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

        groups = [g for g in split_params_into_different_moe_groups_for_optimizer(groups) if g["params"]]
    betas = (float(train_cfg.betas[0]), float(train_cfg.betas[1]))
    return torch.optim.AdamW(groups, lr=train_cfg.lr, betas=betas, eps=train_cfg.eps, foreach=False)


def lr_at(step: int, train_cfg) -> float:
    """Learning rate for optimizer step ``step`` (0-based).

    - warmup: linear from lr/warmup_steps up to lr over ``warmup_steps`` steps (all schedules);
    - cosine: then half a cosine from lr down to lr * min_lr_ratio at ``max_steps``;
    - wsd (warmup-stable-decay, MiniCPM / Hägele et al. 2024): constant lr, then a linear decay to
      lr * min_lr_ratio over the last ``decay_fraction`` of the steps;
    - constant: lr after warmup.
    """
    peak, total, warm = train_cfg.lr, train_cfg.max_steps, train_cfg.warmup_steps
    floor = peak * train_cfg.min_lr_ratio
    if step < warm:
        return peak * (step + 1) / warm
    if train_cfg.schedule == "constant":
        return peak
    if train_cfg.schedule == "cosine":
        progress = (step - warm) / max(1, total - warm)
        return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    if train_cfg.schedule == "wsd":
        decay_steps = max(1, round(train_cfg.decay_fraction * total))
        decay_start = max(warm, total - decay_steps)
        if step < decay_start:
            return peak
        progress = (step - decay_start) / max(1, total - decay_start)
        return peak + (floor - peak) * min(1.0, progress)
    raise ValueError(f"train.schedule={train_cfg.schedule!r}: must be one of cosine, wsd, constant")


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
