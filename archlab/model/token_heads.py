"""Per-token heads for fine-tuning on tagging and extractive QA (BERT, Devlin et al. 2019, sec. 4.2-4.3): a
trunk of any model type, loaded by name like :class:`archlab.model.classifier.Classifier`'s, and a fresh linear
layer on every position's final state.

Shape legend: B batch, S sequence, D model dim, C classes.

The states are the trunk's ``hidden_states``: BERT's encoder and T5's encoder see the whole window; GPT's decoder
sees only the left of each position (a tag or answer boundary cannot use the tokens after it).

- :class:`TokenTagger`: linear D -> C per position (tagging's logits, (B, S, C));
- :class:`SpanExtractor`: linear D -> 2 per position, split into start and end logits over the positions
  ((B, S) each), SQuAD's head.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from archlab.config.schema import ModelConfig
from archlab.model.build import model_class


@dataclass
class TokenOutput:
    logits: Tensor  # (B, S, C): tagging's classes; span: C = 2, start and end
    aux_loss: Tensor  # the trunk's summed MoE balancing losses (0 for dense)


class TokenTagger(nn.Module):
    """trunk.hidden_states(ids) -> dropout -> linear (D -> C) at every position."""

    def __init__(self, cfg: ModelConfig, n_classes: int):
        super().__init__()
        self.cfg = cfg
        self.trunk = model_class(cfg)(cfg)
        self.drop = nn.Dropout(cfg.dropout)
        self.out = nn.Linear(cfg.d_model, n_classes, bias=True)
        nn.init.normal_(self.out.weight, 0.0, cfg.init_std)
        nn.init.zeros_(self.out.bias)

    @property
    def checkpointing(self) -> str:
        return self.trunk.checkpointing

    @checkpointing.setter
    def checkpointing(self, mode: str) -> None:
        self.trunk.checkpointing = mode

    def forward(self, input_ids: Tensor) -> TokenOutput:
        h_BSD, aux = self.trunk.hidden_states(input_ids)
        return TokenOutput(logits=self.out(self.drop(h_BSD)), aux_loss=aux)


class SpanExtractor(TokenTagger):
    """Start and end logits over the positions: a per-token linear D -> 2 (``logits[..., 0]`` start, ``1`` end)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg, 2)
