"""AdamW with decoupled weight decay (Loshchilov & Hutter 2019): ``train.optimizer: adamw``, the default.

Weight decay applies to matrices only: norms' gains, biases and embeddings are excluded, as in
GPT-3, LLaMA and OLMo, because shrinking them toward zero does not regularise and hurts. Each
group trains at ``lr_scale`` times the scheduled lr: 1 under standard parametrisation, per layer
under muP (``archlab.nn.mup``, Table 3 of Tensor Programs V for Adam).

State: the first and second moments, fp32: 8 bytes per parameter (+ the fp32 master copy of a
bf16 run, counted by ``archlab.costs.memory``: 16 bytes per parameter with weights and gradients).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from archlab.optim.base import OPTIMIZERS, OptimizerSpec, keep_lr_scales, mup_mult, param_roles


def adamw_param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups: ``decay`` (the matrices: hidden, router and readout roles of
    :func:`~archlab.optim.base.param_roles`) and ``no_decay`` (everything else: norm gains, biases,
    token and position embeddings). Tied weights appear once.

    Each group has an ``lr_scale`` (1 here). muP (width multiplier m): ``decay`` holds the blocks'
    matrices with lr_scale 1/m and weight decay * m, and an untied LM head, vector-like under muP,
    gets a third group ``readout`` (decayed, lr_scale 1)."""
    return adamw_groups(param_roles(model), weight_decay, mup_mult(model))


def adam_mup_scale(role: str, m: float) -> tuple[float, float]:
    """muP for Adam(W) (Tensor Programs V, Table 3; ``archlab.nn.mup``): the blocks' matrices (hidden,
    router) lr/m and weight decay * m; readout, embeddings and vectors lr."""
    return (1.0 / m, m) if role in ("hidden", "router") else (1.0, 1.0)


def adamw_groups(roles: list, weight_decay: float, m: Optional[float]) -> list[dict]:
    """:func:`adamw_param_groups` of the ``(name, parameter, role)`` list ``roles`` (the parameters an
    optimizer leaves to AdamW) at muP width multiplier ``m`` (None: standard parametrisation)."""
    decay, readout, no_decay = [], [], []
    for _, p, role in roles:
        if role in ("hidden", "router"):
            decay.append(p)
        elif role == "readout":
            (readout if m is not None else decay).append(p)
        else:
            no_decay.append(p)
    lr_scale, wd_mult = adam_mup_scale("hidden", 1.0 if m is None else m)
    groups = [{"params": decay, "weight_decay": weight_decay * wd_mult, "lr_scale": lr_scale, "name": "decay"}]
    if readout:
        groups.append({"params": readout, "weight_decay": weight_decay, "lr_scale": 1.0, "name": "readout"})
    return groups + [{"params": no_decay, "weight_decay": 0.0, "lr_scale": 1.0, "name": "no_decay"}]


def adamw_kernel(cuda: Optional[bool] = None) -> dict:
    """How AdamW runs its step: ``fused`` (one kernel for all tensors) where the run trains on CUDA
    (``cuda``; default: CUDA is available, so the trainer moves the model there), else ``foreach``
    (batched over the tensors). On CPU foreach gives the per-tensor loop's numbers bit for bit
    (tests/train/test_train_optim.py); CUDA's fused kernel may differ from it in the last bit."""
    cuda = torch.cuda.is_available() if cuda is None else cuda
    return {"fused": True, "foreach": None} if cuda else {"fused": None, "foreach": True}


@OPTIMIZERS.register("adamw")
class AdamWOptimizer(OptimizerSpec):
    """``torch.optim.AdamW`` over :func:`adamw_param_groups`; ``train.lr``, ``train.betas``, ``train.eps``,
    ``train.weight_decay``. Every backend. Its kernel: :func:`adamw_kernel` (fused on CUDA, foreach elsewhere)."""

    name = "adamw"

    @classmethod
    def state_bytes_per_param(cls, role: str) -> int:
        return 8  # exp_avg, exp_avg_sq (fp32)

    def mup_scale(self, role: str, m: float) -> tuple[float, float]:
        return adam_mup_scale(role, m)

    def param_groups(self, model: nn.Module) -> list[dict]:
        return adamw_param_groups(model, self.t.weight_decay)

    def build(self, model: nn.Module, expert_groups: bool = False) -> torch.optim.AdamW:
        """AdamW over :meth:`param_groups`, hyper-parameters from the recipe's ``train`` node.

        ``expert_groups`` (expert parallelism): DeepSpeed's
        ``split_params_into_different_moe_groups_for_optimizer`` moves the expert-parallel parameters
        (tagged ``allreduce=False``) of each group into their own groups flagged ``moe=True`` and named
        after their expert-data-parallel group, as the DeepSpeed engine expects; the weight-decay split
        is kept (an expert group inherits its source group's ``weight_decay`` and ``lr_scale``).

        The ``lr_scale`` of each group comes from the model, never from a checkpoint: loading an
        optimizer state (which replaces the groups' hyper-parameters by the saved ones) restores it.
        """
        t = self.t
        groups = self.param_groups(model)
        if expert_groups:
            from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

            groups = [g for g in split_params_into_different_moe_groups_for_optimizer(groups) if g["params"]]
        for g in groups:
            g["lr"] = t.lr * g["lr_scale"]
        betas = (float(t.betas[0]), float(t.betas[1]))
        optimizer = torch.optim.AdamW(groups, lr=t.lr, betas=betas, eps=t.eps, **adamw_kernel())
        keep_lr_scales(optimizer, ("lr_scale", "foreach", "fused"))  # a checkpoint's kernel choice is not kept
        optimizer.register_load_state_dict_post_hook(_fused_steps_on_param_device)
        return optimizer


def _fused_steps_on_param_device(optimizer: torch.optim.Optimizer) -> None:
    """After loading a state written by a foreach AdamW (``step`` a CPU scalar) into a fused one: each
    ``step`` on its parameter's device, in fp32, where the fused kernel reads it (torch casts by the
    saved groups' flags, not the loading optimizer's)."""
    for group in optimizer.param_groups:
        if group.get("fused"):
            for p in group["params"]:
                state = optimizer.state.get(p, {})
                if torch.is_tensor(state.get("step")):
                    state["step"] = state["step"].to(dtype=torch.float32, device=p.device)

