"""Fine-tuning on a labelled task (the seeds' ULMFiT / BERT recipe): a pre-trained checkpoint's model with a
fresh classification head, trained by cross-entropy on labelled windows (``train.objective: classify``).

- ``train.init_from``: a run folder (its newest complete checkpoint) or a checkpoint folder; the recipe's model
  (:class:`archlab.model.classifier.Classifier`'s trunk) loads its weights by tensor name, and a checkpoint
  that does not fit is refused naming the tensors. The tokenizer is the pre-trained run's (``tokenizer.json``
  in its run folder). null: the trunk starts from a fresh init (the no-pre-training control), the tokenizer
  is trained on the task's training documents.
- ``train.objective.pooling``: which state of the trunk the head reads (``archlab.nn.heads.POOLINGS``); null is
  the model type's convention (GPT: last, BERT: first, T5: the encoder's mean); one the model type has no use
  for is refused by name (a causal decoder's first position).
- The task (:mod:`archlab.data.splice`): was the window spliced right after its middle id? Made from
  ``data.source``'s corpus, split by document (``data.seed``, ``data.val_fraction`` for val and for test,
  ``data.max_bytes``), ``train.objective.train_examples`` training examples and
  ``train.objective.eval_examples`` each for val and test, balanced.

A window is the S input ids and the label behind them, (B, S + 1) (``ahead`` 1): the trainer's micro batches
are drawn from the training examples by (``train.seed``, step), as token windows are. Validation rows say
``metric: classify``, ``classify_loss`` and ``classify_accuracy`` over ``train.eval_batches`` batches of the
val examples; the baselines are in the run's ``env.json`` (``data_meta.baselines``); :func:`score` scores a
split (test) after training.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Iterator, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from archlab.checkpoints import TOKENIZER, WEIGHTS, CheckpointError, resolve_checkpoint
from archlab.config.schema import ObjectiveConfig, model_config
from archlab.data import build_corpus, build_tokenizer
from archlab.data.splice import N_CLASSES, read_split_documents, splice_task
from archlab.data.tokenizer import Tokenizer
from archlab.errors import fail
from archlab.model.classifier import Classifier, load_pretrained, pooling_for
from archlab.objectives.base import OBJECTIVES, Loss, Objective


def pretrained_checkpoint(t: Any) -> Optional[Path]:
    """The checkpoint folder ``train.init_from`` names (a run folder: its newest complete one), or None."""
    if t.init_from is None:
        return None
    try:
        return resolve_checkpoint(str(t.init_from))
    except CheckpointError as e:
        fail("train.init_from", t.init_from, f"not a pre-trained run or checkpoint ({e})")

def task_tokenizer(cfg: Any, train_texts) -> tuple:
    """(tokenizer, its file or None) for a fine-tuning task: the pre-trained run's own tokenizer when
    ``train.init_from`` names one (refused when it has more ids than the model), else one trained on ``train_texts``."""
    ckpt = pretrained_checkpoint(cfg.train)
    if ckpt is None:
        return build_tokenizer(cfg.data.tokenizer, train_texts, int(cfg.model.vocab_size)), None
    path = ckpt.parent.parent / TOKENIZER
    tokenizer = Tokenizer.load(path)
    if tokenizer.vocab_size > cfg.model.vocab_size:
        fail("train.init_from", cfg.train.init_from, f"its tokenizer has {tokenizer.vocab_size} ids, more than "
             f"model.vocab_size={cfg.model.vocab_size}: the recipe's model is not the pre-trained one")
    return tokenizer, path



class ExampleBatches:
    """Training micro batches of labelled windows, (B, S + 1): stateless like ``archlab.data.TokenBatches``
    (step ``step``'s W*A*B examples drawn with replacement from ``default_rng([seed, step])``; rank r at micro
    m takes slice m*W + r)."""

    def __init__(self, x_NS: np.ndarray, y_N: np.ndarray, micro_batch_size: int, grad_accum: int,
                 rank: int = 0, world_size: int = 1, seed: int = 0):
        self.windows = torch.from_numpy(np.concatenate([x_NS, y_N[:, None]], axis=1).astype(np.int64))
        self.micro_batch_size, self.grad_accum, self.rank, self.world_size, self.seed = \
            micro_batch_size, grad_accum, rank, world_size, seed

    @property
    def global_batch_size(self) -> int:
        return self.world_size * self.grad_accum * self.micro_batch_size

    def get(self, step: int, micro: int = 0) -> Tensor:
        picks = np.random.default_rng([self.seed, step]).integers(0, len(self.windows), size=self.global_batch_size)
        first = (micro * self.world_size + self.rank) * self.micro_batch_size
        return self.windows[torch.from_numpy(picks[first:first + self.micro_batch_size])]


def example_windows(x_NS: np.ndarray, y_N: np.ndarray, batch_size: int, n_batches: Optional[int] = None,
                    rank: int = 0, world_size: int = 1) -> Iterator[Tensor]:
    """Evaluation batches (b, S + 1) of the examples in order, the first ``n_batches`` (None: all); rank r
    takes batches r, r + W, ..."""
    windows = torch.from_numpy(np.concatenate([x_NS, y_N[:, None]], axis=1).astype(np.int64))
    starts = list(range(0, len(windows), batch_size))[:n_batches]
    return (windows[s:s + batch_size] for s in starts[rank::world_size])


@dataclass
class ClassifyConfig(ObjectiveConfig):
    type: str = "classify"
    # the state the head reads, first | last | mean; null = the model type's convention (decoder: last; encoder:
    # first, BERT's [CLS] position; encoder_decoder: the encoder's mean)
    pooling: Optional[str] = None
    train_examples: int = 8192  # labelled training examples (archlab/data/splice.py)
    eval_examples: int = 1024  # labelled examples in val, and again in test
    renamed: ClassVar[dict[str, str]] = {  # the flat train keys before this node
        "classify_pooling": "pooling", "classify_train_examples": "train_examples",
        "classify_eval_examples": "eval_examples"}


@OBJECTIVES.register("classify")
class Classify(Objective):
    """Cross-entropy of a classification head on the pooled states of a pre-trained trunk."""

    name = "classify"
    Config = ClassifyConfig
    options = frozenset({"init_from"})
    eval_metric = "classify: the labelled task's cross-entropy (nats) and accuracy on the validation examples"
    eval_keys = ("loss", "correct", "count")
    eval_loss_key = "classify_loss"

    @classmethod
    def validate(cls, cfg: Any) -> None:
        t, m = cfg.train, cfg.model
        pooling_for(m, t.objective.pooling)
        if getattr(m, "mtp_depth", 0):
            fail("model.mtp_depth", m.mtp_depth, "multi-token-prediction modules are trained only by "
                 "train.objective=mtp; a classifier reads the trunk's hidden states: set model.mtp_depth=0")
        for key in ("train_examples", "eval_examples"):
            if getattr(t.objective, key) < 2:
                fail(f"train.objective.{key}", getattr(t.objective, key),
                     "must be >= 2 (a balanced set holds both labels)")
        if t.seq_len < 3:
            fail("train.seq_len", t.seq_len, "the task's windows need ids on both sides of the middle: >= 3")
        if list(t.eval_context_multipliers) != [1]:
            fail("train.eval_context_multipliers", list(t.eval_context_multipliers), "the task's examples are "
                 "windows of train.seq_len ids: set [1]")
        if t.init_from is not None and not str(t.init_from).strip():
            fail("train.init_from", t.init_from, "must be a pre-trained run folder or checkpoint (or null)")
        if t.init_from is not None and t.branch_from is not None:
            fail("train.branch_from", t.branch_from, f"contradicts train.init_from={t.init_from!r}: a fine-tuning "
                 "run starts from the pre-trained weights only, with a fresh optimizer and step 0")

    @classmethod
    def split(cls, x_BW: Tensor, ahead: int) -> tuple[Tensor, Tensor]:
        """(inputs (B, S), labels (B,)): the label is the window's last entry."""
        return x_BW[:, :-1], x_BW[:, -1]

    def prepare_data(self, cfg: Any, progress=None):
        """The labelled task (:func:`archlab.data.splice.splice_task`) under the pre-trained run's tokenizer
        (built in memory: ``progress`` has no cache stage to report)."""
        d, t = cfg.data, cfg.train
        corpus = build_corpus(d)
        texts = read_split_documents(corpus, int(d.seed), float(d.val_fraction), d.max_bytes)
        tokenizer, path = task_tokenizer(cfg, texts["train"])
        data = splice_task(corpus, tokenizer, int(t.seq_len), int(t.objective.train_examples),
                           int(t.objective.eval_examples), int(d.seed), float(d.val_fraction), d.max_bytes,
                           texts=texts, tokenizer_path=path)
        ckpt = pretrained_checkpoint(t)
        data.meta["init_from"] = str(ckpt) if ckpt is not None else None
        return data

    def build_model(self, cfg: Any) -> nn.Module:
        """The classifier, its trunk loaded by name from ``train.init_from`` (a fresh head either way)."""
        model = Classifier(model_config(cfg), N_CLASSES, cfg.train.objective.pooling)
        ckpt = pretrained_checkpoint(cfg.train)
        if ckpt is not None:
            load_pretrained(model.trunk, ckpt / WEIGHTS)
        return model

    def train_batches(self, data: Any, rank: int, world_size: int) -> ExampleBatches:
        t, e = self.t, data.examples["train"]
        return ExampleBatches(e.x, e.y, t.micro_batch_size, t.grad_accum, rank, world_size, t.seed)

    def eval_batches(self, data: Any, seq_len: int, batch_size: int, n_batches: int, rank: int,
                     world_size: int) -> Iterator[Tensor]:
        e = data.examples["val"]
        return example_windows(e.x, e.y, batch_size, n_batches, rank, world_size)

    def loss(self, model: nn.Module, x_BW: Tensor, *, step: int = 0, micro: int = 0) -> Loss:
        inputs, labels = self.split(x_BW, 1)
        out = model(inputs)
        return Loss(main=F.cross_entropy(out.logits.float(), labels), aux=out.aux_loss.float())

    @torch.no_grad()
    def eval_sums(self, model: nn.Module, x_BS1: Tensor, *, index: int = 0) -> tuple[Tensor, Tensor, int]:
        """(summed cross-entropy, correct argmax predictions, examples) of a batch of labelled windows."""
        inputs, labels = self.split(x_BS1, 1)
        logits = model(inputs).logits.float()
        return (F.cross_entropy(logits, labels, reduction="sum"), (logits.argmax(-1) == labels).sum(),
                labels.numel())

    @classmethod
    def eval_row(cls, sums: dict[str, float]) -> dict[str, Any]:
        n = sums["count"]
        return {"metric": "classify", "classify_loss": sums["loss"] / n, "classify_accuracy": sums["correct"] / n,
                "eval_examples": int(n)}

    @classmethod
    def forward_flops(cls, cfg: Any, seq_len: int) -> dict[str, float]:
        """The head: one D x C product per window, per input token (counted under ``lm_head``)."""
        return {"lm_head": 2.0 * cfg.d_model * N_CLASSES / seq_len}

    @classmethod
    def saved_bytes(cls, s: Any, loss: str, checkpointing: str, block_bytes: Any = None) -> dict[str, float]:
        raise ValueError("train.objective=classify: the memory model of the classification head is not derived")


@torch.no_grad()
def score(model: nn.Module, x_NS: np.ndarray, y_N: np.ndarray, batch_size: int = 64) -> dict[str, float]:
    """Loss and accuracy of a classifier on examples (e.g. the test split's, after training)."""
    model.eval()
    loss = correct = 0.0
    for w in example_windows(x_NS, y_N, batch_size):
        logits = model(w[:, :-1]).logits.float()
        loss += float(F.cross_entropy(logits, w[:, -1], reduction="sum"))
        correct += float((logits.argmax(-1) == w[:, -1]).sum())
    return {"loss": loss / len(y_N), "accuracy": correct / len(y_N), "examples": len(y_N)}
