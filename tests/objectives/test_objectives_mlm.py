"""Masked-token prediction (BERT): the 80/10/10 corruption of the selected positions, deterministic given
(seed, step, micro batch); the loss only on the selected positions; validation sums; the mask id reserved
at the top of the vocabulary (the tokenizer never reaches it); the cost model exact against the measured
step.

Shape legend: B batch, S sequence, V vocabulary.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import archlab
from archlab import RecipeError
from archlab.costs import forward_flops, param_counts, training_flops_per_token
from archlab.costs.measure import measured_flops, saved_activation_bytes
from archlab.costs.memory import activation_memory
from archlab.data import TokenBatches
from archlab.model import build_model
from archlab.objectives import objective_for
from archlab.objectives.mlm import mask_id, mask_tokens

SMALL = ["model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.vocab_size=300"]


def bert(*overrides: str):
    return archlab.load_recipe("recipes/bert/tiny.yaml", [*SMALL, *overrides])


def ids(B: int, S: int, seed: int = 0, V: int = 299) -> torch.Tensor:
    return torch.randint(0, V, (B, S), generator=torch.Generator().manual_seed(seed))


def test_windows_hold_s_ids_and_the_mask_id_is_the_last_row():
    cfg = bert()
    mlm = objective_for(cfg)
    assert mlm.window_ahead == 0 and mlm.reserved_ids(cfg) == 1 and mask_id(cfg.model) == 299
    tokens = np.arange(1000)
    batches = TokenBatches(tokens, 16, 2, 1, seed=3, ahead=0)
    x = batches.get(5)
    assert x.shape == (2, 16) and (x[:, 1:] - x[:, :-1] == 1).all()
    assert batches.step_starts(5).max() <= 1000 - 16  # the last start still holds S ids
    with pytest.raises(ValueError, match="cannot be negative"):
        TokenBatches(tokens, 16, 2, 1, ahead=-1)


def test_the_corruption_follows_bert_80_10_10():
    x = ids(64, 256, V=290)  # ids < 290: a random replacement (in [0, 299)) is often a new id
    inputs, targets = mask_tokens(x, 0.15, 299, torch.Generator().manual_seed(0))
    selected = targets != -100
    n = int(selected.sum())
    assert abs(n / x.numel() - 0.15) < 0.01
    assert torch.equal(targets[selected], x[selected])  # the original ids are the targets
    assert torch.equal(inputs[~selected], x[~selected])  # unselected positions untouched
    masked = inputs[selected] == 299
    kept = inputs[selected] == x[selected]
    changed = ~masked & ~kept  # a random id other than the original
    assert abs(float(masked.float().mean()) - 0.8) < 0.02
    assert abs(float(kept.float().mean()) - (0.1 + 0.1 / 299)) < 0.02  # kept, or drawn to the same id
    assert abs(float(changed.float().mean()) - 0.1 * 298 / 299) < 0.02
    assert (inputs[selected][changed] < 299).all()  # random ids never the mask


def test_the_draws_depend_only_on_seed_step_and_micro_batch():
    cfg = bert()
    mlm = objective_for(cfg)
    x = ids(4, 32)
    a = mlm.select(x, 0, step=7, micro=1)
    assert all(torch.equal(u, v) for u, v in zip(a, mlm.select(x.clone(), 0, step=7, micro=1)))
    reseeded = objective_for(bert("train.seed=1"))
    for other in (mlm.select(x, 0, 8, 1), mlm.select(x, 0, 7, 0), reseeded.select(x, 0, 7, 1)):
        assert not torch.equal(a[1], other[1])


def test_a_tiny_batch_always_predicts_something():
    inputs, targets = mask_tokens(ids(1, 2), 0.01, 299, torch.Generator().manual_seed(0))
    assert int((targets != -100).sum()) >= 1


def test_the_loss_is_the_cross_entropy_of_the_selected_positions():
    cfg = bert()
    torch.manual_seed(0)
    model = build_model(cfg)
    with torch.no_grad():
        model.head_bias.normal_()  # the output bias counts in the loss
    mlm = objective_for(cfg)
    x = ids(2, 16)
    loss = mlm.loss(model, x, step=3, micro=0)
    inputs, targets = mlm.select(x, 0, 3, 0)
    logits = model(inputs).logits
    selected = targets != -100
    expected = F.cross_entropy(logits[selected], x[selected])
    torch.testing.assert_close(loss.main, expected)
    assert torch.equal(loss.total, loss.main + loss.aux) and loss.parts == {}
    # gradients equal those of the reference on the logits
    model.zero_grad()
    loss.total.backward()
    fused = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    F.cross_entropy(model(inputs).logits[selected], x[selected]).backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(fused[n], p.grad, msg=n)


def test_validation_sums_and_row():
    cfg = bert()
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    mlm = objective_for(cfg)
    x = ids(3, 17)  # validation windows hold S + 1 ids: the last is dropped
    total, correct, count = mlm.eval_sums(model, x, index=2)
    inputs, targets = mlm.select(x[:, :-1], 1, 0, 2)
    selected = targets != -100
    logits = model(inputs).logits
    assert count == int(selected.sum())
    torch.testing.assert_close(total, F.cross_entropy(logits[selected], x[:, :-1][selected], reduction="sum"))
    assert int(correct) == int((logits.argmax(-1)[selected] == x[:, :-1][selected]).sum())
    row = mlm.eval_row({"loss": 12.0, "correct": 3.0, "count": 4.0})
    assert row == {"metric": "mlm", "mlm_loss": 3.0, "mlm_accuracy": 0.75, "eval_tokens": 4}
    assert "loss" not in row  # never compared with a causal LM's loss by accident


@pytest.mark.parametrize("extra", [[], ["model.ffn.type=relu", "model.head_bias=false"],
                                   ["model.norm.type=rmsnorm", "model.norm.placement=pre", "model.dropout=0.1"],
                                   ["model.embed_norm=false", "model.head_transform=false"]],
                         ids=["bert", "relu-nobias", "rms-pre-dropout", "bare"])
@pytest.mark.parametrize("mode", ["none", "full", "selective"])
def test_cost_model_equals_the_measured_step(extra, mode):
    cfg = bert(*extra)
    torch.manual_seed(0)
    model = build_model(cfg)
    model.checkpointing = mode
    B, S = 2, 16
    x = ids(B, S)
    if mode == "none":
        assert measured_flops(model, x)["total"] == training_flops_per_token(cfg, S) * B * S
    model.zero_grad()
    assert saved_activation_bytes(model, x)["total"] == activation_memory(
        cfg, B, S, dtype="fp32", device="cpu", checkpointing=mode).total
    counts = param_counts(cfg)
    assert counts.total == sum(p.numel() for p in model.parameters())
    assert counts.embedding == 300 * 32 + cfg.model.max_seq_len * 32


def test_the_head_transform_is_its_own_flops_component():
    on, off = (forward_flops(archlab.model_config(bert(*o)), 16) for o in ([], ["model.head_transform=false"]))
    assert on.head_transform == 2 * 32 * 32 and off.head_transform == 0.0
    assert on.total - off.total == on.head_transform and on.lm_head == 2 * 32 * 300


@pytest.mark.parametrize("overrides, message", [
    (["train.objective.probability=0"], r"^train.objective.probability=0.0: must lie in \(0, 1\)"),
    (["train.objective.probability=1.0"], r"^train.objective.probability=1.0: must lie in \(0, 1\)"),
    (["data.tokenizer=byte", "model.vocab_size=257"],
     r"^model.vocab_size=257: the byte tokenizer needs 256 byte ids \+ 1 end-of-text id, \+ 1 id\(s\) the objective "
     r"reserves \(>= 258\)"),
    (["model.vocab_size=260"], r"^model.vocab_size=260: a byte-level BPE needs .* \(>= 261\)"),
])
def test_bad_mlm_settings_are_refused_by_name(overrides, message):
    with pytest.raises(RecipeError, match=message):
        bert(*overrides)


def test_mlm_probability_is_refused_where_nothing_reads_it():
    with pytest.raises(RecipeError, match=r"^train.objective.probability=0.2: not a key of objective.type causal_lm "
                                          r"\(its keys: type\); probability is read by objective.type mlm$"):
        archlab.load_recipe("recipes/dense/tiny.yaml", ["train.objective.probability=0.2"])
    archlab.load_recipe("recipes/dense/tiny.yaml", ["data.tokenizer=byte", "model.vocab_size=257"])  # no mask id


def test_the_tokenizer_leaves_the_mask_id_free(tmp_path):
    """The BPE of an MLM recipe has vocab_size - 1 ids (the mask id never occurs in the data); a causal
    recipe's BPE keeps all vocab_size ids (its cache and numbers unchanged)."""
    from archlab.objectives import token_data as prepare_data

    common = [f"data.cache_dir={tmp_path}", "data.max_bytes=60000", "train.seq_len=32"]
    mlm = prepare_data(bert(*common))
    assert mlm.tokenizer.vocab_size == 299 and int(mlm.train.max()) < 299 and int(mlm.val.max()) < 299
    causal = prepare_data(archlab.load_recipe("recipes/dense/tiny.yaml", [*SMALL, *common]))
    assert causal.tokenizer.vocab_size == 300 and causal.cache_path != mlm.cache_path
    byte = prepare_data(bert(*common, "data.tokenizer=byte", "model.vocab_size=258"))
    assert byte.tokenizer.vocab_size == 257
