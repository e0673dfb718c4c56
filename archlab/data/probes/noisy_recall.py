"""``noisy_recall``: MAD's noisy in-context recall (Poli et al. 2024): in-context recall
(:mod:`.in_context_recall`) where each pair is, with probability ``frac_noise``, two ids of a separate noise
vocabulary instead; the model must recall through the noise. MAD's defaults: vocabulary 32 of which 16 noise ids,
20% noise.

Chance: 1 / |values|, a uniform guess over the value ids.
"""

from __future__ import annotations

from dataclasses import dataclass

from archlab.data.probes.base import PROBES
from archlab.data.probes.in_context_recall import RecallTask


@PROBES.register("noisy_recall")
@dataclass(frozen=True)
class NoisyRecall(RecallTask):
    name = "noisy_recall"
    title = "noisy in-context recall (MAD)"

    vocab_size: int = 32
    noise_vocab: int = 16
    frac_noise: float = 0.2
