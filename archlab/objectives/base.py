"""What every training objective states about itself, so that the trainer, evaluation, the benchmarks
and the cost model ask it instead of slicing token windows themselves.

Shape legend: B batch, S sequence (the model's input length), W = S + ``ahead`` window length, V vocabulary.

An objective is one class registered in :data:`OBJECTIVES` under the name a recipe gives as
``train.objective``. Each carries:

- ``Config``: its options, the dataclass ``train.objective.type`` chooses (a subclass of
  ``archlab.config.schema.ObjectiveConfig``: mtp's ``weight``), so a key of another objective is unknown;
  ``options``: the other ``train`` keys it reads (``init_from``, ``upcycle``: ``archlab.config.options`` refuses
  a recipe that sets one only other objectives read); ``validate(cfg)``: its rules on the recipe
  (``archlab.errors.fail``);
- ``ahead(m)``: how many ids past the S inputs one training window holds (causal LM: 1, the next
  token; masked LM: 0); the batches are windows of S + ahead ids (``archlab.data.TokenBatches``);
- ``reserved_ids(cfg)``: ids at the top of the vocabulary the objective uses itself and the tokenizer
  must never produce (masked LM: 1, its mask id; span corruption: its start id and sentinels); the data
  layer trains the tokenizer without them;
- ``split(x_BW)``: the model's inputs and targets of a window: the one place the shift is written;
- ``prepare_data(cfg)``, ``build_model(cfg)``, ``train_batches(data, rank, world_size)`` and
  ``eval_batches(...)``: the run's data, model and windows (by default the token data, the recipe's model and
  token windows; fine-tuning: a labelled task and a pre-trained model with a classification head);
- ``loss(model, x_BW, step=, micro=)``: a :class:`Loss` (what back-propagates, and its named parts) of one
  training window through the (possibly wrapped) model: the trainer's micro-step, the benchmarks' step and
  the cost model's measured step all call it. ``step`` and ``micro`` (which of the step's micro batches:
  ``micro * world_size + rank``) seed whatever randomness the objective draws (masked LM: which tokens it
  masks), so that a resumed run draws the same;
- ``eval_sums(model, x_BS1, index=)``: the sums (``eval_keys``: causal LM (summed loss, counted targets))
  of a validation window of S + 1 ids on the model's logits (``index``: the window batch's number, for an
  objective that draws), and ``eval_row(sums)``: the validation row's numbers from the sums over all
  windows. Rows name the metric so that losses of different objectives are never compared by accident
  (causal LM: ``loss``, ``ppl``; masked LM: ``metric: mlm``, ``mlm_loss``, ``mlm_accuracy``), its loss under
  ``eval_loss_key``;
- ``forward_flops(cfg, S)`` and ``saved_bytes(s, loss, checkpointing)``: what it adds to the model's
  matmul FLOPs per input token and to the bytes kept for backward (the LM head and the loss), read by
  ``archlab.costs``.

A new objective is one module in this package and its import in ``archlab/objectives/__init__.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from archlab.config.schema import OBJECTIVES, ObjectiveConfig
from archlab.data import TokenBatches, eval_windows, prepare_data
from archlab.model.build import build_model
from archlab.nn.loss import IGNORE_INDEX, lm_loss


@dataclass
class Loss:
    """One training window's loss: ``total`` back-propagates; ``main`` is the objective's reported loss
    (causal LM: next-token cross-entropy); ``aux`` the MoE balancing terms; ``parts`` any further named
    terms, each already a scalar (e.g. ``mtp_loss``: the multi-token-prediction modules' mean loss)."""

    main: Tensor
    aux: Tensor
    parts: dict[str, Tensor] = field(default_factory=dict)
    total: Tensor = None  # main + aux + the weighted parts (the objective says how)

    def __post_init__(self):
        if self.total is None:
            self.total = self.main + self.aux


class Objective:
    """One training objective a recipe can name (``train.objective``). Class facts need no instance."""

    name: ClassVar[str]
    Config: ClassVar[type] = ObjectiveConfig  # its options under train.objective (a subclass adds its own keys)
    options: ClassVar[frozenset[str]] = frozenset()  # the train keys besides train.objective it reads
    eval_metric: ClassVar[str] = "next-token cross-entropy (nats)"
    eval_keys: ClassVar[tuple[str, ...]] = ("loss", "count")  # what eval_sums returns, in order
    eval_loss_key: ClassVar[str] = "loss"  # the validation row's loss (the run summary's final_val_<key>)

    @classmethod
    def validate(cls, cfg: Any) -> None:
        """The rules on the recipe (``cfg.model``, ``cfg.train``) that this objective needs."""

    @classmethod
    def ahead(cls, m: Any) -> int:
        """Ids past the S inputs in one training window."""
        return 1

    @classmethod
    def reserved_ids(cls, cfg: Any) -> int:
        """Ids at the top of the vocabulary (``vocab_size - reserved ...``) the objective uses itself, for the
        recipe ``cfg`` (its ``model`` and ``train`` nodes)."""
        return 0

    @classmethod
    def split(cls, x_BW: Tensor, ahead: int) -> tuple[Tensor, Tensor]:
        """(inputs (B, S), targets (B, S + ahead - 1)) of a window (B, S + ahead): targets are the ids after
        the first, so ``targets[:, :S]`` is each input's next token."""
        return x_BW[:, :x_BW.shape[1] - ahead], x_BW[:, 1:]

    def __init__(self, cfg: Any):
        """``cfg``: the full recipe (``model`` and ``train`` nodes)."""
        self.t, self.m = cfg.train, cfg.model
        self.window_ahead = self.ahead(self.m)  # ids past the S inputs in one training window

    def prepare_data(self, cfg: Any, progress=None):
        """The run's data (``archlab.data.prepare_data``: the tokenizer and the token ids of both splits);
        ``progress``, if given, is told each stage of a cache being built."""
        return prepare_data(cfg, progress=progress, reserved=self.reserved_ids(cfg))

    def build_model(self, cfg: Any) -> nn.Module:
        """The model the trainer trains (``archlab.model.build_model``: the recipe's, freshly initialised)."""
        return build_model(cfg)

    def train_batches(self, data: Any, rank: int, world_size: int):
        """Training windows: ``get(step, micro)`` -> (B, S + ahead) and ``global_batch_size``."""
        t = self.t
        return TokenBatches(data.train, t.seq_len, t.micro_batch_size, t.grad_accum, rank, world_size, t.seed,
                            ahead=self.window_ahead)

    def eval_batches(self, data: Any, seq_len: int, batch_size: int, n_batches: int, rank: int, world_size: int):
        """Validation windows (b, seq_len + 1) of this rank (``archlab.data.eval_windows``)."""
        return eval_windows(data.val, seq_len, batch_size, n_batches, rank, world_size)

    def loss(self, model: nn.Module, x_BW: Tensor, *, step: int = 0, micro: int = 0) -> Loss:
        raise NotImplementedError

    def logits_loss(self, model: nn.Module, x_BW: Tensor, *, step: int = 0, micro: int = 0) -> Tensor:
        """The unfused reference of :meth:`loss` (main + aux): the same inputs and targets, the cross-entropy
        on the (B, S, V) logits (``archlab.costs.measure``'s ``loss="logits"``)."""
        raise ValueError(f"train.objective={self.name}: its loss is fused only (no reference on the logits); "
                         "use loss='fused'")

    @torch.no_grad()
    def eval_sums(self, model: nn.Module, x_BS1: Tensor, *, index: int = 0) -> tuple[Tensor, int]:
        """(summed next-token cross-entropy over the window, number of targets): the main model's
        validation loss, on its logits (the trainer's evaluation)."""
        inputs, targets = self.split(x_BS1, 1)
        logits = model(inputs).logits
        return lm_loss(logits, targets, reduction="sum"), targets.numel()

    @classmethod
    def eval_row(cls, sums: dict[str, float]) -> dict[str, Any]:
        """The validation row's numbers from the sums of every window (``eval_keys``)."""
        loss = sums["loss"] / sums["count"]
        return {"loss": loss, "ppl": math.exp(min(loss, 50.0)), "eval_tokens": int(sums["count"])}

    @classmethod
    def forward_flops(cls, cfg: Any, seq_len: int) -> dict[str, float]:
        """Forward matmul FLOPs per input token this objective adds to the model's blocks, by component."""
        raise NotImplementedError

    @classmethod
    def saved_bytes(cls, s: Any, loss: str, checkpointing: str, block_bytes: Any = None) -> dict[str, float]:
        """Bytes kept for backward by the LM head and the loss (and any module only this objective runs);
        ``block_bytes(layer)``: what one block built as ``layer`` keeps in this checkpointing mode (the cost
        model's per-layer formula, for a block outside the stack such as an MTP module's)."""
        raise NotImplementedError


def scored_targets(logits_BSV: Tensor, targets_BS: Tensor) -> tuple[Tensor, Tensor, int]:
    """(summed cross-entropy, correct argmax predictions, counted targets) over the targets that are not -100:
    the validation sums of an objective scored on chosen positions (masked LM, span corruption)."""
    counted = targets_BS != IGNORE_INDEX
    correct = (logits_BSV.argmax(-1) == targets_BS)[counted].sum()
    return lm_loss(logits_BSV, targets_BS, reduction="sum"), correct, int(counted.sum())


def accuracy_row(metric: str, prefix: str, sums: dict[str, float]) -> dict[str, Any]:
    """The validation row of :func:`scored_targets`' sums: ``metric``, ``<prefix>_loss``, ``<prefix>_accuracy``."""
    n = sums["count"]
    return {"metric": metric, f"{prefix}_loss": sums["loss"] / n, f"{prefix}_accuracy": sums["correct"] / n,
            "eval_tokens": int(n)}


def objective_type(node: Any) -> str:
    """The objective's name of a ``train.objective`` node (its ``type``; a bare name, as older run folders'
    saved recipes write it, is itself)."""
    if isinstance(node, str):
        return node
    return str(node["type"] if isinstance(node, dict) else node.type)


def objective_class(name: str) -> type[Objective]:
    return OBJECTIVES.get(name)


def objective_name(cfg: Any, objective: str | None = None) -> str:
    """``objective``, else a full recipe's ``train.objective``, else what a model config implies (``mlm``
    for an encoder, ``mtp`` when it has multi-token-prediction modules, else ``causal_lm``)."""
    if objective is not None:
        return objective
    train = getattr(cfg, "train", None) if not hasattr(cfg, "d_model") else None
    if train is not None and train.get("objective"):
        return objective_type(train.objective)
    model = cfg.model if train is not None else cfg
    kind = getattr(model, "type", "decoder")
    if kind in ("encoder", "encoder_decoder"):
        return "mlm" if kind == "encoder" else "span_corruption"
    return "mtp" if getattr(model, "mtp_depth", 0) else "causal_lm"
