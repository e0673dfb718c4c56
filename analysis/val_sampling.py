"""The sampling error of the validation set itself, beside the seed-to-seed interval.

A final validation loss is a mean over the validation windows the trainer evaluates
(``archlab.data.eval_windows``: ``train.eval_batches x micro_batch_size`` non-overlapping windows
strided evenly over the whole validation split, so they are spread over its documents, not one
contiguous slice). A different draw of validation text would give a different mean; that error is
estimated by resampling the windows (the bootstrap over validation windows, each window a piece of
one document or of a few neighbouring ones):

- per run: the 95% bootstrap half-width of its mean window loss;
- per pair of runs of two arms with the same seed, evaluated on the same windows: the 95% half-width
  of the mean per-window difference (the windows' shared difficulty cancels, so it is much
  narrower than either run's own).

The report (``analysis.measurements.val_sampling``) compares them with the seed intervals (the
t-interval over seeds of an arm's loss and of its paired difference against the reference): the
validation set is large enough when its own error is at most a third of the seed interval it sits
beside.

    losses_W = window_losses("runs/experiments/attention-kv/sweep/mha-seed0-flop4.2e12")  # (W,)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from archlab.objectives.causal_lm import CausalLM


@torch.no_grad()
def window_losses(run_dir: str | Path) -> np.ndarray:
    """Mean next-token loss of each validation window the trainer evaluated at the end, with the
    run's final weights: (W,) float64, W = train.eval_batches x train.micro_batch_size (or fewer on a
    short split). The mean of the result is the run's final validation loss (same windows, same
    weights; fp32 on CPU)."""
    from archlab.data import eval_windows, prepare_data
    from archlab.train.checkpoint import load_model

    model, cfg = load_model(run_dir)
    t = cfg.train
    data = prepare_data(cfg)
    S = int(t.seq_len)
    out = []
    for x_BS1 in eval_windows(data.val, S, int(t.micro_batch_size), int(t.eval_batches)):
        inputs_BS, targets_BS = CausalLM.split(x_BS1, 1)
        logits_BSV = model(inputs_BS).logits
        loss_BS = F.cross_entropy(logits_BSV.float().flatten(0, 1), targets_BS.flatten(), reduction="none")
        out.append(loss_BS.view(x_BS1.shape[0], S).mean(1).double())
    return torch.cat(out).numpy()
