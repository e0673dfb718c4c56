"""Cloze: one held-out id per window, predicted by each model type through its own interface, so that a
causal decoder, an encoder and an encoder-decoder are scored on one task.

Shape legend: N items (windows), S window length, V vocabulary, Vt text ids (the tokenizer's; the ids above
are an objective's own: mask, start, sentinels).

Items: ``windows`` validation windows of S = ``train.seq_len`` ids (``archlab.data.eval_windows``: the same for
every run that shares the tokenizer and the corpus), and in each one position p drawn uniformly from
[S/8, 7S/8) by a generator seeded with ``seed`` (so that every model sees S/8 ids or more on each side).
The answer is the id at p:

- decoder (``model.type: decoder``): the next-token distribution after ids[:p], the left side only (what a
  causal LM has; its right side would need a forward per candidate);
- encoder (BERT): the window with the mask id at p, the distribution at p (both sides);
- encoder-decoder (T5): the window with p replaced by the first sentinel (a one-id span), the decoder fed
  [start, sentinel]: its second distribution (both sides).

Each distribution is renormalised over the Vt text ids (the answer is a text id; the reserved ids differ by
objective). Reported: accuracy (argmax == answer) and the mean negative log-likelihood of the answer (nats).
"""

from __future__ import annotations

from pathlib import Path

import torch

from archlab.data import eval_windows, prepare_data
from archlab.objectives.mlm import mask_id
from archlab.objectives.span_corruption import sentinel_ids, start_id
from archlab.train.checkpoint import load_model


def cloze_items(tokens, seq_len: int, windows: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(windows (N, S), positions (N,)) of the split ``tokens``."""
    batch = next(eval_windows(tokens, seq_len, windows, 1))[:, :seq_len]  # (N, S)
    g = torch.Generator().manual_seed(seed)
    pos = torch.randint(seq_len // 8, seq_len - seq_len // 8, (batch.shape[0],), generator=g)
    return batch, pos


@torch.no_grad()
def cloze_log_probs(model, kind: str, x_NS: torch.Tensor, pos_N: torch.Tensor, text_ids: int) -> torch.Tensor:
    """(N, Vt) log-probabilities of the id at each item's position, by the model type's interface."""
    V = model.cfg.vocab_size
    rows = torch.arange(x_NS.shape[0])
    if kind == "decoder":
        logits = model(x_NS).logits[rows, pos_N - 1]  # the prediction after ids[:p]
    elif kind == "encoder":
        masked = x_NS.clone()
        masked[rows, pos_N] = mask_id(model.cfg)
        logits = model(masked).logits[rows, pos_N]
    elif kind == "encoder_decoder":
        s0 = int(sentinel_ids(V, 1)[0])
        corrupted = x_NS.clone()
        corrupted[rows, pos_N] = s0
        decoder = torch.tensor([[start_id(V), s0]]).expand(x_NS.shape[0], 2)
        logits = model(corrupted, decoder).logits[:, 1]
    else:
        raise ValueError(f"model.type={kind!r}: cloze knows decoder, encoder and encoder_decoder")
    return torch.log_softmax(logits[:, :text_ids].float(), dim=-1)


def cloze_scores(run_dir: str | Path, windows: int = 512, seed: int = 0, batch: int = 64) -> dict:
    """{accuracy, nll, items, model_type, text_ids, tokenizer} of the run's newest checkpoint."""
    model, cfg = load_model(run_dir)
    data = prepare_data(cfg)
    text_ids = int(data.tokenizer.vocab_size)
    x, pos = cloze_items(data.val, int(cfg.train.seq_len), windows, seed)
    if int(x.max()) >= text_ids:
        raise ValueError(f"{run_dir}: validation ids reach {int(x.max())}, past the tokenizer's {text_ids} text ids")
    kind = str(cfg.model.type)
    correct, nll = 0, 0.0
    for i in range(0, x.shape[0], batch):
        lp = cloze_log_probs(model, kind, x[i:i + batch], pos[i:i + batch], text_ids)
        answer = x[i:i + batch].gather(1, pos[i:i + batch, None]).squeeze(1)
        correct += int((lp.argmax(-1) == answer).sum())
        nll += float(-lp.gather(1, answer[:, None]).sum())
    n = x.shape[0]
    return {"accuracy": correct / n, "nll": nll / n, "items": n, "model_type": kind, "text_ids": text_ids,
            "tokenizer": str(data.meta.get("tokenizer", {}).get("sha256") or data.cache_path.name)}
