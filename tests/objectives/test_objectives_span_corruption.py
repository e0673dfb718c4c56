"""Span corruption (T5): the window is split into alternating non-noise and noise spans of the stated counts,
the encoder input and the targets interleave them with the sentinels exactly as T5's layout, the draws repeat
for the same (seed, step, micro batch), and validation rows are named apart from causal LM's.

Shape legend: B batch, S window, M encoder input, T targets.
"""

import pytest
import torch

import archlab
from archlab.objectives import objective_for
from archlab.objectives.span_corruption import corrupt, noise_mask, sentinel_ids, span_counts, start_id


@pytest.mark.parametrize("S, density, mean, expected", [
    (128, 0.15, 3.0, (19, 6)), (64, 0.15, 3.0, (10, 3)), (512, 0.15, 3.0, (77, 26)), (10, 0.15, 3.0, (2, 1)),
    (20, 0.45, 1.0, (9, 9)),
])
def test_noise_and_span_counts_follow_t5s_rounding(S, density, mean, expected):
    assert span_counts(S, density, mean) == expected


def test_the_noise_mask_has_the_counts_and_alternates_starting_with_text():
    g = torch.Generator().manual_seed(0)
    mask = noise_mask(50, 128, 19, 6, g)
    assert mask.shape == (50, 128) and bool((mask.sum(1) == 19).all()) and not mask[:, 0].any()
    starts = mask & ~torch.cat([torch.zeros(50, 1, dtype=torch.bool), mask[:, :-1]], 1)
    assert bool((starts.sum(1) == 6).all())  # six separate noise spans per window
    assert bool(mask[:, -1].all())  # the last segment is noise: text and noise spans pair up
    lengths = {int(x) for x in mask.sum(1)}
    assert lengths == {19}
    assert len({tuple(row.tolist()) for row in mask}) == 50  # every window drawn apart


def test_encoder_input_and_targets_are_t5s_layout():
    x = torch.arange(100, 112)[None]  # one window of 12 distinct ids
    noise = torch.tensor([[0, 0, 1, 1, 0, 0, 0, 1, 0, 0, 1, 1]], dtype=torch.bool)
    enc, dec, tgt = corrupt(x, noise, vocab_size=300, spans=3)
    s0, s1, s2 = sentinel_ids(300, 3).tolist()
    assert (s0, s1, s2) == (298, 297, 296)
    assert enc.tolist() == [[100, 101, s0, 104, 105, 106, s1, 108, 109, s2]]
    assert tgt.tolist() == [[s0, 102, 103, s1, 107, s2, 110, 111]]
    assert dec.tolist() == [[start_id(300), s0, 102, 103, s1, 107, s2, 110]]


def _recipe(*overrides: str):
    return archlab.load_recipe("recipes/t5/tiny.yaml", ["model.vocab_size=300", "model.n_layers=1", *overrides])


def test_the_objective_reserves_the_start_id_and_its_sentinels_and_repeats_its_draws():
    cfg = _recipe()
    objective = objective_for(cfg)
    assert objective.window_ahead == 0 and objective.reserved_ids(cfg) == 1 + 6  # seq_len 128: 6 spans
    assert objective.lengths(128) == (115, 25)
    x = torch.randint(0, 293, (4, 128))
    first = objective.corrupt(x, 0, 7, 1)
    assert all(torch.equal(a, b) for a, b in zip(first, objective.corrupt(x, 0, 7, 1)))
    assert not torch.equal(first[0], objective.corrupt(x, 0, 8, 1)[0])
    assert [t.shape for t in first] == [(4, 115), (4, 25), (4, 25)]
    # every id of the window appears once: in the encoder's input or among the targets
    kept = torch.cat([first[0], first[2]], 1)
    for row, window in zip(kept, x):
        assert sorted(i for i in row.tolist() if i < 293) == sorted(window.tolist())


def test_the_loss_and_the_validation_row_are_span_corruptions():
    cfg = _recipe()
    objective = objective_for(cfg)
    model = archlab.build_model(cfg)
    x = torch.randint(0, 293, (2, 129))
    loss = objective.loss(model, x[:, :-1])
    assert loss.total.requires_grad and float(loss.main.detach()) > 0
    sums = objective.eval_sums(model, x)
    row = objective.eval_row(dict(zip(objective.eval_keys, (float(v) for v in sums))))
    assert row["metric"] == "span_corruption" and "loss" not in row and row["eval_tokens"] == 2 * 25
    assert 0.0 <= row["span_accuracy"] <= 1.0 and row["span_loss"] > 0
