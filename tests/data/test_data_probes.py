"""The probe tasks (archlab.data.probes): deterministic per seed, train and test disjoint, answers where the task
says, and chance what the task says (a uniform guess over the answer ids scores it)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import binomtest

from archlab.data.probes import IGNORE, PROBES, probe_task
from archlab.errors import RecipeError

TASKS = ["mqar", "in_context_recall", "noisy_recall", "selective_copying"]


def test_the_registry_holds_every_task():
    assert PROBES.names() == sorted(TASKS)


@pytest.mark.parametrize("name", TASKS)
def test_deterministic_per_seed_and_train_test_disjoint(name):
    task = probe_task(name)
    a, b = task.generate(64, 3, "test"), task.generate(64, 3, "test")
    assert torch.equal(a.inputs_NS, b.inputs_NS) and torch.equal(a.targets_NS, b.targets_NS)
    assert a.inputs_NS.shape == (64, task.seq_len) and a.inputs_NS.dtype == torch.long
    assert int(a.inputs_NS.min()) >= 0 and int(a.inputs_NS.max()) < task.vocab_size
    assert not torch.equal(a.inputs_NS, task.generate(64, 4, "test").inputs_NS)
    train = {tuple(r) for r in task.generate(2048, 3, "train").inputs_NS.tolist()}
    assert not train & {tuple(r) for r in a.inputs_NS.tolist()}


@pytest.mark.parametrize("name", TASKS)
def test_a_uniform_guess_over_the_answer_ids_scores_chance(name):
    task = probe_task(name)
    test = task.generate(4000, 0, "test")
    answers_M = test.targets_NS[test.targets_NS != IGNORE].numpy()
    assert np.isin(answers_M, task.answer_ids).all()  # every answer is one of the ids chance is counted over
    guess_M = np.random.default_rng(1).choice(task.answer_ids, size=answers_M.shape)
    ci = binomtest(int((guess_M == answers_M).sum()), len(answers_M)).proportion_ci(0.999, method="wilson")
    assert ci.low <= task.chance <= ci.high
    assert task.chance == pytest.approx(1 / len(task.answer_ids))


def test_mqar_pairs_then_queries_from_disjoint_halves():
    task = probe_task("mqar", {"vocab_size": 256, "seq_len": 128, "kv_pairs": 8})
    s = task.generate(200, 0, "test")
    V, K = 256, 8
    for x, y in zip(s.inputs_NS.tolist(), s.targets_NS.tolist()):
        keys, values = x[0:2 * K:2], x[1:2 * K:2]
        assert len(set(keys)) == K and all(1 <= k < V // 2 for k in keys)
        assert len(set(values)) == K and all(V // 2 <= v < V for v in values)
        scored = [i for i, t in enumerate(y) if t != IGNORE]
        assert len(scored) == K and min(scored) >= 2 * K  # every key queried once, after the pairs
        assert all(y[i] == values[keys.index(x[i])] for i in scored)  # the answer: the queried key's value
    # Zoology's power law: short gaps are more likely than long ones
    gaps = (s.targets_NS != IGNORE).nonzero()[:, 1] - 2 * K
    assert (gaps < 16).float().mean() > (gaps >= 96).float().mean()


@pytest.mark.parametrize("name", ["in_context_recall", "noisy_recall"])
def test_recall_answer_is_the_value_the_probed_key_had(name):
    task = probe_task(name)
    test, train = task.generate(200, 0, "test"), task.generate(20, 0, "train")
    n_kv = task.vocab_size - 1 - task.noise_vocab
    for x, y in zip(test.inputs_NS.tolist(), test.targets_NS.tolist()):
        assert x[-2] == task.vocab_size - 1 and x[-1] < n_kv // 2  # copy token, then the probed key
        pairs = {x[i]: x[i + 1] for i in range(0, len(x) - 2, 2) if x[i] < n_kv // 2}
        assert y[:-1] == [IGNORE] * (len(y) - 1) and y[-1] == pairs[x[-1]]
    # as MAD: a training sequence is scored at every position (the next id)
    assert torch.equal(train.targets_NS[:, :-1], train.inputs_NS[:, 1:])
    if task.frac_noise:
        noise = (test.inputs_NS[:, :-2] >= n_kv).float().mean()
        assert 0.5 * task.frac_noise < noise < 1.5 * task.frac_noise


def test_selective_copying_writes_back_the_scattered_ids_in_order():
    task = probe_task("selective_copying", {"seq_len": 48, "copy_tokens": 6})
    blank, copy = task.vocab_size - 2, task.vocab_size - 1
    for x, y in zip(*(t.tolist() for t in (lambda s: (s.inputs_NS, s.targets_NS))(task.generate(100, 0, "test")))):
        L = 48 - 6 - 1
        assert x[L] == copy and x[L + 1:] == [blank] * 6
        assert y[L + 1:] == [t for t in x[:L] if t != blank] and y[:L + 1] == [IGNORE] * (L + 1)


@pytest.mark.parametrize("name,settings,message", [
    ("mqar", {"seq_len": 30, "kv_pairs": 8}, "probe mqar: seq_len=30: expected an even length >= 4 * kv_pairs"),
    ("mqar", {"vocab_size": 10, "kv_pairs": 8}, "probe mqar: vocab_size=10: expected >= 2 * kv_pairs + 2"),
    ("mqar", {"kv_pair": 8}, "probe mqar: unknown settings ['kv_pair']; valid: vocab_size"),
    ("noisy_recall", {"noise_vocab": 0}, "probe noisy_recall: noise_vocab=0: expected >= 1 noise id"),
    ("selective_copying", {"seq_len": 16}, "probe selective_copying: seq_len=16: expected > 2 * copy_tokens + 1"),
    ("selective_copying", {"copy_tokens": "8"}, "probe selective_copying: copy_tokens='8': expected a number"),
    ("recall", {}, "probe 'recall': unknown; valid: in_context_recall"),
])
def test_bad_settings_fail_naming_the_key(name, settings, message):
    with pytest.raises(RecipeError) as e:
        probe_task(name, settings)
    assert message in str(e.value)
