"""Training objectives, one registry (``train.objective``): ``causal_lm`` (:mod:`.causal_lm`: next-token
prediction, GPT), ``mtp`` (:mod:`.mtp`: DeepSeek-V3's multi-token prediction on top of it) and ``mlm``
(:mod:`.mlm`: BERT's masked-token prediction, for an encoder) and ``span_corruption`` (:mod:`.span_corruption`:
T5's, for an encoder-decoder) and ``classify`` (:mod:`.classify`: fine-tuning a pre-trained model with a
classification head on a labelled task), and the understanding tasks ``tag``, ``span_qa`` and ``bound``
(:mod:`.understanding`: Python's ast as ground truth). The protocol is :class:`.base.Objective`.

    objective = objective_for(cfg)                  # the class train.objective names, holding the recipe
    batches = TokenBatches(tokens, S, ..., ahead=objective.ahead(cfg.model))   # windows of S + ahead ids
    loss = objective.loss(model, x_BW, step=step, micro=micro)   # Loss: total (back-propagated), main, aux, parts

This package sits outside ``archlab.train`` because the cost model (``archlab.costs``) asks the
objectives for their FLOPs and saved bytes, and ``archlab.train`` imports the cost model.
"""

from __future__ import annotations

from typing import Any

from archlab.data import prepare_data
from archlab.objectives import bound, causal_lm, classify, mlm, mtp, span_corruption, span_qa, tag  # noqa: F401
from archlab.objectives.base import OBJECTIVES, Loss, Objective, objective_class, objective_name, objective_type


def objective_for(cfg: Any) -> Objective:
    """An instance of the objective a full recipe's ``train.objective`` names, holding the recipe."""
    return objective_class(objective_name(cfg))(cfg)


def token_data(cfg: Any, progress=None):
    """A recipe's token data (``archlab.data.prepare_data``) with the ids its objective reserves at the top of
    the vocabulary left free (masked LM: the mask id): what the trainer reads, for tools that read it too."""
    reserved = objective_class(objective_name(cfg)).reserved_ids(cfg) if "train" in cfg else 0
    return prepare_data(cfg, progress=progress, reserved=reserved)


__all__ = ["OBJECTIVES", "Loss", "Objective", "objective_class", "objective_for", "objective_name", "objective_type",
           "token_data"]
