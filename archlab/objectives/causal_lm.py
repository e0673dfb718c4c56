"""Causal language modelling: every position predicts the next token (GPT). Windows of S + 1 ids."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from archlab.errors import fail
from archlab.nn.component import ID_BYTES, STATS_BYTES
from archlab.nn.loss import lm_loss
from archlab.objectives.base import OBJECTIVES, Loss, Objective


def head_loss_bytes(s: Any, loss: str, bias: bool = False) -> float:
    """Bytes the LM head + cross-entropy keep for backward on N = B * S tokens.

    ``fused`` (the trainer's ``archlab.nn.loss.linear_cross_entropy``): the gradients wrt the head's input
    h (N x D) and weight (V x D) (and ``bias``: its output bias, V), computed in the forward, in the model's
    dtype, and the count of counted tokens; ``logits`` (the reference ``lm_loss`` on the model's (B, S, V)
    logits): the head's input h, the N x V fp32 log-softmax (the logits are upcast), a copy of the (strided)
    targets and the total weight.
    """
    cfg, n, a = s.cfg, s.n, s.act
    D, V = cfg.d_model, cfg.vocab_size
    if loss == "fused":
        return n * D * a + V * D * a + (V * a if bias else 0) + ID_BYTES
    if bias:
        raise ValueError("loss='logits': the reference loss on the logits is causal LM's, without an output bias")
    return n * D * a + n * V * STATS_BYTES + n * ID_BYTES + STATS_BYTES


@OBJECTIVES.register("causal_lm")
class CausalLM(Objective):
    """Next-token cross-entropy on every position, the LM head and loss fused (no (B, S, V) logits)."""

    name = "causal_lm"
    options = frozenset({"init_from", "upcycle"})  # start from a run's weights (archlab/train/upcycle.py)

    @classmethod
    def validate(cls, cfg: Any) -> None:
        if cfg.model.type == "encoder_decoder":
            fail("train.objective", cls.name, "model.type=encoder_decoder writes targets behind an "
                 "encoded input: train it with train.objective=span_corruption")
        if cfg.model.type == "encoder":
            fail("train.objective", cls.name, "model.type=encoder sees both sides of every position, "
                 "the next token included: train it with train.objective=mlm")
        if cfg.model.mtp_depth:
            fail("model.mtp_depth", cfg.model.mtp_depth, "multi-token-prediction modules are trained only by "
                 "train.objective=mtp; set it, or model.mtp_depth=0")

    def loss(self, model: nn.Module, x_BW: Tensor, *, step: int = 0, micro: int = 0) -> Loss:
        inputs, targets = self.split(x_BW, 1)
        out = model(inputs, targets=targets)
        return Loss(main=out.loss.float(), aux=out.aux_loss.float())

    def logits_loss(self, model: nn.Module, x_BW: Tensor, *, step: int = 0, micro: int = 0) -> Tensor:
        inputs, targets = self.split(x_BW, 1)
        out = model(inputs)
        return lm_loss(out.logits, targets) + out.aux_loss.float()

    @classmethod
    def forward_flops(cls, cfg: Any, seq_len: int) -> dict[str, float]:
        return {"lm_head": 2.0 * cfg.d_model * cfg.vocab_size}

    @classmethod
    def saved_bytes(cls, s: Any, loss: str, checkpointing: str, block_bytes: Any = None) -> dict[str, float]:
        return {"loss": float(head_loss_bytes(s, loss))}
