"""muP, the maximal-update parametrisation (Yang et al. 2022, "Tensor Programs V", Table 3 for Adam).

A recipe sets ``model.parametrization: mup`` and ``model.mup_base_width``, the d_model of the base
model whose hyper-parameters (learning rate, init std) were tuned; m = d_model / mup_base_width
is the width multiplier. muP keeps every activation's scale and every update's effect on it
independent of width, so the base's best learning rate stays (close to) best at every m. Relative
to the base, with archlab's init std σ = ``init_std``, Adam(W) lr η and weight decay λ:

    parameter                                 init std   Adam lr   weight decay   forward
    hidden matrices (width -> width): wqkv,   σ/√m       η/m       λ·m
      wo, FFN, routed and shared experts
    output-like block matrix (width -> E):    σ/m        η/m       λ·m
      the MoE router gate
    vector-like: token and position           σ          η         as standard
      embeddings, norm gains, biases
    readout: lm_head (tied or untied)         σ          η         λ              logits · 1/m
    attention scores                                                              · 1/(√Dh·√m)

- archlab's init is a fixed std, not fan-in based, so hidden matrices are scaled by 1/√m
  explicitly: their variance is then ∝ 1/fan_in relative to the base (Table 3's 1/fan_in).
- η/m and λ·m: torch's AdamW decays by lr·wd per step, so lr·wd stays the base's, as the ``mup``
  package's MuAdamW does. The optimizer groups carry the multiplier as ``lr_scale``; each
  optimizer class says how muP scales its groups (``mup_scale`` in ``archlab.optim``: the table
  above is AdamW's; Muon keeps the hidden matrices' lr, or lr/√m under its ``match_rms_adamw``
  adjustment, and scales its AdamW groups as here).
- Readout: as the ``mup`` package's MuReadout / MuSharedReadout, the LM head keeps the
  width-independent std σ and lr η and its output is multiplied by 1/m, which is Table 3's
  output weight (init variance ∝ 1/fan_in², Adam lr ∝ 1/fan_in) written with a multiplier. With
  tied embeddings the shared matrix is vector-like (embedding lr and init) and only the logits are
  scaled. The readout is not zero-initialised (the ``mup`` examples' option): a tied head cannot
  be, and at m = 1 the model then equals standard parametrisation exactly.
- The router gate has no multiplier; σ/m with η/m is the same parametrisation written without one.
- Attention: muP scales scores by 1/Dh instead of 1/√Dh, written sqrt(Dh_base)/Dh as the ``mup``
  package's Transformer example does, so that m = 1 is standard attention. Heads: n_heads is
  fixed across widths and the head dim grows (Dh = m · Dh_base, as in TP5's and the ``mup``
  example's Transformers), hence the scale 1/(√Dh·√m). An explicit ``attention.scale`` wins.
- Assumed: every hidden width scales with d_model (n_heads·Dh, the FFN and expert hidden sizes),
  as their defaults do; an explicit ``ffn.hidden`` or ``moe.expert_hidden`` must be scaled along
  with d_model across a width sweep. (The ``mup`` package reads a multiplier per weight off a
  base model's shapes; archlab uses the single m.) Not done: the zero-initialised query of TP5's
  Appendix D.2.

At m = 1 muP is standard parametrisation (same init draws, same forward, same learning rates).
Parameter counts and FLOPs do not change.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Iterator

import torch
from torch import nn

from archlab.nn.moe.router import Router

if TYPE_CHECKING:
    from archlab.config.schema import ModelConfig


PARAMETRIZATIONS = ("standard", "mup")
# the model keys each parametrisation reads beyond the shared ones (archlab.config.options refuses the others)
PARAMETRIZATION_OPTIONS = {"standard": frozenset(), "mup": frozenset({"mup_base_width"})}


def is_mup(cfg: ModelConfig) -> bool:
    return cfg.parametrization == "mup"


def width_mult(cfg: ModelConfig) -> float:
    """m = d_model / mup_base_width under muP (base width null: m = 1); 1 under standard."""
    if not is_mup(cfg) or cfg.mup_base_width is None:
        return 1.0
    return cfg.d_model / cfg.mup_base_width


def attention_scale(cfg: ModelConfig) -> float:
    """Default score scale: 1/sqrt(Dh); muP: sqrt(Dh_base)/Dh = 1/(sqrt(Dh) * sqrt(m))."""
    scale = 1.0 / math.sqrt(cfg.d_head)
    m = width_mult(cfg)
    return scale if m == 1.0 else scale / math.sqrt(m)


def readout_mult(cfg: ModelConfig) -> float:
    """Multiplier on the LM head's output: 1/m under muP, 1 under standard."""
    return 1.0 / width_mult(cfg)


def _block_matrices(model: nn.Module) -> Iterator[tuple[nn.Parameter, bool]]:
    """(parameter, is output-like) for every matrix (>= 2 dims) of the model's blocks, and of its
    multi-token-prediction modules (their 2D -> D projection and block), which train like blocks."""
    stacks = [model.blocks] + ([model.mtp] if isinstance(getattr(model, "mtp", None), nn.Module) else [])
    gates = {id(mod.gate.weight) for stack in stacks for mod in stack.modules() if isinstance(mod, Router)}
    for stack in stacks:
        for p in stack.parameters():
            if p.ndim >= 2:
                yield p, id(p) in gates


def hidden_matrices(model: nn.Module) -> set[int]:
    """ids of the parameters muP trains at lr/m (hidden and output-like block matrices);
    empty for a model that is not muP-parametrised (or not an archlab decoder)."""
    cfg = getattr(model, "cfg", None)
    if cfg is None or not hasattr(cfg, "parametrization") or not is_mup(cfg) or not hasattr(model, "blocks"):
        return set()
    return {id(p) for p, _ in _block_matrices(model)}


@torch.no_grad()
def rescale_init(model: nn.Module) -> None:
    """Turn a standard init (std σ everywhere) into muP's: hidden matrices σ/√m, router gates σ/m.
    Called once by the decoder's ``init_weights``; a no-op unless muP with m != 1."""
    m = width_mult(model.cfg)
    if m == 1.0:
        return
    for p, output_like in _block_matrices(model):
        p.mul_(1.0 / m if output_like else 1.0 / math.sqrt(m))
