"""Training windows (stateless, sharded by rank), evaluation windows and the unigram entropy."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import entropy

from archlab.data.batches import TokenBatches, eval_windows, unigram_entropy
from archlab.data.corpus import DataError

TOKENS = np.arange(10_000, dtype=np.uint16)  # token i sits at position i: a window shows its start


def test_get_returns_windows_of_the_array():
    batches = TokenBatches(TOKENS, seq_len=16, micro_batch_size=4, grad_accum=2, seed=3)
    x = batches.get(step=5, micro=1)
    assert x.shape == (4, 17) and x.dtype == torch.long
    starts = batches.starts(5, 1)
    assert torch.equal(x[:, 0], torch.from_numpy(starts))
    assert torch.equal(x, x[:, :1] + torch.arange(17))  # contiguous windows
    assert starts.min() >= 0 and starts.max() <= len(TOKENS) - 17


def test_batches_depend_only_on_seed_and_step():
    a = TokenBatches(TOKENS, 16, 4, 2, seed=3)
    b = TokenBatches(TOKENS, 16, 4, 2, seed=3)
    assert torch.equal(a.get(7, 1), b.get(7, 1))  # a fresh object (a resumed run) reads the same
    assert not torch.equal(a.get(7, 0), a.get(8, 0))
    assert not torch.equal(a.get(7, 0), TokenBatches(TOKENS, 16, 4, 2, seed=4).get(7, 0))


def test_ranks_split_the_global_batch_of_one_process():
    B, A, W = 3, 2, 2
    single = TokenBatches(TOKENS, 8, B, grad_accum=A * W, rank=0, world_size=1, seed=1)
    ranks = [TokenBatches(TOKENS, 8, B, A, rank=r, world_size=W, seed=1) for r in range(W)]
    for step in (0, 1, 9):
        for m in range(A):
            for r in range(W):
                assert torch.equal(ranks[r].get(step, m), single.get(step, m * W + r))
        rank_starts = [np.concatenate([ranks[r].starts(step, m) for m in range(A)]) for r in range(W)]
        assert set(rank_starts[0]).isdisjoint(rank_starts[1])


def test_uniform_over_every_valid_start():
    short = np.arange(20, dtype=np.uint16)
    batches = TokenBatches(short, seq_len=9, micro_batch_size=64, grad_accum=1)
    seen = set(np.concatenate([batches.starts(s, 0) for s in range(20)]))
    assert seen == set(range(11))  # 0 .. N - S - 1, the last start included


def test_bad_arguments_are_named():
    with pytest.raises(DataError, match=r"corpus too small for seq_len=64: the training split holds 50 tokens, "
                                         r"a window needs 65; lower train.seq_len or add data"):
        TokenBatches(TOKENS[:50], 64, 2, 1)
    with pytest.raises(ValueError, match="rank=2, world_size=2"):
        TokenBatches(TOKENS, 8, 2, 1, rank=2, world_size=2)
    with pytest.raises(ValueError, match=r"micro=2: must lie in \[0, grad_accum=2\)"):
        TokenBatches(TOKENS, 8, 2, 2).get(0, 2)
    with pytest.raises(ValueError, match="seed=-1"):
        TokenBatches(TOKENS, 8, 2, 1, seed=-1)


def test_eval_windows_are_strided_and_disjoint():
    batches = list(eval_windows(TOKENS, seq_len=15, batch_size=4, n_batches=5))
    assert len(batches) == 5 and all(b.shape == (4, 16) for b in batches)
    starts = torch.cat([b[:, 0] for b in batches]).numpy()
    assert np.all(np.diff(starts) == 500)  # 20 windows evenly over 10_000 tokens
    tokens_seen = torch.cat([b.flatten() for b in batches])
    assert len(set(tokens_seen.tolist())) == len(tokens_seen)  # no window overlaps another
    again = list(eval_windows(TOKENS, 15, 4, 5))
    assert all(torch.equal(a, b) for a, b in zip(batches, again))


def test_eval_ranks_take_every_world_size_th_batch():
    everything = list(eval_windows(TOKENS, 15, 4, 5))
    r0 = list(eval_windows(TOKENS, 15, 4, 5, rank=0, world_size=2))
    r1 = list(eval_windows(TOKENS, 15, 4, 5, rank=1, world_size=2))
    assert [len(r0), len(r1)] == [3, 2]
    assert all(torch.equal(a, b) for a, b in zip(r0 + r1, everything[0::2] + everything[1::2]))


def test_eval_windows_shrink_on_a_short_array():
    batches = list(eval_windows(TOKENS[:100], seq_len=15, batch_size=4, n_batches=10))
    assert [len(b) for b in batches] == [4, 2]  # only 100 // 16 = 6 disjoint windows fit
    with pytest.raises(DataError, match="validation split holds 10 tokens"):
        eval_windows(TOKENS[:10], 15, 4, 1)  # raises at the call, not at the first batch


def test_unigram_entropy_in_nats():
    assert unigram_entropy(np.array([3, 3, 3], dtype=np.uint16)) == 0.0
    assert unigram_entropy(np.arange(8).repeat(5)) == pytest.approx(math.log(8))
    rng = np.random.default_rng(0)
    tokens = rng.zipf(1.5, size=5000) % 300
    assert unigram_entropy(tokens) == pytest.approx(entropy(np.bincount(tokens)))
