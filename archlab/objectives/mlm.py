"""Masked-language modelling (BERT, Devlin et al. 2019, sec. 3.1): an encoder (``model.type: encoder``)
predicts a random share of its input tokens from both sides. Windows of S ids (``ahead`` 0: no shift).

Of the S positions of a window each is selected with probability p = ``train.objective.probability`` (BERT:
0.15); a selected position's input is replaced by the mask id with probability 0.8, by a random id with
0.1, and kept with 0.1, and its target is the original id; every other target is -100 (ignored), so the
loss is the mean cross-entropy over the selected positions. A window with no selected position (tiny
batches only) gets its most likely one (the smallest draw) selected, so that the loss is never empty.

The mask id is the last row of the vocabulary, ``model.vocab_size - 1`` (``reserved_ids`` = 1): the data
layer trains the BPE tokenizer with ``vocab_size - 1`` ids (the byte tokenizer's 257 need
``vocab_size >= 258``; a tokenizer file must leave the last row free), so the mask id never occurs in
the text, and the tokenizers and token caches of every causal recipe stay as they were. Random
replacements are drawn among the other ``vocab_size - 1`` ids.

The draws come from a ``torch.Generator`` on the CPU seeded by (``train.seed``, step, micro batch): the
same batch of the same step is masked the same way on every device and after a resume. Validation
windows (S + 1 ids, shared with the other objectives) drop their last id and are masked by a generator
seeded by the window batch's number, the same at every evaluation.

The LM head runs on every position (as HF's ``BertForMaskedLM``), the unselected ones ignored by the
fused loss: its FLOPs and saved bytes are per token, whatever the draw.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from archlab.config.schema import ObjectiveConfig
from archlab.errors import fail
from archlab.nn.heads import HeadTransform
from archlab.nn.loss import IGNORE_INDEX, lm_loss
from archlab.objectives.base import OBJECTIVES, Loss, Objective, accuracy_row, scored_targets
from archlab.objectives.causal_lm import head_loss_bytes

MASK_SHARE, RANDOM_SHARE = 0.8, 0.1  # of the selected positions; the remaining 0.1 keep their id
TRAIN_STREAM, EVAL_STREAM = 0, 1  # generator streams: training batches, validation batches


def mask_id(m: Any) -> int:
    """The mask token's id: the vocabulary's last row, which no tokenizer id reaches."""
    return int(m.vocab_size) - 1


def draw_generator(seed: int, stream: int, step: int, micro: int) -> torch.Generator:
    """A CPU generator seeded by (seed, stream, step, micro), mixed by numpy's SeedSequence."""
    state = np.random.SeedSequence([seed, stream, step, micro]).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator().manual_seed(int(state) & (2**63 - 1))


def mask_tokens(x_BS: Tensor, probability: float, mask: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """(inputs, targets) (B, S) of the ids ``x_BS``: BERT's 80/10/10 corruption of the selected positions,
    targets the original ids there and -100 elsewhere. Random ids lie in [0, mask)."""
    B, S = x_BS.shape
    u_BS = torch.rand(B, S, generator=generator)
    action_BS = torch.rand(B, S, generator=generator)
    random_BS = torch.randint(0, mask, (B, S), generator=generator)
    selected = u_BS < probability
    if not selected.any():
        selected.view(-1)[u_BS.argmin()] = True
    to_mask = selected & (action_BS < MASK_SHARE)
    to_random = selected & (action_BS >= MASK_SHARE) & (action_BS < MASK_SHARE + RANDOM_SHARE)
    dev = x_BS.device
    inputs = torch.where(to_mask.to(dev), torch.full_like(x_BS, mask), x_BS)
    inputs = torch.where(to_random.to(dev), random_BS.to(dev), inputs)
    targets = torch.where(selected.to(dev), x_BS, torch.full_like(x_BS, IGNORE_INDEX))
    return inputs, targets


@dataclass
class MLMConfig(ObjectiveConfig):
    type: str = "mlm"
    # share of positions selected for prediction (BERT: 0.15; of them 80% masked, 10% a random id, 10% kept)
    probability: float = 0.15
    renamed: ClassVar[dict[str, str]] = {"mlm_probability": "probability"}  # the flat train key before this node


@OBJECTIVES.register("mlm")
class MaskedLM(Objective):
    """Cross-entropy on the selected positions of an encoder's input (BERT's masked LM)."""

    name = "mlm"
    Config = MLMConfig
    eval_metric = "mlm: masked-token cross-entropy (nats) and accuracy on the selected positions"
    eval_keys = ("loss", "correct", "count")
    eval_loss_key = "mlm_loss"

    @classmethod
    def validate(cls, cfg: Any) -> None:
        if cfg.model.type != "encoder":
            fail("train.objective", cls.name, f"masked-token prediction needs model.type=encoder "
                 f"(bidirectional attention); this recipe's model type is {cfg.model.type}")
        p = cfg.train.objective.probability
        if not 0.0 < p < 1.0:
            fail("train.objective.probability", p, "must lie in (0, 1) (BERT: 0.15)")

    @classmethod
    def ahead(cls, m: Any) -> int:
        return 0

    @classmethod
    def reserved_ids(cls, cfg: Any) -> int:
        return 1  # the mask id, the vocabulary's last row

    def select(self, x_BS: Tensor, stream: int, step: int, micro: int) -> tuple[Tensor, Tensor]:
        """(inputs, targets) of the ids ``x_BS`` with the draws of (stream, step, micro)."""
        generator = draw_generator(int(self.t.seed), stream, step, micro)
        return mask_tokens(x_BS, float(self.t.objective.probability), mask_id(self.m), generator)

    def loss(self, model: nn.Module, x_BW: Tensor, *, step: int = 0, micro: int = 0) -> Loss:
        inputs, targets = self.select(x_BW, TRAIN_STREAM, step, micro)
        out = model(inputs, targets=targets)
        return Loss(main=out.loss.float(), aux=out.aux_loss.float())

    def logits_loss(self, model: nn.Module, x_BW: Tensor, *, step: int = 0, micro: int = 0) -> Tensor:
        inputs, targets = self.select(x_BW, TRAIN_STREAM, step, micro)  # the same masks as :meth:`loss`
        out = model(inputs)
        return lm_loss(out.logits, targets) + out.aux_loss.float()

    @torch.no_grad()
    def eval_sums(self, model: nn.Module, x_BS1: Tensor, *, index: int = 0) -> tuple[Tensor, Tensor, int]:
        """(summed cross-entropy, correct argmax predictions, selected positions) of the window's first S ids."""
        inputs, targets = self.select(x_BS1[:, :-1], EVAL_STREAM, 0, index)
        return scored_targets(model(inputs).logits, targets)

    @classmethod
    def eval_row(cls, sums: dict[str, float]) -> dict[str, Any]:
        return accuracy_row("mlm", "mlm", sums)

    @classmethod
    def forward_flops(cls, cfg: Any, seq_len: int) -> dict[str, float]:
        transform = HeadTransform.forward_flops(cfg) if cfg.head_transform else 0.0
        return {"lm_head": 2.0 * cfg.d_model * cfg.vocab_size, "head_transform": transform}

    @classmethod
    def saved_bytes(cls, s: Any, loss: str, checkpointing: str, block_bytes: Any = None) -> dict[str, float]:
        if loss != "fused":
            raise ValueError(f"loss={loss!r}: masked-token prediction trains with the fused loss only")
        transform = HeadTransform.saved_bytes(s) if s.cfg.head_transform else 0.0
        return {"loss": float(head_loss_bytes(s, loss, bias=s.cfg.head_bias)), "head_transform": transform}
