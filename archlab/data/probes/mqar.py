"""``mqar``: multi-query associative recall (Arora et al. 2023, Zoology), generated as Zoology's ``_mqar``.

Each sequence opens with K key-value pairs (``k1 v1 k2 v2 ...``: keys distinct ids from [1, V/2), values distinct
ids from [V/2, V), the two halves disjoint); every key is then queried once later in the sequence, at an even
offset 2g after the pairs, the gaps g drawn without replacement with probability ~ g^(power_a - 1) (Zoology's
power law: short gaps more likely); the answer is the key's value, scored at the query's position (the model
predicts the id after the query). The other positions are random ids from the whole vocabulary. Loss and
accuracy are taken at the K answer positions only, in training and test alike.

Chance: 1 / (V/2), a uniform guess over the value half.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from archlab.data.probes.base import IGNORE, PROBES, ProbeTask, check_setting, distinct


@PROBES.register("mqar")
@dataclass(frozen=True)
class MQAR(ProbeTask):
    name = "mqar"
    title = "multi-query associative recall (Zoology)"

    vocab_size: int = 256  # Zoology: 8192 (smaller here for the CPU: an 8192-way output per position)
    seq_len: int = 64  # Zoology: 64, 128, 256
    kv_pairs: int = 4  # Zoology: 4, 8, 16 (with 64, 128, 256)
    power_a: float = 0.01  # Zoology's gap power law; 1.0: uniform gaps

    def check(self) -> None:
        check_setting(self, self.kv_pairs >= 1, "kv_pairs", "expected an integer >= 1")
        check_setting(self, self.seq_len % 2 == 0 and self.seq_len >= 4 * self.kv_pairs, "seq_len",
                      f"expected an even length >= 4 * kv_pairs = {4 * self.kv_pairs} (pairs, then queries)")
        check_setting(self, self.vocab_size // 2 - 1 >= self.kv_pairs, "vocab_size",
                      f"expected >= 2 * kv_pairs + 2 = {2 * self.kv_pairs + 2} (kv_pairs keys in [1, V/2))")
        check_setting(self, 0 < self.power_a <= 1, "power_a", "expected a number in (0, 1]")

    @property
    def chance(self) -> float:
        return 1.0 / len(self.answer_ids)

    @property
    def answer_ids(self) -> np.ndarray:
        return np.arange(self.vocab_size // 2, self.vocab_size)

    def sample(self, n: int, rng: np.random.Generator, split: str) -> tuple[np.ndarray, np.ndarray]:
        V, S, K = self.vocab_size, self.seq_len, self.kv_pairs
        keys_NK = distinct(rng, n, K, 1, V // 2)
        values_NK = distinct(rng, n, K, V // 2, V)
        inputs_NS = rng.integers(0, V, size=(n, S))
        targets_NS = np.full((n, S), IGNORE, dtype=np.int64)
        inputs_NS[:, 0:2 * K:2], inputs_NS[:, 1:2 * K:2] = keys_NK, values_NK
        # gaps without replacement, p(g) ~ g^(a-1) over g in [0, space) (Gumbel top-k = successive sampling)
        space = (S - 2 * K) // 2
        log_p = (self.power_a - 1) * np.log(np.arange(1, space + 1))
        gaps_NK = np.argsort(-(log_p + rng.gumbel(size=(n, space))), axis=1)[:, :K]
        rows_NK = np.arange(n)[:, None]
        query_NK = 2 * K + 2 * gaps_NK
        inputs_NS[rows_NK, query_NK] = keys_NK
        targets_NS[rows_NK, query_NK] = values_NK
        return inputs_NS, targets_NS
