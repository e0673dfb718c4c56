"""The understanding objectives (train.objective tag, span_qa, bound) on each model type (GPT, BERT, T5 tiny
recipes): the heads' shapes, finite losses that back-propagate into the trunk, evaluation sums, and the refusals."""

from __future__ import annotations

import pytest
import torch

import archlab
from archlab.config.validate import RecipeError
from archlab.data.tasks.items import IGNORE
from archlab.objectives import objective_for

TYPES = ("gpt", "bert", "t5")
SMALL = ["model.n_layers=1", "model.d_model=32", "model.n_heads=2", "train.seq_len=24"]


def recipe(kind: str, objective: str, *more: str):
    return archlab.load_recipe(f"recipes/finetune/{kind}-understand.yaml",
                               [*SMALL, f"train.objective={objective}", *more])


def windows(objective: str, B: int = 3, S: int = 24) -> torch.Tensor:
    """(B, S + L) random item windows: inputs, then labels of the task's shape."""
    x = torch.randint(0, 200, (B, S))
    if objective == "tag":
        y = torch.randint(0, 6, (B, S))
        y[:, ::2] = IGNORE
    elif objective == "span_qa":
        start = torch.randint(0, S - 2, (B,))
        y = torch.stack([start, start + 1], 1)
    else:
        y = torch.randint(0, 2, (B, 1))
    return torch.cat([x, y], 1)


@pytest.mark.parametrize("kind", TYPES)
@pytest.mark.parametrize("objective,shape", [("tag", (3, 24, 6)), ("span_qa", (3, 24, 2)), ("bound", (3, 2))])
def test_heads_shapes_and_losses_on_each_model_type(kind, objective, shape):
    cfg = recipe(kind, objective)
    obj = objective_for(cfg)
    model = obj.build_model(cfg)
    w = windows(objective)
    assert model(w[:, :24]).logits.shape == shape
    loss = obj.loss(model, w)
    assert loss.total.ndim == 0 and torch.isfinite(loss.total)
    loss.total.backward()
    assert model.trunk.embed.weight.grad.abs().sum() > 0  # the head's loss reaches the trunk
    total, correct, count = obj.eval_sums(model, w)
    assert count == (12 * 3 if objective == "tag" else 3) and 0 <= int(correct) <= count
    assert torch.allclose(total / count, obj.item_loss(model(w[:, :24]).logits.float(), w[:, 24:], "mean"),
                          atol=1e-5)
    row = obj.eval_row({"loss": float(total), "correct": float(correct), "count": count})
    assert row["metric"] == objective and f"{objective}_accuracy" in row


def test_a_perfect_span_prediction_scores_one_and_the_loss_averages_start_and_end():
    cfg = recipe("bert", "span_qa")
    obj = objective_for(cfg)
    y = torch.tensor([[3, 5]])
    logits = torch.full((1, 24, 2), -20.0)
    logits[0, 3, 0] = logits[0, 5, 1] = 20.0
    correct, counted = obj.item_correct(logits, y)
    assert correct.tolist() == [1] and counted.tolist() == [1]
    logits[0, 5, 1] = -20.0
    logits[0, 6, 1] = 20.0  # end one token off: no exact match; the end's loss is about 40 nats, the start's 0
    assert obj.item_correct(logits, y)[0].tolist() == [0]
    assert obj.item_loss(logits, y, "mean").item() == pytest.approx(20.0, rel=1e-3)


def test_gpt_reads_the_last_state_bert_the_first_t5_the_encoder_mean_for_bound():
    for kind, pooling in (("gpt", "last"), ("bert", "first"), ("t5", "mean")):
        cfg = recipe(kind, "bound")
        assert objective_for(cfg).build_model(cfg).head.pooling == pooling


@pytest.mark.parametrize("more,rule", [
    (["train.objective=tag", "train.seq_len=8"], r"train.seq_len=8: train.objective=tag needs windows of >= 16"),
    (["train.objective=span_qa", "train.eval_context_multipliers=[1,2]"],
     r"train.eval_context_multipliers=\[1, 2\]: the task's items are windows"),
    (["train.objective=tag", "train.objective.pooling=last"],
     r"train.objective.pooling='last': not a key of objective.type tag .*pooling is read by objective.type bound, "
     r"classify"),
    (["train.objective=bound", "train.objective.pooling=first"], r"model.type=decoder pools last or mean"),
    (["train.objective=tag", "model.mtp_depth=1"], r"model.mtp_depth=1: train.objective=tag reads the trunk"),
])
def test_refusals_name_the_key(more, rule):
    with pytest.raises(RecipeError, match=rule):
        archlab.load_recipe("recipes/finetune/gpt-understand.yaml", more)
