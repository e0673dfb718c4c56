"""Heads on a trunk's hidden states. BERT's masked-LM head transform (``model.head_transform``, an encoder
option): between the last block and the LM head, h -> norm(act(dense(h))) with a D x D dense layer (with bias),
the FFN's activation and a norm of ``norm.type``. A classification head
(:class:`ClassifierHead`, fine-tuning): a linear layer on one pooled state per sequence (:data:`POOLINGS`).

Shape legend: N tokens (any leading dims), B batch, S sequence, D model dim, C classes.

It runs on every position the head reads (all of them: the logits of every position,
and the fused loss over all positions with the unselected ones ignored), so its
FLOPs and saved bytes are per token like a block's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from torch import Tensor, nn

from archlab.errors import fail
from archlab.nn.component import ActShape
from archlab.nn.ffn import ffn_class
from archlab.nn.norms import build_norm, norm_class, norm_params

if TYPE_CHECKING:
    from archlab.config.schema import ModelConfig


class HeadTransform(nn.Module):
    """dense (D -> D, bias) -> the FFN's activation -> norm: ``BertPredictionHeadTransform``."""


    def __init__(self, cfg: "ModelConfig"):
        super().__init__()
        self.dense = nn.Linear(cfg.d_model, cfg.d_model, bias=True)
        self.activate = ffn_class(cfg).activation(cfg.ffn)
        self.norm = build_norm(cfg, dim=cfg.d_model)

    def forward(self, h_ND: Tensor) -> Tensor:
        return self.norm(self.activate(self.dense(h_ND)))

    @classmethod
    def validate(cls, m, prefix: str = "model") -> None:
        if ffn_class(m).up_width != 1:
            fail(f"{prefix}.head_transform", m.head_transform, f"the head transform applies the FFN's activation "
                 f"; a gated FFN ({m.ffn.type}) has none: use ffn.type gelu or relu")

    @staticmethod
    def num_params(cfg: "ModelConfig") -> int:
        return cfg.d_model * cfg.d_model + cfg.d_model + norm_params(cfg, dim=cfg.d_model)

    @staticmethod
    def forward_flops(cfg: "ModelConfig") -> float:
        """Matmul FLOPs per token: the D x D dense layer."""
        return 2.0 * cfg.d_model * cfg.d_model

    @staticmethod
    def saved_bytes(s: ActShape) -> float:
        """The dense layer's input, what the activation keeps (GELU: its input; its output is the norm's
        input; ReLU: its output, which serves both) and what the norm keeps besides its input."""
        cfg, n, a = s.cfg, s.n, s.act
        D = cfg.d_model
        ffn = ffn_class(cfg)
        keeps_input, extra = norm_class(cfg).saved(s, dim=D)
        act_input = ffn.hidden_saved - 1  # GELU keeps its input (2 - 1), ReLU only its output (1 - 1)
        act_output = keeps_input or ffn.hidden_saved == 1
        return float(n * D * a * (1 + act_input + act_output) + n * extra)


# how a classification head reads one state per sequence from the trunk's final hidden states (B, S, D)
POOLINGS: dict[str, Callable[[Tensor], Tensor]] = {
    "first": lambda h_BSD: h_BSD[:, 0],  # BERT's [CLS] position
    "last": lambda h_BSD: h_BSD[:, -1],  # a causal decoder's: the one position that has seen the whole window
    "mean": lambda h_BSD: h_BSD.mean(dim=1),
}


class ClassifierHead(nn.Module):
    """dropout -> linear (D -> C, bias) on the pooled state: the fresh layer fine-tuning adds (BERT, sec. 4.1:
    "the only new parameters introduced during fine-tuning are classification layer weights")."""

    def __init__(self, d_model: int, n_classes: int, pooling: str, dropout: float = 0.0):
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"pooling={pooling!r}: must be one of {', '.join(sorted(POOLINGS))}")
        self.pooling = pooling
        self.drop = nn.Dropout(dropout)
        self.out = nn.Linear(d_model, n_classes, bias=True)

    def forward(self, h_BSD: Tensor) -> Tensor:
        return self.out(self.drop(POOLINGS[self.pooling](h_BSD)))  # (B, C)

    def init_weights(self, std: float) -> None:
        nn.init.normal_(self.out.weight, 0.0, std)
        nn.init.zeros_(self.out.bias)

    @staticmethod
    def num_params(d_model: int, n_classes: int) -> int:
        return d_model * n_classes + n_classes
