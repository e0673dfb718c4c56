"""What every optimizer states about itself, so that the trainer, the backends, the cost model and
the validator ask it instead of switching on ``train.optimizer``.

An optimizer is one class registered in :data:`OPTIMIZERS` under the name a recipe gives as
``train.optimizer``. Each carries, next to how it builds the ``torch.optim`` optimizer:

- ``options``: the ``train`` keys it reads besides ``lr`` (a nested node such as ``muon`` counts as one
  key); ``archlab.config.options`` refuses a recipe that sets a key only other optimizers read;
- ``validate(t)``: its rules on the ``train`` node (``archlab.errors.fail``);
- ``param_groups(model)``: its parameter groups, each a dict with ``params``, ``name``,
  ``weight_decay`` and ``lr_scale`` (the group trains at ``lr_scale`` times the scheduled lr);
- ``mup_scale(role, m)``: how muP scales the lr and weight decay of a parameter of each role
  (:func:`param_roles`) at width multiplier m (``archlab.nn.mup``);
- ``state_bytes_per_param(role)``: the bytes of optimizer state (fp32 moments, momentum) it keeps per
  parameter of each role, read by ``archlab.costs.memory`` (a bf16 run's fp32 master copy is the
  precision's, not the optimizer's);
- ``backends``: the training backends (``archlab.train.backends``, by name) it runs under;
  ``refusal(backend, zero_stage)`` says why not for the others, naming the launch;
- ``build(model, expert_groups)``: the torch optimizer.

A new optimizer is one module in this package (its class and, if it has options, its config
dataclass, composed into ``TrainConfig`` by ``archlab.config.schema``), its import in
``archlab/optim/__init__.py``, and tests.
"""

from __future__ import annotations

from typing import Any, ClassVar, Optional

import torch
from torch import nn

from archlab.errors import fail
from archlab.nn.moe.router import Router
from archlab.nn.mup import hidden_matrices, width_mult
from archlab.registry import Registry

OPTIMIZERS: Registry = Registry("optimizer")

# the roles of a parameter that optimizers and muP tell apart (param_roles)
ROLES = ("hidden", "router", "readout", "embedding", "vector")
# backend names (archlab.train.backends: the ``name`` of each Backend class) and how a message says them
BACKEND_LAUNCHES = {
    "plain": "one process or DDP",
    "zero": "DeepSpeed ZeRO",
    "expert-zero0": "DeepSpeed ZeRO-0 with expert parallelism",
    "expert-zero": "DeepSpeed ZeRO-1/2 with expert parallelism",
}


def param_roles(model: nn.Module) -> list[tuple[str, nn.Parameter, str]]:
    """(name, parameter, role) for every trainable parameter, in ``named_parameters`` order (a tied
    tensor once). Roles:

    - ``embedding``: token and position tables (``nn.Embedding``; a tied LM head is the token table);
    - ``vector``: every other parameter with fewer than 2 dims (norm gains, biases);
    - ``router``: an MoE router's gate matrix (width -> experts: output-like);
    - ``hidden``: every other matrix of the decoder's blocks (attention, FFN, shared experts) and the
      routed experts' stacked (E, in, out) weights; the multi-token-prediction modules' projections and
      blocks likewise, an encoder's MLM head transform and an encoder-decoder's encoder blocks;
    - ``readout``: a matrix outside the blocks that is not an embedding (an untied LM head).
    """
    embedding = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    body = getattr(model, "trunk", model)  # a classifier's pre-trained model (archlab.model.classifier)
    blocks = getattr(body, "blocks", None)
    in_blocks: set[int] = set()
    gates: set[int] = set()
    if isinstance(blocks, nn.Module):
        parts = ("mtp", "head_transform", "encoder_blocks")  # MTP modules, BERT's head, T5's encoder stack
        stacks = [blocks] + [getattr(body, p) for p in parts if isinstance(getattr(body, p, None), nn.Module)]
        in_blocks = {id(p) for stack in stacks for p in stack.parameters()}
        gates = {id(mod.gate.weight) for stack in stacks for mod in stack.modules() if isinstance(mod, Router)}
    out = []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if id(p) in embedding:
            role = "embedding"
        elif p.ndim < 2:
            role = "vector"
        elif id(p) in gates:
            role = "router"
        elif id(p) in in_blocks:
            role = "hidden"
        else:
            role = "readout"
        out.append((name, p, role))
    return out


def mup_mult(model: nn.Module) -> Optional[float]:
    """The muP width multiplier m of ``model``, or None when it is not muP-parametrised (standard:
    no ``readout`` group, every scale 1)."""
    return width_mult(model.cfg) if hidden_matrices(model) else None


def keep_lr_scales(optimizer: torch.optim.Optimizer, keys: tuple[str, ...] = ("lr_scale",)) -> None:
    """After ``load_state_dict`` (which replaces each group's hyper-parameters by the saved ones), put
    back the ``keys`` of the groups as built: ``lr_scale`` comes from the model (muP) and the recipe,
    never from a checkpoint."""
    kept = [{k: g[k] for k in keys if k in g} for g in optimizer.param_groups]

    def restore(opt: torch.optim.Optimizer) -> None:
        for g, values in zip(opt.param_groups, kept):
            g.update(values)

    optimizer.register_load_state_dict_post_hook(restore)


class OptimizerSpec:
    """One optimizer a recipe can name (``train.optimizer``). Instances hold the ``train`` node;
    the class facts (``options``, ``backends``, ``state_bytes_per_param``) need no instance."""

    name: ClassVar[str]
    options: ClassVar[frozenset[str]] = frozenset({"weight_decay", "betas", "eps"})
    backends: ClassVar[frozenset[str]] = frozenset(BACKEND_LAUNCHES)
    # backend name -> why this optimizer does not run under it (a backend not in ``backends``)
    unsupported: ClassVar[dict[str, str]] = {}

    def __init__(self, train_cfg: Any):
        self.t = train_cfg

    # ------------------------------------------------------------------ recipe

    @classmethod
    def validate(cls, t: Any) -> None:
        """The rules on the keys this optimizer reads (``train.<key>=value: rule``)."""
        if t.weight_decay < 0:
            fail("train.weight_decay", t.weight_decay, "must be >= 0")
        if len(t.betas) != 2 or not all(0.0 <= b < 1.0 for b in t.betas):
            fail("train.betas", list(t.betas), "must be two numbers in [0, 1)")
        if not t.eps > 0:
            fail("train.eps", t.eps, "must be positive")

    @classmethod
    def refusal(cls, backend: str, zero_stage: int = 0) -> Optional[str]:
        """Why this optimizer does not train under ``backend`` (at ``zero_stage``), or None."""
        if backend in cls.backends:
            return None
        launch = BACKEND_LAUNCHES.get(backend, backend)
        if backend == "zero":
            launch = f"DeepSpeed ZeRO stage {zero_stage}"
        why = cls.unsupported.get(backend, "not supported")
        ok = ", ".join(BACKEND_LAUNCHES[b] for b in BACKEND_LAUNCHES if b in cls.backends)
        return f"train.optimizer={cls.name} under {launch}: {why}. {cls.name} trains under: {ok}"

    # ------------------------------------------------------------------ facts

    @classmethod
    def state_bytes_per_param(cls, role: str) -> int:
        """Bytes of optimizer state per parameter of ``role`` (fp32), besides weights, gradients and a
        bf16 run's fp32 master copy."""
        raise NotImplementedError

    def mup_scale(self, role: str, m: float) -> tuple[float, float]:
        """(lr multiplier, weight-decay multiplier) of a parameter of ``role`` under muP at width
        multiplier ``m`` (both 1 at m = 1). The product lr * weight decay stays the base model's."""
        raise NotImplementedError

    # ------------------------------------------------------------------ building

    def param_groups(self, model: nn.Module) -> list[dict]:
        raise NotImplementedError

    def build(self, model: nn.Module, expert_groups: bool = False) -> torch.optim.Optimizer:
        raise NotImplementedError


def optimizer_class(train_cfg: Any) -> type[OptimizerSpec]:
    """The class of ``train.optimizer`` (adamw for a ``train`` node without the key)."""
    return OPTIMIZERS.get(str(getattr(train_cfg, "optimizer", None) or "adamw"))


def optimizer_for(train_cfg: Any) -> OptimizerSpec:
    """The optimizer ``train.optimizer`` names, holding the ``train`` node."""
    return optimizer_class(train_cfg)(train_cfg)
