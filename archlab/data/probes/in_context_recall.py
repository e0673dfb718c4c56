"""``in_context_recall``: MAD's in-context recall (Poli et al. 2024, ``generate_in_context_recall_instance``).

A sequence of S/2 - 1 key-value pairs over a small vocabulary (keys [0, n/2), values [n/2, n) with n = V - 1 -
noise ids); a key keeps its value within a sequence (a new key draws one), so keys repeat with the same value.
Then a copy token (id V - 1), a key that was presented and its value: the answer, scored at the key's position.
As in MAD, a training sequence is scored at every position (next-token prediction: the values of repeated keys are
the learnable part) and a test sequence at the answer only. ``frac_noise`` > 0 replaces each pair, with that
probability, by two ids from the noise vocabulary [n, n + noise_vocab) (MAD's noisy recall: :mod:`.noisy_recall`).

Chance: 1 / |values|, a uniform guess over the value ids.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from archlab.data.probes.base import IGNORE, PROBES, ProbeTask, check_setting


@dataclass(frozen=True)
class RecallTask(ProbeTask):
    """MAD's in-context recall with ``noise_vocab`` noise ids used with probability ``frac_noise`` per pair."""

    vocab_size: int = 16
    seq_len: int = 64
    noise_vocab: int = 0
    frac_noise: float = 0.0

    def check(self) -> None:
        check_setting(self, self.seq_len % 2 == 0 and self.seq_len >= 4, "seq_len", "expected an even length >= 4")
        check_setting(self, 0 <= self.frac_noise < 1, "frac_noise", "expected a fraction in [0, 1)")
        check_setting(self, self.noise_vocab >= (1 if self.frac_noise > 0 else 0), "noise_vocab",
                      "expected >= 1 noise id when frac_noise > 0 (0 otherwise allowed)")
        check_setting(self, self.vocab_size - 1 - self.noise_vocab >= 2, "vocab_size",
                      "expected >= noise_vocab + 3 (a key, a value and the copy token)")

    @property
    def _kv_ids(self) -> int:
        return self.vocab_size - 1 - self.noise_vocab

    @property
    def chance(self) -> float:
        return 1.0 / len(self.answer_ids)

    @property
    def answer_ids(self) -> np.ndarray:
        return np.arange(self._kv_ids // 2, self._kv_ids)

    def sample(self, n: int, rng: np.random.Generator, split: str) -> tuple[np.ndarray, np.ndarray]:
        V, S, n_kv = self.vocab_size, self.seq_len, self._kv_ids
        P = S // 2 - 1  # pairs before the copy token
        keys = n_kv // 2  # key ids [0, keys), value ids [keys, n_kv)
        key_NP = rng.integers(0, keys, size=(n, P))
        table_NK = rng.integers(keys, n_kv, size=(n, keys))  # each key's value in each sequence
        value_NP = np.take_along_axis(table_NK, key_NP, axis=1)
        pairs_NP2 = np.stack([key_NP, value_NP], axis=-1)
        if self.frac_noise > 0:
            noise_NP = rng.random((n, P)) < self.frac_noise
            noise_NP[np.arange(n), rng.integers(0, P, size=n)] = False  # at least one pair (as MAD)
            pairs_NP2 = np.where(noise_NP[..., None], rng.integers(n_kv, n_kv + self.noise_vocab, (n, P, 2)),
                                 pairs_NP2)
        else:
            noise_NP = np.zeros((n, P), dtype=bool)
        # the probe: one of the presented keys (not noise), uniformly over the distinct keys (as MAD)
        presented_NK = np.zeros((n, keys), dtype=bool)
        rows_N = np.arange(n)
        presented_NK[np.repeat(rows_N, P)[~noise_NP.ravel()], key_NP[~noise_NP]] = True
        probe_key_N = np.where(presented_NK, rng.random((n, keys)), -1.0).argmax(axis=1)
        probe_value_N = table_NK[rows_N, probe_key_N]
        full = np.concatenate([pairs_NP2.reshape(n, 2 * P), np.full((n, 1), V - 1), probe_key_N[:, None],
                               probe_value_N[:, None]], axis=1)  # (N, S + 1)
        inputs_NS = full[:, :-1]
        if split == "train":
            return inputs_NS, full[:, 1:].copy()
        targets_NS = np.full((n, S), IGNORE, dtype=np.int64)
        targets_NS[:, -1] = probe_value_N
        return inputs_NS, targets_NS


@PROBES.register("in_context_recall")
@dataclass(frozen=True)
class InContextRecall(RecallTask):
    name = "in_context_recall"
    title = "in-context recall (MAD)"
