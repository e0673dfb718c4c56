"""Understanding tasks made from Python source, with Python's own ``ast`` and ``tokenize`` as ground truth
(:mod:`.roles`), one registry (:data:`TASKS`):

- ``tag`` (:mod:`.tag`): each identifier's role, on its first BPE token (the named-entity analogue);
- ``span_qa`` (:mod:`.span_qa`): where is NAME defined? the span of its binding in the window (SQuAD's form);
- ``bound`` (:mod:`.bound`): is every name the window reads bound within it? (a balanced yes/no on the whole
  window).

Splits are by document (``archlab.data.splice.read_split_documents``: ranked by sha256 of (seed, name); val and
test ``data.val_fraction`` of the documents each), so no document is in two splits; each split's items are
drawn from ``numpy.random.default_rng([seed, split])``: the same seed gives the same task.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from archlab.data.splice import SPLITS
from archlab.data.tasks import bound, cache, span_qa, tag
from archlab.data.tasks.documents import parse_documents
from archlab.data.tasks.items import Items
from archlab.registry import Registry


@dataclass(frozen=True)
class Task:
    """A task's facts: its items (``make_items(docs, S, tokenizer, rng)``), its baseline (``baseline(train, items,
    vocab_size)`` -> per-item (correct, counted)), the head it needs (``token``, ``span`` or ``sequence``) and the
    head's classes."""

    name: str
    question: str
    head: str
    n_classes: int
    make_items: Callable[..., Items]
    baseline: Callable[..., tuple[np.ndarray, np.ndarray]]
    baseline_name: str


TASKS: Registry = Registry("understanding task")
for _task in (
    Task("tag", "each identifier's role (definition, parameter, call, attribute, store, load) on its first token",
         "token", tag.N_CLASSES, tag.make_items, tag.baseline, "each token id's most frequent training role"),
    Task("span_qa", "where is NAME defined? the span of its one binding in the window", "span", 2,
         span_qa.make_items, span_qa.baseline, "the name's first occurrence in the window"),
    Task("bound", "is every name the window reads bound within it?", "sequence", bound.N_CLASSES,
         bound.make_items, bound.baseline, "the training items' majority label"),
):
    TASKS.register(_task.name)(_task)


@dataclass
class TaskData:
    """A task's items per split, in the place of the trainer's token data (``archlab.data.PreparedData``)."""

    tokenizer: Any
    train: np.ndarray  # the training documents' ids, concatenated (the run's unigram entropy)
    examples: dict[str, Items]
    cache_path: Optional[Path]  # the tokenizer's file, when it is a pre-trained run's
    meta: dict[str, Any]


def score_rate(correct: np.ndarray, counted: np.ndarray) -> float:
    return float(correct.sum() / max(1, counted.sum()))


def _sha256(path: Optional[Path]) -> Optional[str]:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest() if path else None


def task_data(task: Task, texts: dict[str, list[str]], tokenizer, seq_len: int, seed: int, description: str = "",
              tokenizer_path: Optional[Path] = None, cache_dir: Optional[Path] = None) -> TaskData:
    """The items of ``task`` in each split of ``texts`` (the split documents' texts), under ``tokenizer``; read from
    and written to ``cache_dir`` when given (:mod:`.cache`)."""
    key = cache.task_key(task.name, texts, tokenizer, seq_len, seed) if cache_dir is not None else None
    hit = cache.load(Path(cache_dir), key) if key is not None else None
    if hit is not None:
        items, train_ids, meta = hit
        meta["tokenizer_sha256"] = _sha256(tokenizer_path)
        return TaskData(tokenizer, train_ids, items, tokenizer_path, meta)
    docs, skipped = {}, {}
    for s in SPLITS:
        docs[s], skipped[s] = parse_documents(texts[s], tokenizer)
    items = {s: task.make_items(docs[s], seq_len, tokenizer, np.random.default_rng([seed, k]))
             for k, s in enumerate(SPLITS)}
    vocab = int(tokenizer.vocab_size)
    base = {s: score_rate(*task.baseline(items["train"], it, vocab)) for s, it in items.items()}
    meta = {
        "task": f"{task.name}: {task.question}", "corpus": description, "seq_len": seq_len, "seed": seed,
        "documents": {s: len(docs[s]) for s in SPLITS}, "not_python": skipped,
        "examples": {s: len(it) for s, it in items.items()},
        "baselines": {s: {"chance": float(it.chance.mean()) if len(it) else None, "baseline": base[s],
                          "baseline_rule": task.baseline_name} for s, it in items.items()},
        "tokenizer_sha256": _sha256(tokenizer_path),
    }
    train_ids = np.concatenate([d.ids for d in docs["train"]]) if docs["train"] else np.zeros(0, dtype=np.int64)
    if key is not None:
        cache.store(Path(cache_dir), key, items, train_ids, meta)
    return TaskData(tokenizer, train_ids, items, tokenizer_path, meta)
