"""Length extrapolation of a trained run: validation loss at multiples of the training context,
overall and per token position, optionally with evaluation-time overrides of the model config
(RoPE position interpolation, NTK-aware or YaRN scaling: ``model.position.rope_scaling.*``).

    from analysis.extrapolation import evaluate_lengths
    evaluate_lengths("runs/rope-seed0", multipliers=[1, 2, 4, 8], tokens=32768,
                     overrides=["model.position.rope_scaling.type=yarn",
                                "model.position.rope_scaling.factor={factor}",
                                "model.position.rope_scaling.original_max_seq_len={L}"])

``{factor}`` in an override becomes the multiplier of the length evaluated (the context
extension factor s = length / L) and ``{L}`` the training context length. At every length the
same number of validation tokens is scored (``tokens``, in windows of the evaluated length evenly
strided over the validation split: the same windows for every run of one corpus). A learned
position table cannot encode positions past ``model.max_seq_len``: such lengths are reported as
not applicable, with the reason, never clamped or wrapped.

Shape legend: B windows, S positions per window, V vocabulary.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from archlab.config import load_recipe
from archlab.data import eval_windows, prepare_data
from archlab.model.build import build_model
from archlab.nn.positions import position_class
from archlab.objectives.causal_lm import CausalLM
from archlab.train.checkpoint import load_weights_into, resolve_checkpoint


def eval_overrides(overrides: Sequence[str], multiplier: int, train_len: int) -> list[str]:
    """Fill ``{factor}`` (the multiplier) and ``{L}`` (the training context) into each override."""
    return [o.replace("{factor}", f"{float(multiplier):g}").replace("{L}", str(train_len)) for o in overrides]


@torch.no_grad()
def loss_per_position(model, windows, S: int) -> tuple[torch.Tensor, int]:
    """Summed next-token loss per position (S,) over the windows, and the number of windows."""
    sums_S = torch.zeros(S, dtype=torch.float64)
    n = 0
    for x_BS1 in windows:
        inputs_BS, targets_BS = CausalLM.split(x_BS1, 1)
        logits_BSV = model(inputs_BS).logits
        loss_BS = F.cross_entropy(logits_BSV.float().flatten(0, 1), targets_BS.flatten(), reduction="none")
        sums_S += loss_BS.view(x_BS1.shape[0], S).sum(0).double()
        n += x_BS1.shape[0]
    return sums_S, n


def evaluate_lengths(run_dir: str | Path, multipliers: Sequence[int], tokens: int = 32768,
                     overrides: Sequence[str] = (), bin_width: Optional[int] = None,
                     batch_tokens: int = 8192) -> dict:
    """Validation loss of the run's newest checkpoint at each ``multiplier * L`` (L = train.seq_len).

    Returns {"train_len", "overrides", "lengths": [{multiplier, context_len, loss, windows,
    per_position: {bin_width, loss}} or {multiplier, context_len, status: "n/a", reason}]}. The
    per-position curve is the mean loss over windows at each position, averaged in bins of
    ``bin_width`` positions (default L / 8).
    """
    ckpt = resolve_checkpoint(run_dir)
    base = load_recipe(ckpt / "recipe.yaml")
    L = int(base.train.seq_len)
    data = prepare_data(base)
    width = bin_width or max(1, L // 8)
    out = {"train_len": L, "overrides": list(overrides), "checkpoint": str(ckpt), "lengths": []}
    for m in multipliers:
        S = int(m) * L
        row = {"multiplier": int(m), "context_len": S}
        cfg = load_recipe(ckpt / "recipe.yaml", eval_overrides(overrides, m, L))
        limit = position_class(cfg.model).max_length(cfg.model)  # the encoding says how far it reaches
        if limit is not None and S > limit:
            out["lengths"].append({**row, "status": "n/a", "reason": f"{cfg.model.position.type} positions end at "
                                   f"model.max_seq_len={cfg.model.max_seq_len}"})
            continue
        model = build_model(cfg)
        load_weights_into(model, ckpt)
        model.eval()
        n_windows = max(1, tokens // S)
        batch = max(1, min(n_windows, batch_tokens // S))
        windows = eval_windows(data.val, S, batch, -(-n_windows // batch))
        sums_S, n = loss_per_position(model, windows, S)
        per_pos = (sums_S / n).tolist()
        bins = [sum(per_pos[i:i + width]) / len(per_pos[i:i + width]) for i in range(0, S, width)]
        out["lengths"].append({**row, "status": "ok", "loss": float(sums_S.sum() / (n * S)), "windows": n,
                               "per_position": {"bin_width": width, "loss": bins}})
    return out
