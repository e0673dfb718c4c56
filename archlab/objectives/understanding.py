"""What the understanding objectives share (``train.objective``: ``tag``, ``span_qa``, ``bound``): a task of
:mod:`archlab.data.tasks` made from the recipe's Python corpus, a pre-trained trunk (``train.init_from``, as
``classify``) with the task's fresh head, and item windows for the trainer.

Shape legend: B batch, S sequence (``train.seq_len``), L label entries per item (tagging: S; span: 2;
classification: 1), N items.

A training window is an item's S input ids followed by its L labels, (B, S + L): micro batches are drawn from the
training items by (``train.seed``, step) as the classify objective draws its examples; validation reads the
first ``train.eval_batches`` batches of the val items in one fixed shuffled order (a sample across documents).
:meth:`UnderstandingObjective.item_scores` scores a split item by item (the test split after training; intervals
resample documents).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar, Iterator, Optional

import numpy as np
import torch
from torch import Tensor, nn

from archlab.checkpoints import WEIGHTS
from archlab.data import build_corpus
from archlab.data.splice import read_split_documents
from archlab.data.tasks import TASKS, Task, TaskData, task_data
from archlab.data.tasks.items import Items
from archlab.errors import fail
from archlab.model.classifier import load_pretrained
from archlab.objectives.base import Loss, Objective
from archlab.objectives.classify import pretrained_checkpoint, task_tokenizer


class ItemBatches:
    """Training micro batches (B, S + L) drawn with replacement from ``default_rng([seed, step])``, rank r at
    micro m taking slice m*W + r (stateless, like ``archlab.data.TokenBatches``)."""

    def __init__(self, items: Items, micro_batch_size: int, grad_accum: int, rank: int = 0, world_size: int = 1,
                 seed: int = 0):
        self.windows = item_windows(items)
        self.micro_batch_size, self.grad_accum, self.rank, self.world_size, self.seed = \
            micro_batch_size, grad_accum, rank, world_size, seed

    @property
    def global_batch_size(self) -> int:
        return self.world_size * self.grad_accum * self.micro_batch_size

    def get(self, step: int, micro: int = 0) -> Tensor:
        picks = np.random.default_rng([self.seed, step]).integers(0, len(self.windows), size=self.global_batch_size)
        first = (micro * self.world_size + self.rank) * self.micro_batch_size
        return self.windows[torch.from_numpy(picks[first:first + self.micro_batch_size])]


def item_windows(items: Items) -> Tensor:
    """(N, S + L): each item's inputs then its labels."""
    return torch.from_numpy(np.concatenate([items.x, items.y], axis=1).astype(np.int64))


class UnderstandingObjective(Objective):
    """The shared part; a subclass names its ``task`` and writes ``build_head``, ``item_loss`` and
    ``item_correct``."""

    task: ClassVar[str]
    options = frozenset({"init_from"})
    eval_keys = ("loss", "correct", "count")

    @classmethod
    def task_facts(cls) -> Task:
        return TASKS.get(cls.task)

    @classmethod
    def validate(cls, cfg: Any) -> None:
        t, m = cfg.train, cfg.model
        if getattr(m, "mtp_depth", 0):
            fail("model.mtp_depth", m.mtp_depth, f"train.objective={cls.name} reads the trunk's hidden states; "
                 "multi-token-prediction modules are trained only by train.objective=mtp: set model.mtp_depth=0")
        if t.seq_len < 16:
            fail("train.seq_len", t.seq_len, f"train.objective={cls.name} needs windows of >= 16 ids (a question "
                 "of up to 8 ids and the code it asks about): raise it")
        if list(t.eval_context_multipliers) != [1]:
            fail("train.eval_context_multipliers", list(t.eval_context_multipliers), "the task's items are "
                 "windows of train.seq_len ids: set [1]")
        if t.init_from is not None and not str(t.init_from).strip():
            fail("train.init_from", t.init_from, "must be a pre-trained run folder or checkpoint (or null)")
        if t.init_from is not None and t.branch_from is not None:
            fail("train.branch_from", t.branch_from, f"contradicts train.init_from={t.init_from!r}: a fine-tuning "
                 "run starts from the pre-trained weights only, with a fresh optimizer and step 0")

    def prepare_data(self, cfg: Any, progress=None) -> TaskData:
        """The task's items under the pre-trained run's tokenizer (or one trained on the training documents)."""
        d, t = cfg.data, cfg.train
        corpus = build_corpus(d)
        texts = read_split_documents(corpus, int(d.seed), float(d.val_fraction), d.max_bytes)
        tokenizer, path = task_tokenizer(cfg, texts["train"])
        data = task_data(self.task_facts(), texts, tokenizer, int(t.seq_len), int(d.seed), corpus.description,
                         tokenizer_path=path, cache_dir=Path(os.path.expanduser(str(d.cache_dir))) / "tasks")
        for split, items in data.examples.items():
            if len(items) == 0:
                fail("data.source", d.source, f"the {self.task} task found no item in the {split} split: the corpus "
                     "needs Python source with windows of train.seq_len tokens (data.source=stdlib)")
        ckpt = pretrained_checkpoint(t)
        data.meta["init_from"] = str(ckpt) if ckpt is not None else None
        return data

    def build_head(self, cfg: Any) -> nn.Module:
        raise NotImplementedError

    def build_model(self, cfg: Any) -> nn.Module:
        """The task's head on the recipe's trunk, loaded by name from ``train.init_from`` (a fresh head either
        way)."""
        model = self.build_head(cfg)
        ckpt = pretrained_checkpoint(cfg.train)
        if ckpt is not None:
            load_pretrained(model.trunk, ckpt / WEIGHTS)
        return model

    def train_batches(self, data: TaskData, rank: int, world_size: int) -> ItemBatches:
        t = self.t
        return ItemBatches(data.examples["train"], t.micro_batch_size, t.grad_accum, rank, world_size, t.seed)

    def eval_batches(self, data: TaskData, seq_len: int, batch_size: int, n_batches: int, rank: int,
                     world_size: int) -> Iterator[Tensor]:
        windows = item_windows(data.examples["val"])
        windows = windows[torch.from_numpy(np.random.default_rng(0).permutation(len(windows)))]  # across documents
        starts = list(range(0, len(windows), batch_size))[:n_batches]
        return (windows[s:s + batch_size] for s in starts[rank::world_size])

    def split_window(self, x_BW: Tensor) -> tuple[Tensor, Tensor]:
        """(inputs (B, S), labels (B, L))."""
        S = int(self.t.seq_len)
        return x_BW[:, :S], x_BW[:, S:]

    def item_loss(self, logits: Tensor, y_BL: Tensor, reduction: str) -> Tensor:
        raise NotImplementedError

    def item_correct(self, logits: Tensor, y_BL: Tensor) -> tuple[Tensor, Tensor]:
        """(correct (B,), counted (B,)) per item."""
        raise NotImplementedError

    def loss(self, model: nn.Module, x_BW: Tensor, *, step: int = 0, micro: int = 0) -> Loss:
        inputs, y_BL = self.split_window(x_BW)
        out = model(inputs)
        return Loss(main=self.item_loss(out.logits.float(), y_BL, "mean"), aux=out.aux_loss.float())

    @torch.no_grad()
    def eval_sums(self, model: nn.Module, x_BW: Tensor, *, index: int = 0) -> tuple[Tensor, Tensor, int]:
        """(summed loss, correct answers, counted answers) of a batch of item windows."""
        inputs, y_BL = self.split_window(x_BW)
        logits = model(inputs).logits.float()
        correct, counted = self.item_correct(logits, y_BL)
        return self.item_loss(logits, y_BL, "sum"), correct.sum(), int(counted.sum())

    @classmethod
    def eval_row(cls, sums: dict[str, float]) -> dict[str, Any]:
        n = sums["count"]
        return {"metric": cls.name, f"{cls.name}_loss": sums["loss"] / n, f"{cls.name}_accuracy": sums["correct"] / n,
                "eval_examples": int(n)}

    @torch.no_grad()
    def item_scores(self, model: nn.Module, items: Items, batch_size: int = 64,
                    limit: Optional[int] = None) -> tuple[np.ndarray, np.ndarray]:
        """(correct (N,), counted (N,)) of ``model`` on each item (the first ``limit``)."""
        model.eval()
        windows = item_windows(items)[:limit]
        correct, counted = [], []
        for s in range(0, len(windows), batch_size):
            inputs, y_BL = self.split_window(windows[s:s + batch_size])
            c, n = self.item_correct(model(inputs).logits.float(), y_BL)
            correct.append(c.numpy())
            counted.append(n.numpy())
        return np.concatenate(correct), np.concatenate(counted)

    @classmethod
    def saved_bytes(cls, s: Any, loss: str, checkpointing: str, block_bytes: Any = None) -> dict[str, float]:
        raise ValueError(f"train.objective={cls.name}: the memory model of the task's head is not derived")
