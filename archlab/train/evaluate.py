"""Validation of a :class:`~archlab.train.loop.Trainer`'s model: the objective's loss sums over this
rank's validation windows at a multiple of the training context, summed over ranks."""

from __future__ import annotations

from typing import Any

import torch

from archlab.data import DataError
from archlab.nn.positions import position_class
from archlab.train.dist import all_reduce_max, all_reduce_sum


@torch.no_grad()
def evaluate(trainer, multiplier: int = 1) -> dict[str, Any]:
    """Validation loss at context ``multiplier * seq_len``: the objective's sums (``eval_keys``: token-loss
    sums and counts) all-reduced, then its row (``eval_row``: causal LM's ``loss``, masked LM's ``mlm_loss``)."""
    t, m, info, objective = trainer.cfg.train, trainer.cfg.model, trainer.info, trainer.objective
    S = t.seq_len * multiplier
    row: dict[str, Any] = {"kind": "val", "step": trainer.step, "tokens": trainer.tokens, "context_len": S,
                           "context_multiplier": multiplier}
    limit = position_class(m).max_length(m)
    if limit is not None and S > limit:
        return {**row, "skipped": f"{m.position.type} positions end at {limit} (model.max_seq_len={m.max_seq_len})"}
    B = max(1, t.micro_batch_size // multiplier)  # about the same tokens per batch at every length
    try:
        windows = objective.eval_batches(trainer.data, S, B, t.eval_batches, info.rank, info.world_size)
    except DataError as e:
        return {**row, "skipped": str(e)}
    keys = objective.eval_keys
    sums = torch.zeros(len(keys), dtype=torch.float64)
    windows = list(windows)
    # where each forward is a collective (tokens exchanged between ranks, partitioned parameters
    # gathered), every rank runs as many forwards as the busiest one; the extra ones (a window of
    # zeros) count nothing
    collective = trainer.backend.collective_forward
    n_forwards = int(all_reduce_max(torch.tensor(float(len(windows))))) if collective else len(windows)
    net = trainer.backend.eval_module(trainer.model)  # the model, or the engine where it gathers the parameters
    trainer.model.eval()
    for i in range(n_forwards):
        x_BS1 = (windows[i] if i < len(windows) else torch.zeros(1, S + 1, dtype=torch.long)).to(trainer.device)
        with trainer.accelerator.autocast():  # index: the window batch's number over all ranks
            parts = objective.eval_sums(net, x_BS1, index=i * info.world_size + info.rank)
        if i < len(windows):
            sums += torch.tensor([float(p) for p in parts], dtype=torch.float64)
    trainer.model.train()
    sums = all_reduce_sum(sums)
    return {**row, **objective.eval_row({k: float(v) for k, v in zip(keys, sums)})}
