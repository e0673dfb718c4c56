"""Extractive question answering (``train.objective: span_qa``): where is NAME defined?
(:mod:`archlab.data.tasks.span_qa`). BERT's SQuAD head (sec. 4.2): start and end logits over the positions
(:class:`archlab.model.token_heads.SpanExtractor`), the mean of the two cross-entropies. Validation rows:
``metric: span_qa``, ``span_qa_loss``, ``span_qa_accuracy`` (exact match of start and end)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from archlab.config.schema import model_config
from archlab.model.token_heads import SpanExtractor
from archlab.objectives.base import OBJECTIVES
from archlab.objectives.understanding import UnderstandingObjective


@OBJECTIVES.register("span_qa")
class SpanQA(UnderstandingObjective):
    """(CE(start) + CE(end)) / 2 over the window's positions."""

    name = "span_qa"
    task = "span_qa"
    eval_metric = "span_qa: cross-entropy (nats, start and end averaged) and exact match on the validation items"
    eval_loss_key = "span_qa_loss"

    def build_head(self, cfg: Any) -> nn.Module:
        return SpanExtractor(model_config(cfg))

    def item_loss(self, logits_BS2: Tensor, y_B2: Tensor, reduction: str) -> Tensor:
        start = F.cross_entropy(logits_BS2[..., 0], y_B2[:, 0], reduction=reduction)
        end = F.cross_entropy(logits_BS2[..., 1], y_B2[:, 1], reduction=reduction)
        return (start + end) / 2

    def item_correct(self, logits_BS2: Tensor, y_B2: Tensor) -> tuple[Tensor, Tensor]:
        exact = (logits_BS2.argmax(1) == y_B2).all(1)
        return exact.long(), torch.ones_like(exact, dtype=torch.long)

    @classmethod
    def forward_flops(cls, cfg: Any, seq_len: int) -> dict[str, float]:
        """The head: one D x 2 product per token (counted under ``lm_head``)."""
        return {"lm_head": 2.0 * cfg.d_model * 2}
