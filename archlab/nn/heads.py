"""BERT's masked-LM head transform (``model.head_transform``, an encoder option): between the last block
and the LM head, h -> norm(act(dense(h))) with a D x D dense layer (with bias), the FFN's activation
(BERT's ``hidden_act`` serves both) and a norm of ``norm.type``.

Shape legend: N tokens (any leading dims), D model dim.

It runs on every position the head reads (all of them: the logits of every position, as HF's
``BertForMaskedLM``, and the fused loss over all positions with the unselected ones ignored), so its
FLOPs and saved bytes are per token like a block's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor, nn

from archlab.errors import fail
from archlab.nn.component import ActShape, Exportable
from archlab.nn.ffn import ffn_class
from archlab.nn.norms import build_norm, norm_class, norm_params

if TYPE_CHECKING:
    from archlab.config.schema import ModelConfig


class HeadTransform(Exportable, nn.Module):
    """dense (D -> D, bias) -> the FFN's activation -> norm: ``BertPredictionHeadTransform``."""

    hf_export = {"bert": "cls.predictions.transform"}
    hf_unsupported = "an MLM head transform: this family's LM head reads the last hidden state directly"

    def __init__(self, cfg: "ModelConfig"):
        super().__init__()
        self.dense = nn.Linear(cfg.d_model, cfg.d_model, bias=True)
        self.activate = ffn_class(cfg).activate
        self.norm = build_norm(cfg, dim=cfg.d_model)

    def forward(self, h_ND: Tensor) -> Tensor:
        return self.norm(self.activate(self.dense(h_ND)))

    @classmethod
    def validate(cls, m, prefix: str = "model") -> None:
        if ffn_class(m).up_width != 1:
            fail(f"{prefix}.head_transform", m.head_transform, f"the head transform applies the FFN's activation "
                 f"(BERT's hidden_act); a gated FFN ({m.ffn.type}) has none: use ffn.type gelu or relu")

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
