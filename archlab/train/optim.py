"""AdamW with decoupled weight decay, and the learning-rate schedules a recipe names.

Weight decay (Loshchilov & Hutter 2019) applies to matrices only: norms' gains, biases and
embeddings are excluded, as in GPT-3, LLaMA and OLMo, because shrinking them toward zero does not
regularise and hurts. The schedule is a pure function of the optimizer step, so a resumed run sets
exactly the learning rate an uninterrupted one would (no scheduler state to save). Each group
trains at ``lr_scale`` times the scheduled lr: 1 under standard parametrisation, per-layer under
muP (``archlab.nn.mup``).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from archlab.nn.mup import hidden_matrices, width_mult


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups: ``decay`` (2-D+ weights of Linear layers) and ``no_decay`` (everything
    else: norm gains, biases, token and position embeddings). Tied weights appear once.

    Each group has an ``lr_scale`` (1 here). muP (width multiplier m): ``decay`` holds the blocks'
    matrices with lr_scale 1/m and weight decay * m, and an untied LM head, vector-like under muP,
    gets a third group ``readout`` (decayed, lr_scale 1)."""
    embedding_params = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    hidden = hidden_matrices(model)  # empty unless muP
    m = width_mult(model.cfg) if hidden else 1.0
    decay, readout, no_decay = [], [], []
    for _, p in model.named_parameters():  # named_parameters() yields a tied tensor only once
        if not p.requires_grad:
            continue
        if p.ndim >= 2 and id(p) not in embedding_params:
            (readout if hidden and id(p) not in hidden else decay).append(p)
        else:
            no_decay.append(p)
    groups = [{"params": decay, "weight_decay": weight_decay * m, "lr_scale": 1.0 / m, "name": "decay"}]
    if readout:
        groups.append({"params": readout, "weight_decay": weight_decay, "lr_scale": 1.0, "name": "readout"})
    return groups + [{"params": no_decay, "weight_decay": 0.0, "lr_scale": 1.0, "name": "no_decay"}]


def build_optimizer(model: nn.Module, train_cfg, expert_groups: bool = False) -> torch.optim.AdamW:
    """AdamW over :func:`param_groups`, hyper-parameters from the recipe's ``train`` node.

    ``expert_groups`` (expert parallelism): DeepSpeed's
    ``split_params_into_different_moe_groups_for_optimizer`` moves the expert-parallel parameters
    (tagged ``allreduce=False``) of each group into their own groups flagged ``moe=True`` and named
    after their expert-data-parallel group, as the DeepSpeed engine expects; the weight-decay split
    is kept (an expert group inherits its source group's ``weight_decay`` and ``lr_scale``).

    The ``lr_scale`` of each group comes from the model, never from a checkpoint: loading an
    optimizer state (which replaces the groups' hyper-parameters by the saved ones) restores it.
    """
    groups = param_groups(model, train_cfg.weight_decay)
    if expert_groups:
        from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

        groups = [g for g in split_params_into_different_moe_groups_for_optimizer(groups) if g["params"]]
    for g in groups:
        g["lr"] = train_cfg.lr * g["lr_scale"]
    betas = (float(train_cfg.betas[0]), float(train_cfg.betas[1]))
    optimizer = torch.optim.AdamW(groups, lr=train_cfg.lr, betas=betas, eps=train_cfg.eps, foreach=False)
    scales = [g["lr_scale"] for g in optimizer.param_groups]

    def keep_lr_scales(opt: torch.optim.Optimizer) -> None:
        for g, scale in zip(opt.param_groups, scales):
            g["lr_scale"] = scale

    optimizer.register_load_state_dict_post_hook(keep_lr_scales)
    return optimizer


def lr_at(step: int, train_cfg) -> float:
    """Learning rate for optimizer step ``step`` (0-based).

    - warmup: linear from lr/warmup_steps up to lr over ``warmup_steps`` steps (all schedules);
    - cosine: then half a cosine from lr down to lr * min_lr_ratio at ``max_steps``;
    - wsd (warmup-stable-decay, MiniCPM / Hägele et al. 2024): constant lr, then a decay to
      lr * min_lr_ratio over the last ``decay_steps`` steps (when > 0, else the last ``decay_fraction``
      of the steps), reached at ``max_steps``; ``decay_shape`` linear, or sqrt: lr * (1 - sqrt(progress)),
      Hägele et al.'s best cooldown shape. A cooldown branch of a trunk that stopped at step s is a wsd
      run with ``max_steps = s + decay_steps``: it equals the trunk's constant lr before s;
    - constant: lr after warmup (the stable trunk of WSD cooldown branches).
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
        decay_steps = train_cfg.decay_steps or max(1, round(train_cfg.decay_fraction * total))
        decay_start = max(warm, total - decay_steps)
        if step < decay_start:
            return peak
        progress = min(1.0, (step - decay_start) / max(1, total - decay_start))
        if train_cfg.decay_shape == "sqrt":
            progress = math.sqrt(progress)
        return peak + (floor - peak) * progress
    raise ValueError(f"train.schedule={train_cfg.schedule!r}: must be one of cosine, wsd, constant")


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Every group to ``lr`` times its ``lr_scale`` (muP's per-layer multiplier; 1 when absent)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
