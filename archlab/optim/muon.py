"""Muon (Jordan et al. 2024) for the hidden matrices, AdamW for the rest: ``train.optimizer: muon``.

The split is modded-nanogpt's, nanochat's and Moonlight's (Liu et al. 2025, "Muon is Scalable for
LLM Training"): every matrix of the decoder's blocks (attention and FFN projections, shared experts,
and the routed experts, one matrix per expert) is updated by ``torch.optim.Muon``'s step: momentum
(Nesterov by default), then Newton-Schulz orthogonalisation of the update, then a shape-dependent
lr. Token and position embeddings, the LM head, norm gains, biases and the MoE routers' gates are
updated by ``torch.optim.AdamW`` with the recipe's ``betas`` and ``eps``. Both decay decoupled,
by lr * ``train.weight_decay`` per step (not the vectors and embeddings, as under AdamW).

- Router gates stay on AdamW: a gate maps the width to E expert logits (output-like, like the LM
  head, which every Muon recipe leaves to AdamW; muP scales it as output-like too), and
  orthogonalising it would force equal singular values on the experts' logit directions.
- Routed experts: ``GroupedExperts`` stores each MoE layer's E experts as one (E, in, out) tensor.
  ``torch.optim.Muon`` accepts 2-D parameters only, so :class:`MuonWithAdamW` hands torch's own
  functional Muon step (``torch.optim._muon.muon``, what ``torch.optim.Muon.step`` calls) one view
  per expert, ``w[e].mT`` (out, in: the layout of an ``nn.Linear`` weight, so that the lr adjustment
  sees fan-out x fan-in as for the dense layers), with the matching views of the gradient and of the
  (E, in, out) momentum buffer: each expert is orthogonalised on its own, by torch's Newton-Schulz,
  written in place into the stacked tensors. Nothing of Newton-Schulz is re-implemented here.
- Fused projections (attention's QKV, SwiGLU's [gate; up]) are one ``nn.Linear`` each and are
  orthogonalised as one matrix (modded-nanogpt orthogonalises q, k and v separately; not done).
- ``adjust_lr_fn``: ``match_rms_adamw`` (the default here; Moonlight) scales the lr of an A x B matrix
  by 0.2 * sqrt(max(A, B)), which gives the update the RMS of a typical AdamW update, so that one
  ``train.lr`` (and weight decay) tuned for AdamW serves both the Muon and the AdamW groups
  (``muon.adamw_lr_ratio`` 1). ``original`` (Keller Jordan's) scales by sqrt(max(1, A/B)); it wants a
  Muon lr around 0.02 and an AdamW lr for the rest set by ``muon.adamw_lr_ratio``.
- muP: the spectral condition (Yang, Simon & Bernstein 2023) asks an update of spectral norm
  ~ sqrt(fan_out / fan_in), width-independent for the blocks' matrices. Newton-Schulz gives singular
  values near 1, so under ``original`` the hidden matrices keep the base lr (lr_scale 1) and under
  ``match_rms_adamw`` (which grows as sqrt(width)) they train at lr / sqrt(m) with weight decay *
  sqrt(m) (lr * weight decay stays the base's). The AdamW groups follow Adam's muP (router lr/m,
  readout and vectors lr).
- State: one fp32 momentum buffer per Muon parameter (4 bytes), AdamW's two moments (8 bytes) for
  the rest.
- Backends: one process and DDP (every rank runs the same step on the averaged gradient). DeepSpeed
  launches are refused by name (``unsupported``): DeepSpeed 0.19 runs Muon only as its own
  ``MuonWithAuxAdam`` (``deepspeed/runtime/zero/muon``: its own Newton-Schulz and Keller's lr
  scaling only), not ``torch.optim.Muon`` with this recipe's options.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.optim._muon import DEFAULT_A, DEFAULT_B, DEFAULT_C, EPS
from torch.optim._muon import muon as torch_muon_step

from archlab.errors import fail
from archlab.optim.adamw import adam_mup_scale, adamw_groups
from archlab.optim.base import OPTIMIZERS, OptimizerSpec, keep_lr_scales, mup_mult, param_roles

ADJUST_LR_FNS = ("match_rms_adamw", "original")


@dataclass
class MuonConfig:
    momentum: float = 0.95  # torch.optim.Muon's: buffer = momentum * buffer + (1 - momentum) * grad
    nesterov: bool = True  # update from grad.lerp(buffer, momentum) instead of the buffer
    ns_steps: int = 5  # Newton-Schulz iterations (torch's quintic coefficients)
    # match_rms_adamw (Moonlight: lr * 0.2 * sqrt(max(A, B)), one lr serves Muon and AdamW groups)
    # | original (Keller Jordan: lr * sqrt(max(1, A / B)); wants lr ~ 0.02 and muon.adamw_lr_ratio ~ 0.1-0.3)
    adjust_lr_fn: str = "match_rms_adamw"
    # lr of the AdamW groups (embeddings, LM head, norms, biases, routers) = train.lr * this
    adamw_lr_ratio: float = 1.0


class MuonWithAdamW(torch.optim.Optimizer):
    """One optimizer (one ``state_dict``, one ``step``, as accelerate, DDP and checkpoints expect):
    ``torch.optim.Muon``'s update on the groups with ``muon=True``, ``torch.optim.AdamW`` on the
    others. The AdamW part is a ``torch.optim.AdamW`` sharing this optimizer's group dicts and state.

    A Muon group's 2-D parameters go to torch's functional Muon step as they are; a 3-D parameter
    (E, in, out) as E matrices ``w[e].mT``, with its gradient's and momentum buffer's matching views.
    """

    def __init__(self, groups: list[dict], *, lr: float, betas: tuple[float, float], eps: float,
                 momentum: float, nesterov: bool, ns_steps: int, adjust_lr_fn: str):
        super().__init__(groups, {"lr": lr})
        muon_defaults = {"momentum": momentum, "nesterov": nesterov, "ns_steps": ns_steps, "adjust_lr_fn": adjust_lr_fn,
                         "ns_coefficients": (DEFAULT_A, DEFAULT_B, DEFAULT_C), "eps": EPS}
        for g in self.param_groups:
            g.setdefault("muon", False)
            if g["muon"]:
                for k, v in muon_defaults.items():
                    g.setdefault(k, v)
                for p in g["params"]:
                    if p.ndim not in (2, 3):
                        raise ValueError(f"Muon group {g.get('name')!r}: a parameter of shape {tuple(p.shape)} "
                                         "(Muon takes matrices, or (E, in, out) stacks of expert matrices)")
        adamw = [g for g in self.param_groups if not g["muon"]]
        self.adamw = torch.optim.AdamW(adamw, lr=lr, betas=betas, eps=eps, foreach=False) if adamw else None
        self._link()
        self.register_load_state_dict_post_hook(lambda opt: opt._link())

    def _link(self) -> None:
        """The AdamW part works on this optimizer's AdamW groups and state (again after loading a
        state dict, which replaces both)."""
        if self.adamw is not None:
            self.adamw.param_groups = [g for g in self.param_groups if not g["muon"]]
            self.adamw.state = self.state

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if group["muon"]:
                self._muon_group_step(group)
        if self.adamw is not None:
            self.adamw.step()
        return loss

    def _muon_group_step(self, group: dict) -> None:
        params, grads, bufs = [], [], []
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if "momentum_buffer" not in state:  # as torch.optim.Muon._init_group
                state["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
            buf = state["momentum_buffer"]
            if p.ndim == 2:
                matrices = [(p, p.grad, buf)]
            else:  # one (out, in) matrix per expert: views, updated in place
                matrices = [(p[e].mT, p.grad[e].mT, buf[e].mT) for e in range(p.shape[0])]
            for w, g, b in matrices:
                params.append(w)
                grads.append(g)
                bufs.append(b)
        if params:
            torch_muon_step(params, grads, bufs, lr=group["lr"], weight_decay=group["weight_decay"],
                            momentum=group["momentum"], nesterov=group["nesterov"],
                            ns_coefficients=group["ns_coefficients"], ns_steps=group["ns_steps"], eps=group["eps"],
                            adjust_lr_fn=group["adjust_lr_fn"], has_complex=False)


@OPTIMIZERS.register("muon")
class MuonOptimizer(OptimizerSpec):
    """:class:`MuonWithAdamW`: a ``muon`` group (the hidden matrices) and AdamW's ``decay`` (routers,
    an untied head; under muP the head is ``readout``) and ``no_decay`` groups for the rest (empty
    ones dropped)."""

    name = "muon"
    options = OptimizerSpec.options | {"muon"}
    backends = frozenset({"plain"})
    _deepspeed = ("DeepSpeed 0.19 runs Muon only as its own MuonWithAuxAdam (deepspeed/runtime/zero/muon: its own "
                  "Newton-Schulz and Keller's lr scaling, no adjust_lr_fn, nesterov or ns_steps from the recipe), "
                  "not torch.optim.Muon, so the run would not train with the optimizer the recipe names")
    unsupported = {
        "zero": (_deepspeed + "; ZeRO-1/2 partition flattened gradients that only DeepSpeed's own Muon path "
                 "orthogonalises, ZeRO-3 with zero.Init leaves Muon silently inactive (DeepSpeed PR #8438), and "
                 "ZeRO-0 under bf16 hands the optimizer flattened fp32 groups; launch without DeepSpeed "
                 "(accelerate launch --multi_gpu: DDP) or use train.optimizer=adamw"),
        "expert-zero0": _deepspeed + "; expert parallelism runs under DeepSpeed only: use model.moe.ep_size=1 with DDP",
        "expert-zero": _deepspeed + "; expert parallelism runs under DeepSpeed only: use model.moe.ep_size=1 with DDP",
    }

    @classmethod
    def validate(cls, t: Any) -> None:
        super().validate(t)
        mu = t.muon
        if not 0.0 <= mu.momentum < 1.0:
            fail("train.muon.momentum", mu.momentum, "must lie in [0, 1)")
        if not 1 <= mu.ns_steps < 100:
            fail("train.muon.ns_steps", mu.ns_steps, "must lie in [1, 100)")
        if mu.adjust_lr_fn not in ADJUST_LR_FNS:
            fail("train.muon.adjust_lr_fn", mu.adjust_lr_fn, f"must be one of: {', '.join(ADJUST_LR_FNS)}")
        if not mu.adamw_lr_ratio > 0:
            fail("train.muon.adamw_lr_ratio", mu.adamw_lr_ratio, "must be positive")

    @classmethod
    def state_bytes_per_param(cls, role: str) -> int:
        return 4 if role == "hidden" else 8  # Muon's momentum buffer; AdamW's two moments (fp32)

    def mup_scale(self, role: str, m: float) -> tuple[float, float]:
        if role != "hidden":
            return adam_mup_scale(role, m)
        if self.t.muon.adjust_lr_fn == "original":
            return 1.0, 1.0
        return 1.0 / m ** 0.5, m ** 0.5  # match_rms_adamw: its 0.2 * sqrt(max(A, B)) grows as sqrt(m)

    def param_groups(self, model: nn.Module) -> list[dict]:
        roles = param_roles(model)
        if not any(role == "hidden" for _, _, role in roles):
            raise ValueError(f"train.optimizer=muon: {type(model).__name__} has no hidden matrices "
                             "(Muon trains the matrices of an archlab decoder's blocks)")
        m = mup_mult(model)
        lr_scale, wd_mult = self.mup_scale("hidden", 1.0 if m is None else m)
        wd = self.t.weight_decay
        hidden = [p for _, p, role in roles if role == "hidden"]
        groups = [{"params": hidden, "weight_decay": wd * wd_mult, "lr_scale": lr_scale, "name": "muon", "muon": True}]
        ratio = float(self.t.muon.adamw_lr_ratio)
        for g in adamw_groups([r for r in roles if r[2] != "hidden"], wd, m):
            if g["params"]:
                groups.append({**g, "lr_scale": g["lr_scale"] * ratio, "muon": False})
        return groups

    def build(self, model: nn.Module, expert_groups: bool = False) -> MuonWithAdamW:
        if expert_groups:
            raise ValueError(self.refusal("expert-zero"))
        t, mu = self.t, self.t.muon
        groups = self.param_groups(model)
        for g in groups:
            g["lr"] = t.lr * g["lr_scale"]
        optimizer = MuonWithAdamW(groups, lr=t.lr, betas=(float(t.betas[0]), float(t.betas[1])), eps=t.eps,
                                  momentum=float(mu.momentum), nesterov=bool(mu.nesterov), ns_steps=int(mu.ns_steps),
                                  adjust_lr_fn=str(mu.adjust_lr_fn))
        keep_lr_scales(optimizer)
        return optimizer

