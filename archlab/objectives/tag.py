"""Token tagging (``train.objective: tag``): each identifier's role on its first token
(:mod:`archlab.data.tasks.tag`), a per-token linear head (:class:`archlab.model.token_heads.TokenTagger`),
cross-entropy over the labelled tokens. Validation rows: ``metric: tag``, ``tag_loss``, ``tag_accuracy`` (per
labelled token)."""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from archlab.config.schema import model_config
from archlab.data.tasks.items import IGNORE
from archlab.data.tasks.tag import N_CLASSES
from archlab.model.token_heads import TokenTagger
from archlab.objectives.base import OBJECTIVES
from archlab.objectives.understanding import UnderstandingObjective


@OBJECTIVES.register("tag")
class Tag(UnderstandingObjective):
    """Cross-entropy of a per-token role head on the labelled tokens (first token of each identifier)."""

    name = "tag"
    task = "tag"
    eval_metric = "tag: cross-entropy (nats) and accuracy per labelled token of the validation items"
    eval_loss_key = "tag_loss"

    def build_head(self, cfg: Any) -> nn.Module:
        return TokenTagger(model_config(cfg), N_CLASSES)

    def item_loss(self, logits_BSC: Tensor, y_BS: Tensor, reduction: str) -> Tensor:
        return F.cross_entropy(logits_BSC.flatten(0, 1), y_BS.flatten(), reduction=reduction, ignore_index=IGNORE)

    def item_correct(self, logits_BSC: Tensor, y_BS: Tensor) -> tuple[Tensor, Tensor]:
        labelled = y_BS != IGNORE
        return ((logits_BSC.argmax(-1) == y_BS) & labelled).sum(1), labelled.sum(1)

    @classmethod
    def forward_flops(cls, cfg: Any, seq_len: int) -> dict[str, float]:
        """The head: one D x C product per token (counted under ``lm_head``)."""
        return {"lm_head": 2.0 * cfg.d_model * N_CLASSES}
