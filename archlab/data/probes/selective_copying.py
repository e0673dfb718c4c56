"""``selective_copying``: MAD's selective copying (Poli et al. 2024, ``generate_copying_instance`` with
``selective=True``).

K ids drawn from [0, V - 2) are scattered, in order, among blank ids (V - 2) over the first S - K - 1 positions;
then a copy token (V - 1) and K blanks, at which the model writes the K ids back in order (as MAD: the answer
of the i-th blank is the i-th id, predicted from the sequence up to and including that blank).
Training and test are scored at the K answers.

Chance: 1 / (V - 2), a uniform guess over the ids to copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from archlab.data.probes.base import IGNORE, PROBES, ProbeTask, check_setting


@PROBES.register("selective_copying")
@dataclass(frozen=True)
class SelectiveCopying(ProbeTask):
    name = "selective_copying"
    title = "selective copying (MAD)"

    vocab_size: int = 16  # MAD: 16
    seq_len: int = 64  # MAD: 256
    copy_tokens: int = 8  # MAD: 16

    def check(self) -> None:
        check_setting(self, self.copy_tokens >= 1, "copy_tokens", "expected an integer >= 1")
        check_setting(self, self.seq_len > 2 * self.copy_tokens + 1, "seq_len",
                      f"expected > 2 * copy_tokens + 1 = {2 * self.copy_tokens + 1}")
        check_setting(self, self.vocab_size >= 3, "vocab_size", "expected >= 3 (an id, the blank, the copy token)")

    @property
    def chance(self) -> float:
        return 1.0 / len(self.answer_ids)

    @property
    def answer_ids(self) -> np.ndarray:
        return np.arange(self.vocab_size - 2)

    def sample(self, n: int, rng: np.random.Generator, split: str) -> tuple[np.ndarray, np.ndarray]:
        V, S, K = self.vocab_size, self.seq_len, self.copy_tokens
        blank, copy = V - 2, V - 1
        L = S - K - 1  # the scattered part: K ids among L - K blanks
        to_copy_NK = rng.integers(0, V - 2, size=(n, K))
        slots_NK = np.sort(rng.random((n, L)).argsort(axis=1)[:, :K], axis=1)  # where the ids sit, in order
        rows_NK = np.arange(n)[:, None]
        inputs_NS = np.full((n, S), blank, dtype=np.int64)
        inputs_NS[rows_NK, slots_NK] = to_copy_NK
        inputs_NS[:, L] = copy
        targets_NS = np.full((n, S), IGNORE, dtype=np.int64)
        targets_NS[:, L + 1:] = to_copy_NK  # the blanks after the copy token: the ids in order
        return inputs_NS, targets_NS
