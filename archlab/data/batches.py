"""Batches of token windows for training and evaluation, sharded over data-parallel ranks.

Legend: B micro batch size, S sequence length, A gradient-accumulation steps, W world size
(data-parallel ranks), N tokens in the array.

Training windows are stateless: the batch of optimizer step ``step`` is drawn from
``np.random.default_rng([seed, step])``, so resuming needs no data state, and W ranks with A
micro-steps each read exactly the windows that one process with W*A micro-steps would read.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import torch

from archlab.data.corpus import DataError


def check_length(tokens: np.ndarray, seq_len: int, name: str = "token array") -> None:
    """Raise :class:`DataError` when ``tokens`` cannot hold one window of ``seq_len + 1`` ids."""
    if len(tokens) < seq_len + 1:
        raise DataError(f"corpus too small for seq_len={seq_len}: the {name} holds {len(tokens)} tokens, "
                        f"a window needs {seq_len + 1}; lower train.seq_len or add data")


def _check_rank(rank: int, world_size: int) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank={rank}, world_size={world_size}: need 0 <= rank < world_size")


def _windows(tokens: np.ndarray, starts: np.ndarray, seq_len: int) -> torch.Tensor:
    """(len(starts), S+1) LongTensor of the windows ``tokens[start : start + S + 1]``."""
    idx = starts[:, None] + np.arange(seq_len + 1)[None, :]
    return torch.from_numpy(np.asarray(tokens[idx], dtype=np.int64))


class TokenBatches:
    """Random training windows: ``get(step, micro)`` -> LongTensor (B, S + ahead), ``ahead`` 1 by default.

    The objective (``archlab.objectives``) splits a window into inputs and targets (causal LM: inputs
    ``x[:, :-1]``, targets ``x[:, 1:]``); ``ahead`` is how many ids past the S inputs it needs (masked LM:
    0, its targets are its inputs' own ids). At each
    step, W*A*B window starts are drawn uniformly over the valid starts of ``tokens``; rank r at
    micro-step m takes the slice
    ``[(m*W + r)*B : (m*W + r + 1)*B]`` of them, so ranks never share a drawn window and the
    batch depends only on (seed, step, micro, rank, world_size).
    """

    def __init__(self, tokens: np.ndarray, seq_len: int, micro_batch_size: int, grad_accum: int,
                 rank: int = 0, world_size: int = 1, seed: int = 0, ahead: int = 1):
        if ahead < 0:
            raise ValueError(f"ahead={ahead}: the ids past the S inputs a window holds cannot be negative")
        check_length(tokens, seq_len + ahead - 1, "training split")
        _check_rank(rank, world_size)
        if micro_batch_size < 1 or grad_accum < 1:
            raise ValueError(f"micro_batch_size={micro_batch_size}, grad_accum={grad_accum}: both must be >= 1")
        if seed < 0:
            raise ValueError(f"seed={seed}: the data seed must be >= 0 (train.seed)")
        self.tokens = tokens
        self.seq_len = seq_len
        self.micro_batch_size = micro_batch_size
        self.grad_accum = grad_accum
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.ahead = ahead  # ids past the S inputs (the objective's: 1 = the next token)

    @property
    def global_batch_size(self) -> int:
        """Windows per optimizer step over all ranks: W * A * B."""
        return self.world_size * self.grad_accum * self.micro_batch_size

    def step_starts(self, step: int) -> np.ndarray:
        """(W*A*B,) window starts of optimizer step ``step``, shared by every rank."""
        n_starts = len(self.tokens) - self.seq_len - self.ahead + 1  # valid starts: 0 .. N - S - ahead
        rng = np.random.default_rng([self.seed, step])
        return rng.integers(0, n_starts, size=self.global_batch_size)

    def starts(self, step: int, micro: int) -> np.ndarray:
        """(B,) window starts of this rank at (step, micro)."""
        if not 0 <= micro < self.grad_accum:
            raise ValueError(f"micro={micro}: must lie in [0, grad_accum={self.grad_accum})")
        first = (micro * self.world_size + self.rank) * self.micro_batch_size
        return self.step_starts(step)[first:first + self.micro_batch_size]

    def get(self, step: int, micro: int = 0) -> torch.Tensor:
        """(B, S + ahead) LongTensor for this rank at optimizer step ``step``, micro-step ``micro``."""
        return _windows(self.tokens, self.starts(step, micro), self.seq_len + self.ahead - 1)


def eval_starts(n_tokens: int, seq_len: int, n_windows: int) -> np.ndarray:
    """Starts of up to ``n_windows`` non-overlapping windows of S+1 tokens, evenly strided over N."""
    n = min(n_windows, n_tokens // (seq_len + 1))
    stride = n_tokens // n  # >= S+1, so windows never overlap
    return np.arange(n, dtype=np.int64) * stride


def eval_windows(tokens: np.ndarray, seq_len: int, batch_size: int, n_batches: int,
                 rank: int = 0, world_size: int = 1) -> Iterator[torch.Tensor]:
    """Deterministic evaluation batches: an iterator of LongTensor (b, S+1), b <= batch_size.

    ``n_batches * batch_size`` non-overlapping windows evenly strided over ``tokens`` (fewer when the
    array is short; the last batch may be partial) form ``n_batches`` global batches; rank r takes
    batches r, r+W, r+2W... so ranks are disjoint and together cover what one process evaluates.
    Ranks may get unequal batch counts: reduce loss sums and token counts, not per-rank means.
    """
    check_length(tokens, seq_len, "validation split")
    _check_rank(rank, world_size)
    if batch_size < 1 or n_batches < 1:
        raise ValueError(f"batch_size={batch_size}, n_batches={n_batches}: both must be >= 1")
    starts = eval_starts(len(tokens), seq_len, n_batches * batch_size)
    batches = [starts[i:i + batch_size] for i in range(0, len(starts), batch_size)]

    def iterate() -> Iterator[torch.Tensor]:
        for b in batches[rank::world_size]:
            yield _windows(tokens, b, seq_len)

    return iterate()


def unigram_entropy(tokens: np.ndarray) -> float:
    """Entropy in nats/token of the token frequencies: the loss of the best context-free model.

    Token shards (``archlab.data.tokens.ShardedTokens``) carry their id counts (``unigram_counts``,
    counted once per shard and cached): exact over every id without another pass over the data.
    """
    counts = getattr(tokens, "unigram_counts", None)
    if counts is None:
        counts = np.bincount(np.asarray(tokens))
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())
