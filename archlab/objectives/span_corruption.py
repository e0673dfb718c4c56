"""Span corruption (T5, Raffel et al. 2020, sec. 3.1.4): an encoder-decoder (``model.type: encoder_decoder``)
reads a text window with random spans replaced by sentinel ids and writes out the dropped spans, each behind
its sentinel. Windows of S ids (``ahead`` 0).

Of the S ids of a window, n = round(S * ``train.objective.noise_density``) (T5: 0.15) are noise, in
k = round(n / ``train.objective.mean_length``) spans (T5: 3); the window alternates non-noise and noise spans,
starting with non-noise, their lengths a uniformly random composition of S - n and of n into k positive
parts (T5's ``random_spans_noise_mask``). With N_i the non-noise and X_i the noise spans and s_i the i-th
sentinel:

    window          N_0 X_0 N_1 X_1 ... N_{k-1} X_{k-1}
    encoder input   N_0 s_0 N_1 s_1 ... N_{k-1} s_{k-1}          M = S - n + k ids
    targets         s_0 X_0 s_1 X_1 ... s_{k-1} X_{k-1}          T = n + k ids
    decoder input   start, targets[:-1]

n and k depend on S only, so every window of a batch has the same M and T: no padding, and T5's end-of-
sequence id is not needed (T = n + k always). The loss is the mean cross-entropy over the T targets
(the sentinels included, as T5's).

Reserved ids (``reserved_ids`` = k + 1, at the top of the vocabulary, which the tokenizer never produces): the
decoder's start id ``vocab_size - 1`` (T5 uses its pad id) and the sentinels s_i = ``vocab_size - 2 - i`` (T5's
``<extra_id_i>`` count down from the top the same way).

The draws come from a CPU generator seeded by (``train.seed``, step, micro batch) (masked LM's
:func:`archlab.objectives.mlm.draw_generator`): a resumed run corrupts the same batches the same way.
Validation windows drop their last id and are corrupted by the window batch's number, the same at every
evaluation. Validation rows say ``metric: span_corruption``, ``span_loss`` and ``span_accuracy`` (argmax on the
targets): never a causal-LM ``loss``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from archlab.config.schema import ObjectiveConfig
from archlab.errors import fail
from archlab.nn.loss import lm_loss
from archlab.objectives.base import OBJECTIVES, Loss, Objective, accuracy_row, scored_targets
from archlab.objectives.causal_lm import head_loss_bytes
from archlab.objectives.mlm import EVAL_STREAM, TRAIN_STREAM, draw_generator


def span_counts(seq_len: int, density: float, mean_length: float) -> tuple[int, int]:
    """(noise ids n, spans k) of a window of ``seq_len`` ids: T5's rounding, at least one of each and at most
    as many spans as either side has ids."""
    n = min(max(int(round(seq_len * density)), 1), seq_len - 1)
    k = max(int(round(n / mean_length)), 1)
    return n, min(k, n, seq_len - n)


def start_id(vocab_size: int) -> int:
    """The decoder's first input: the vocabulary's last row."""
    return int(vocab_size) - 1


def sentinel_ids(vocab_size: int, spans: int) -> Tensor:
    """s_0 ... s_{k-1}: counting down from ``vocab_size - 2``."""
    return int(vocab_size) - 2 - torch.arange(spans)


def _compositions(rows: int, total: int, parts: int, generator: torch.Generator) -> Tensor:
    """(rows, parts) positive integers summing to ``total``, each row a uniform random composition (the parts
    - 1 cut points drawn without replacement among the total - 1 gaps)."""
    gaps = torch.rand(rows, total - 1, generator=generator).argsort(dim=1)[:, :parts - 1] + 1
    cuts = torch.cat([torch.zeros(rows, 1, dtype=torch.long), gaps.sort(dim=1).values,
                      torch.full((rows, 1), total, dtype=torch.long)], dim=1)
    return cuts.diff(dim=1)


def noise_mask(rows: int, seq_len: int, noise: int, spans: int, generator: torch.Generator) -> Tensor:
    """(rows, seq_len) bool: ``noise`` ids in ``spans`` spans, alternating with non-noise, non-noise first."""
    lengths = torch.stack([_compositions(rows, seq_len - noise, spans, generator),
                           _compositions(rows, noise, spans, generator)], dim=2).flatten(1)  # (rows, 2k)
    is_noise = torch.tensor([False, True]).repeat(rows * spans)  # every row's segments' kinds, in order
    return is_noise.repeat_interleave(lengths.flatten()).view(rows, seq_len)  # each row's lengths sum to seq_len


def corrupt(x_BS: Tensor, noise_BS: Tensor, vocab_size: int, spans: int) -> tuple[Tensor, Tensor, Tensor]:
    """(encoder input (B, M), decoder input (B, T), targets (B, T)) of the windows ``x_BS`` and their noise."""
    B, S = x_BS.shape
    noise = noise_BS.to(x_BS.device)
    before = torch.cat([torch.zeros_like(noise[:, :1]), noise[:, :-1]], dim=1)  # the previous id was noise
    span_start = noise & ~before  # the first id of each noise span
    plain_start = ~noise & (before | (torch.arange(S, device=x_BS.device) == 0))  # ... of each non-noise span
    sentinels = sentinel_ids(vocab_size, spans).to(x_BS.device)
    span_index = (span_start.cumsum(1) - 1).clamp(min=0)  # which span an id belongs to
    plain_index = (plain_start.cumsum(1) - 1).clamp(min=0)
    encoder = torch.where(span_start, sentinels[span_index], x_BS)[~noise | span_start].view(B, -1)
    targets = torch.where(plain_start, sentinels[plain_index], x_BS)[noise | plain_start].view(B, -1)
    decoder = torch.cat([torch.full_like(targets[:, :1], start_id(vocab_size)), targets[:, :-1]], dim=1)
    return encoder, decoder, targets


@dataclass
class SpanCorruptionConfig(ObjectiveConfig):
    type: str = "span_corruption"
    noise_density: float = 0.15  # share of a window's ids dropped as noise (T5: 0.15)
    mean_length: float = 3.0  # mean noise span length (T5: 3)
    # the flat train keys before this node
    renamed: ClassVar[dict[str, str]] = {"span_noise_density": "noise_density", "span_mean_length": "mean_length"}


@OBJECTIVES.register("span_corruption")
class SpanCorruption(Objective):
    """Cross-entropy of the dropped spans, written out by the decoder behind their sentinels (T5)."""

    name = "span_corruption"
    Config = SpanCorruptionConfig
    eval_metric = "span_corruption: cross-entropy (nats) and accuracy on the decoder's targets (spans and sentinels)"
    eval_keys = ("loss", "correct", "count")
    eval_loss_key = "span_loss"

    @classmethod
    def validate(cls, cfg: Any) -> None:
        t, o = cfg.train, cfg.train.objective
        if cfg.model.type != "encoder_decoder":
            fail("train.objective", cls.name, "span corruption needs model.type=encoder_decoder (an encoder "
                 f"reads the corrupted text, a decoder writes the spans); this recipe's is {cfg.model.type}")
        if not 0.0 < o.noise_density < 0.5:
            fail("train.objective.noise_density", o.noise_density, "must lie in (0, 0.5) (T5: 0.15)")
        if o.mean_length < 1.0:
            fail("train.objective.mean_length", o.mean_length, "must be >= 1 (T5: 3)")
        if list(t.eval_context_multipliers) != [1]:
            fail("train.eval_context_multipliers", list(t.eval_context_multipliers), "span corruption evaluates "
                 "windows of train.seq_len ids only (its sentinel ids are counted for that length): set [1]")

    @classmethod
    def ahead(cls, m: Any) -> int:
        return 0

    @classmethod
    def reserved_ids(cls, cfg: Any) -> int:
        t, o = cfg.train, cfg.train.objective
        return 1 + span_counts(int(t.seq_len), float(o.noise_density), float(o.mean_length))[1]

    def lengths(self, seq_len: int) -> tuple[int, int]:
        """(encoder input M, targets T) of a window of ``seq_len`` ids."""
        n, k = span_counts(seq_len, float(self.t.objective.noise_density), float(self.t.objective.mean_length))
        return seq_len - n + k, n + k

    def corrupt(self, x_BS: Tensor, stream: int, step: int, micro: int) -> tuple[Tensor, Tensor, Tensor]:
        """(encoder input, decoder input, targets) of the windows ``x_BS`` with the draws of (stream, step, micro)."""
        B, S = x_BS.shape
        n, k = span_counts(S, float(self.t.objective.noise_density), float(self.t.objective.mean_length))
        generator = draw_generator(int(self.t.seed), stream, step, micro)
        return corrupt(x_BS, noise_mask(B, S, n, k, generator), int(self.m.vocab_size), k)

    def loss(self, model: nn.Module, x_BW: Tensor, *, step: int = 0, micro: int = 0) -> Loss:
        encoder, decoder, targets = self.corrupt(x_BW, TRAIN_STREAM, step, micro)
        out = model(encoder, decoder, targets=targets)
        return Loss(main=out.loss.float(), aux=out.aux_loss.float())

    def logits_loss(self, model: nn.Module, x_BW: Tensor, *, step: int = 0, micro: int = 0) -> Tensor:
        encoder, decoder, targets = self.corrupt(x_BW, TRAIN_STREAM, step, micro)  # the same spans as :meth:`loss`
        out = model(encoder, decoder)
        return lm_loss(out.logits, targets) + out.aux_loss.float()

    @torch.no_grad()
    def eval_sums(self, model: nn.Module, x_BS1: Tensor, *, index: int = 0) -> tuple[Tensor, Tensor, int]:
        """(summed cross-entropy, correct argmax predictions, targets) of the window's first S ids."""
        encoder, decoder, targets = self.corrupt(x_BS1[:, :-1], EVAL_STREAM, 0, index)
        return scored_targets(model(encoder, decoder).logits, targets)

    @classmethod
    def eval_row(cls, sums: dict[str, float]) -> dict[str, Any]:
        return accuracy_row("span_corruption", "span", sums)

    @classmethod
    def forward_flops(cls, cfg: Any, seq_len: int) -> dict[str, float]:
        """The LM head, per decoder token (``archlab.costs.flops`` weighs it by the targets per window token)."""
        return {"lm_head": 2.0 * cfg.d_model * cfg.vocab_size}

    @classmethod
    def saved_bytes(cls, s: Any, loss: str, checkpointing: str, block_bytes: Any = None) -> dict[str, float]:
        """The fused head and loss over the decoder's tokens (``s``: the decoder's shape)."""
        if loss != "fused":
            raise ValueError(f"loss={loss!r}: span corruption trains with the fused loss only")
        return {"loss": float(head_loss_bytes(s, loss))}
