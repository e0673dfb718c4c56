"""Multi-token prediction (DeepSeek-V3, sec. 2.2): next-token prediction plus ``model.mtp_depth`` = K
modules that each predict one token further ahead (archlab/nn/mtp.py). Windows of S + 1 + K ids.

    L = L_main + lambda / K * sum_k L_MTP^k          lambda = train.objective.weight

DeepSeek-V3 trains with K = 1 and lambda = 0.3 for the first 10T tokens, then 0.1. The reported ``loss``
(metrics, validation) is L_main alone, the main model's next-token loss, comparable with a causal-LM
run's; ``mtp_loss`` (the modules' mean) is logged beside it. Validation and export use the main model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from torch import Tensor, nn

from archlab.config.schema import ObjectiveConfig
from archlab.errors import fail
from archlab.nn.mtp import MTPModule, mtp_layer
from archlab.objectives.base import OBJECTIVES, Loss, Objective
from archlab.objectives.causal_lm import head_loss_bytes


@dataclass
class MTPConfig(ObjectiveConfig):
    type: str = "mtp"
    weight: float = 0.3  # lambda, the MTP loss's weight (DeepSeek-V3: 0.3, later 0.1)
    renamed: ClassVar[dict[str, str]] = {"mtp_weight": "weight"}  # the flat train keys before this node


@OBJECTIVES.register("mtp")
class MultiTokenPrediction(Objective):
    """The main next-token loss plus the MTP modules' losses at weight ``train.objective.weight``."""

    name = "mtp"
    Config = MTPConfig

    @classmethod
    def validate(cls, cfg: Any) -> None:
        if cfg.model.mtp_depth < 1:
            fail("train.objective", "mtp", f"needs multi-token-prediction modules: model.mtp_depth >= 1 "
                 f"(DeepSeek-V3 uses 1); this recipe has model.mtp_depth={cfg.model.mtp_depth}")
        if cfg.model.moe is not None and cfg.model.moe.ep_size > 1:
            fail("model.moe.ep_size", cfg.model.moe.ep_size, "multi-token prediction is not verified under expert "
                 "parallelism (its MoE block's experts would be sharded like the main layers'); use ep_size=1")
        if not cfg.train.objective.weight > 0:
            fail("train.objective.weight", cfg.train.objective.weight, "must be positive (DeepSeek-V3: 0.3, later "
                 "0.1); without the MTP loss use train.objective=causal_lm and model.mtp_depth=0")

    @classmethod
    def ahead(cls, m: Any) -> int:
        return 1 + m.mtp_depth

    def loss(self, model: nn.Module, x_BW: Tensor, *, step: int = 0, micro: int = 0) -> Loss:
        inputs, targets = self.split(x_BW, self.window_ahead)
        out = model(inputs, targets=targets)  # targets (B, S + K): the main loss and the K modules' losses
        mtp = out.mtp_losses.float().mean()
        main, aux = out.loss.float(), out.aux_loss.float()
        return Loss(main=main, aux=aux, parts={"mtp_loss": mtp}, total=main + self.t.objective.weight * mtp + aux)

    @classmethod
    def forward_flops(cls, cfg: Any, seq_len: int) -> dict[str, float]:
        per_module = sum(MTPModule.forward_flops(cfg, seq_len).values())
        return {"lm_head": 2.0 * cfg.d_model * cfg.vocab_size, "mtp": cfg.mtp_depth * per_module}

    @classmethod
    def saved_bytes(cls, s: Any, loss: str, checkpointing: str, block_bytes: Any = None) -> dict[str, float]:
        cfg = s.cfg
        block = block_bytes(mtp_layer(cfg))  # the cost model's bytes of one block built as that layer
        # module 1 reads the last block's output, which the final norm keeps under pre-LN; module k > 1 reads
        # module k-1's block output, which its output norm keeps
        mtp = sum(MTPModule.saved_bytes(s, block, input_kept=k > 1 or cfg.norm.placement == "pre")
                  for k in range(1, cfg.mtp_depth + 1))
        return {"loss": float(head_loss_bytes(s, loss)), "mtp": float(mtp)}
