"""``mqar: {seq_lens, kv_pairs, vocab_size, power_a, arms, widths, layers, steps, batch, lr, test_answers,
seeds}``: multi-query associative recall (Arora et al. 2023, Zoology; ``archlab.data.probes.mqar``). Each listed
arm (default: all) is trained from scratch at each (sequence length, key-value pairs) setting, ``seq_lens`` and
``kv_pairs`` paired by position (Zoology: (64, 4), (128, 8), (256, 16); default (64, 4)), and each width (default
1000 steps of 128 sequences), and scored at the answer positions (``analysis.probe_measurement``). Zoology's
finding: attention solves MQAR at every width; a model whose state is fixed needs a state growing with the number
of pairs.
"""

from __future__ import annotations

from analysis.measurements.base import check_int, check_ints, register
from analysis.probe_measurement import TRAIN_DEFAULTS, TRAIN_KEYS, ProbeMeasurement
from archlab.data.probes import probe_task
from archlab.errors import RecipeError


@register
class MQAR(ProbeMeasurement):
    """Multi-query associative recall accuracy per arm, setting and width."""

    name = "mqar"
    title = "Multi-query associative recall (MQAR)"
    keys = TRAIN_KEYS + ("seq_lens", "kv_pairs", "vocab_size", "power_a")
    # 1000 steps of 128 sequences (~160 CPU s at (64, 4)): LLaMA-tiny attention reaches 0.98 there, but only 0.1-0.26
    # after 1000 steps of 32
    defaults = {**TRAIN_DEFAULTS, "batch": 128}
    intro = ("MQAR (Zoology): K key-value pairs, then each key queried once later in the sequence; the answer is its "
             "value (keys and values from disjoint halves of the vocabulary).")

    def tasks(self, settings: dict, where: str) -> list:
        check_ints(settings, "seq_lens", where)
        check_ints(settings, "kv_pairs", where)
        check_int(settings, "vocab_size", where, minimum=4)
        seq_lens, pairs = settings.get("seq_lens", [64]), settings.get("kv_pairs", [4])
        if len(seq_lens) != len(pairs):
            raise RecipeError(f"{where}.kv_pairs={pairs!r}: expected one per sequence length in seq_lens {seq_lens} "
                              "(paired by position, e.g. seq_lens: [64, 128], kv_pairs: [4, 8])")
        common = {k: settings[k] for k in ("vocab_size", "power_a") if k in settings}
        return [(f"S={s} K={k}", probe_task("mqar", {**common, "seq_len": s, "kv_pairs": k}))
                for s, k in zip(seq_lens, pairs)]
