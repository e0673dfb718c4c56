"""Cloze items and scores: the same items for every run, each model type read through its own interface (a
decoder from the left only, an encoder and an encoder-decoder from both sides), distributions over the text
ids only."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

import archlab
from analysis.measurements.cloze import Cloze, cloze_items, cloze_log_probs, span_cloze_inputs
from tools.experiment import load_spec

TEXT = 290  # text ids of the models below (the ids above: mask, start, sentinels)


def _model(recipe: str, vocab: int):
    cfg = archlab.load_recipe(f"recipes/{recipe}.yaml", [f"model.vocab_size={vocab}", "model.n_layers=1",
                                                         "train.seq_len=32"])
    torch.manual_seed(0)
    return archlab.build_model(cfg).eval()


def test_items_are_deterministic_and_leave_context_on_both_sides():
    tokens = np.arange(10_000) % TEXT
    x, pos = cloze_items(tokens, 64, 40, seed=3)
    x2, pos2 = cloze_items(tokens, 64, 40, seed=3)
    assert torch.equal(x, x2) and torch.equal(pos, pos2) and x.shape == (40, 64)
    assert int(pos.min()) >= 8 and int(pos.max()) < 56
    assert not torch.equal(pos, cloze_items(tokens, 64, 40, seed=4)[1])


@pytest.mark.parametrize("recipe, vocab, kind, sees_right", [
    ("dense/tiny", 300, "decoder", False), ("bert/tiny", 300, "encoder", True),
    ("t5/tiny", 300, "encoder_decoder", True)])
def test_each_model_type_reads_its_own_context(recipe, vocab, kind, sees_right):
    model = _model(recipe, vocab)
    if kind == "encoder_decoder":
        with torch.no_grad():
            model.embed.weight.mul_(0.1)  # off the unit-scale table's regime (every logit favouring the input id)
    x = torch.randint(0, TEXT, (4, 32))
    pos = torch.tensor([10, 12, 20, 25])
    lp = cloze_log_probs(model, kind, x, pos, TEXT)
    assert lp.shape == (4, TEXT)
    torch.testing.assert_close(lp.exp().sum(-1), torch.ones(4))  # a distribution over the text ids
    right = x.clone()
    right[:, -1] = (x[:, -1] + 1) % TEXT  # the last id: right of every item
    answer = x.clone()
    answer[torch.arange(4), pos] = (x[torch.arange(4), pos] + 1) % TEXT  # the held-out id itself
    torch.testing.assert_close(cloze_log_probs(model, kind, answer, pos, TEXT), lp)  # never read
    changed = cloze_log_probs(model, kind, right, pos, TEXT)
    assert (not torch.allclose(changed, lp)) == sees_right


def test_each_arm_is_compared_with_the_reference_of_its_own_budget(root, tmp_path):
    """With ``budgets:`` the 1M-token BERT is paired with the 1M-token GPT, not with the spec's reference (the
    0.5M-token GPT): a comparison across budgets would measure the budget, not the model type."""
    spec = load_spec(str(root / "experiments/model-types.yaml"))
    acc = {"gpt-tok500000": (0.40, 0.50), "gpt-tok1e6": (0.60, 0.70), "bert-tok1e6": (0.50, 0.62)}
    results = [{"arm": arm, "seed": s, "result": {"accuracy": a, "nll": 3.0 - a, "model_type": "x", "items": 8}}
               for arm, values in acc.items() for s, a in enumerate(values)]
    group = lambda arm: SimpleNamespace(  # noqa: E731
        arm=arm, label=arm, costs={"params_total": 1, "train_memory_bytes": 1, "activation_bytes": 1},
        speed=lambda: 1.0, measured=lambda: {"peak_rss_bytes": 1})
    ctx = SimpleNamespace(spec=spec, reference=spec.reference, measures={"cloze": results}, out=tmp_path,
                          arm_groups=lambda: [group(a) for a in acc])
    data = {d["arm"]: d for d in Cloze().section(ctx).data["arms"]}
    assert data["gpt-tok1e6"]["vs_reference_accuracy"] is None  # the 1M budget's reference itself
    assert data["bert-tok1e6"]["reference"] == "gpt-tok1e6"
    assert data["bert-tok1e6"]["vs_reference_accuracy"]["mean"] == pytest.approx(-0.09)


def test_t5_cloze_is_the_span_corruption_format_of_a_one_id_span():
    """The encoder-decoder is asked as it was pre-trained: the held-out id replaced by s_0 in the encoder's input,
    the decoder fed [start, s_0] and scored on the id (the target the objective writes after s_0)."""
    V = 300
    x = torch.randint(0, TEXT, (3, 16))
    pos = torch.tensor([2, 7, 13])
    encoder, decoder, targets = span_cloze_inputs(x, pos, V)
    s0, s1, start = V - 2, V - 3, V - 1  # archlab.objectives.span_corruption: counting down from the top
    for i, p in enumerate(pos.tolist()):
        assert encoder[i].tolist() == [*x[i, :p].tolist(), s0, *x[i, p + 1:].tolist()]
        assert decoder[i].tolist() == [start, s0, int(x[i, p])]
        assert targets[i].tolist() == [s0, int(x[i, p]), s1]

