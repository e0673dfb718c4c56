"""Per-layer gradient norms of a model at initialisation (Xiong et al. 2020, "On Layer
Normalization in the Transformer Architecture", Fig. 3): with Post-LN the gradients of the
parameters near the output are large and grow with the layer index, which is why Post-LN needs a
learning-rate warmup; with Pre-LN they are about the same in every layer and shrink with depth.

    from analysis.init_gradients import init_grad_norms
    init_grad_norms("recipes/vanilla/tiny.yaml", ["model.norm.placement=pre"], seed=0, batches=2)

The model is built exactly as the trainer builds it for ``train.seed = seed`` (same initial
weights), and the loss is the trainer's (next-token cross-entropy plus the MoE balancing losses)
on the first ``batches`` training batches of that seed; gradients of one batch at a time, the
norms averaged over batches.

Shape legend: B windows, S positions.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from archlab.config import load_recipe
from archlab.data import TokenBatches, prepare_data
from archlab.model.build import build_model
from archlab.objectives.causal_lm import CausalLM


def block_grad_norms(model) -> list[float]:
    """L2 norm of the gradients of all parameters of each block (layer 0 first)."""
    norms = []
    for block in model.blocks:
        sq = sum(float(p.grad.double().pow(2).sum()) for p in block.parameters() if p.grad is not None)
        norms.append(math.sqrt(sq))
    return norms


def init_grad_norms(recipe: str, overrides: Sequence[str], seed: int, batches: int = 2) -> dict:
    """{"per_layer": [mean over batches of each block's gradient norm], "loss": mean initial loss,
    "embedding": gradient norm of the token embedding, "n_layers", "seed", "batches"}."""
    cfg = load_recipe(recipe, [*overrides, f"train.seed={seed}"])
    t = cfg.train
    data = prepare_data(cfg)
    torch.manual_seed(seed)  # as the trainer: the same initial weights as the run of this seed
    model = build_model(cfg)
    model.train()
    stream = TokenBatches(data.train, int(t.seq_len), int(t.micro_batch_size), 1, 0, 1, seed)
    per_layer, losses, embed = [], [], []
    for step in range(batches):
        x_BS1 = stream.get(step)
        model.zero_grad(set_to_none=True)
        inputs_BS, targets_BS = CausalLM.split(x_BS1, 1)
        out = model(inputs_BS, targets=targets_BS)
        (out.loss + out.aux_loss).backward()
        per_layer.append(block_grad_norms(model))
        embed.append(float(model.embed.weight.grad.norm()))
        losses.append(float(out.loss.detach()))
    n_layers = len(per_layer[0])
    return {"per_layer": [sum(b[i] for b in per_layer) / batches for i in range(n_layers)],
            "loss": sum(losses) / batches, "embedding": sum(embed) / batches, "n_layers": n_layers,
            "seed": seed, "batches": batches}
