"""A sequence classifier for fine-tuning (ULMFiT, Howard & Ruder 2018; BERT, Devlin et al. 2019, sec. 3.2):
a trunk of any model type, its weights loaded by name from a pre-trained checkpoint, and a fresh linear head
on one pooled state per sequence.

Shape legend: B batch, S sequence, D model dim, C classes.

The trunk is the model the recipe's ``model`` node describes (``archlab.model.build``) and keeps its own
parameter names (under ``trunk.``): its LM head (and BERT's MLM head parts) stay loaded but unused. It reads
its input through its natural interface, ``hidden_states`` (decoder and encoder: the final normalised
states; encoder-decoder: the encoder's output); the model type states the poolings that make sense for it
(``poolings``, the first its convention) and why another is refused (``pooling_refused``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from torch import Tensor, nn

from archlab.config.schema import ModelConfig
from archlab.errors import fail
from archlab.model.build import model_class
from archlab.nn.heads import POOLINGS, ClassifierHead


@dataclass
class ClassifierOutput:
    logits: Tensor  # (B, C)
    aux_loss: Tensor  # the trunk's summed MoE balancing losses (0 for dense)


def pooling_for(m, pooling: Optional[str], key: str = "train.objective.pooling") -> str:
    """The pooling a classifier on the model ``m`` uses: ``pooling``, or the model type's convention when None;
    a pooling the model type has no use for is refused by name."""
    cls = model_class(m)
    if pooling is None:
        return cls.poolings[0]
    if pooling not in POOLINGS:
        fail(key, pooling, f"must be one of: {', '.join(sorted(POOLINGS))} (or null: the model type's convention)")
    if pooling not in cls.poolings:
        reason = getattr(cls, "pooling_refused", "")
        fail(key, pooling, f"model.type={m.type} pools {' or '.join(cls.poolings)}"
             + (f": {reason}" if reason else ""))
    return pooling


class Classifier(nn.Module):
    """trunk.hidden_states(ids) -> pool -> dropout -> linear (D -> C)."""

    def __init__(self, cfg: ModelConfig, n_classes: int, pooling: Optional[str] = None):
        super().__init__()
        self.cfg = cfg
        self.trunk = model_class(cfg)(cfg)
        self.head = ClassifierHead(cfg.d_model, n_classes, pooling_for(cfg, pooling), cfg.dropout)
        self.head.init_weights(cfg.init_std)

    @property
    def checkpointing(self) -> str:
        return self.trunk.checkpointing

    @checkpointing.setter
    def checkpointing(self, mode: str) -> None:
        self.trunk.checkpointing = mode

    def forward(self, input_ids: Tensor) -> ClassifierOutput:
        h_BSD, aux = self.trunk.hidden_states(input_ids)
        return ClassifierOutput(logits=self.head(h_BSD), aux_loss=aux)


def stored_tensors(module: nn.Module) -> dict[str, Tensor]:
    """The state of ``module`` as a checkpoint stores it (``archlab.train.checkpoint.save_model_weights``):
    a tied tensor once, under its first name."""
    seen: set[tuple] = set()
    out = {}
    for name, t in module.state_dict().items():
        key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if key not in seen:
            seen.add(key)
            out[name] = t
    return out


def _listed(names: list[str], limit: int = 6) -> str:
    return ", ".join(names[:limit]) + (f" (+{len(names) - limit} more)" if len(names) > limit else "")


def load_pretrained(trunk: nn.Module, weights: Path, key: str = "train.init_from") -> None:
    """Copy the checkpoint file ``weights`` (safetensors) into ``trunk`` by tensor name. Every stored tensor of
    the trunk must be there with its shape, and nothing else: otherwise a RecipeError names the tensors that
    are missing, unexpected, or of another shape (checkpoint vs this recipe)."""
    from safetensors.torch import load_file

    saved = load_file(str(weights))
    own = stored_tensors(trunk)
    missing = sorted(set(own) - set(saved))
    unexpected = sorted(set(saved) - set(own))
    shapes = [f"{n} {tuple(saved[n].shape)} in the checkpoint, {tuple(own[n].shape)} here"
              for n in own if n in saved and saved[n].shape != own[n].shape]
    if missing or unexpected or shapes:
        parts = ([f"shapes differ: {_listed(shapes)}"] if shapes else []) \
            + ([f"missing from the checkpoint: {_listed(missing)}"] if missing else []) \
            + ([f"not in this model: {_listed(unexpected)}"] if unexpected else [])
        fail(key, str(weights.parent), "the checkpoint's weights do not fit this recipe's model ("
             + "; ".join(parts) + "): give the model node the pre-trained run's settings")
    with torch.no_grad():
        for name, t in own.items():
            t.copy_(saved[name].to(t.dtype))
