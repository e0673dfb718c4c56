"""Is every name the window reads bound within it? (``train.objective: bound``; :mod:`archlab.data.tasks.bound`):
a sequence classification whose label needs the whole window, with the ``classify`` objective's head
(:class:`archlab.model.classifier.Classifier`: ``train.objective.pooling``, null = the model type's convention,
GPT the last state, BERT the first, T5 the encoder's mean). Validation rows: ``metric: bound``, ``bound_loss``,
``bound_accuracy``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Optional

import torch.nn.functional as F
from torch import Tensor, nn

from archlab.config.schema import ObjectiveConfig, model_config
from archlab.data.tasks.bound import N_CLASSES
from archlab.model.classifier import Classifier, pooling_for
from archlab.objectives.base import OBJECTIVES
from archlab.objectives.understanding import UnderstandingObjective


@dataclass
class BoundConfig(ObjectiveConfig):
    type: str = "bound"
    # the state the head reads, first | last | mean; null = the model type's convention (as classify's)
    pooling: Optional[str] = None
    renamed: ClassVar[dict[str, str]] = {"classify_pooling": "pooling"}  # the flat train key before this node


@OBJECTIVES.register("bound")
class Bound(UnderstandingObjective):
    """Cross-entropy of a classification head on one pooled state per window."""

    name = "bound"
    task = "bound"
    Config = BoundConfig
    options = frozenset({"init_from"})
    eval_metric = "bound: cross-entropy (nats) and accuracy on the validation items"
    eval_loss_key = "bound_loss"

    @classmethod
    def validate(cls, cfg: Any) -> None:
        super().validate(cfg)
        pooling_for(cfg.model, cfg.train.objective.pooling)

    def build_head(self, cfg: Any) -> nn.Module:
        return Classifier(model_config(cfg), N_CLASSES, cfg.train.objective.pooling)

    def item_loss(self, logits_BC: Tensor, y_B1: Tensor, reduction: str) -> Tensor:
        return F.cross_entropy(logits_BC, y_B1[:, 0], reduction=reduction)

    def item_correct(self, logits_BC: Tensor, y_B1: Tensor) -> tuple[Tensor, Tensor]:
        right = (logits_BC.argmax(-1) == y_B1[:, 0]).long()
        return right, right.new_ones(right.shape)

    @classmethod
    def forward_flops(cls, cfg: Any, seq_len: int) -> dict[str, float]:
        """The head: one D x C product per window, per input token (counted under ``lm_head``)."""
        return {"lm_head": 2.0 * cfg.d_model * N_CLASSES / seq_len}
