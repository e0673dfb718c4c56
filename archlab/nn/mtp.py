"""Multi-token prediction modules (DeepSeek-V3, sec. 2.2): ``model.mtp_depth`` = D sequential modules.

Shape legend: B batch, S sequence, D model dim (``d_model``; the depth is written k), V vocabulary.

Module k (1..D) predicts, at position i, the token k+1 places ahead (t_{i+k+1}). It combines the
hidden state of depth k-1 at i (depth 0: the main model's residual stream after its last block,
before the final norm) with the embedding of token t_{i+k}:

    h'_i^k = M_k [RMSNorm(h_i^{k-1}); RMSNorm(Emb(t_{i+k}))]       M_k: a (2D -> D) projection
    h^k    = TRM_k(h'^k)                                            one transformer block
    P^k    = OutHead(norm_k(h^k))                                   the main model's LM head, shared

(the order inside the brackets is the paper's equation 21; DeepSeek's released weights and vLLM
concatenate [embedding; hidden] instead). The token embedding and the LM head are the main model's
(shared, as in the paper); the embedding here is the token table alone (no absolute position: the
block's own position encoding, RoPE in every DeepSeek recipe, places it). Each module has its own
output norm before the shared head, as DeepSeek-V3's released MTP layer does (``shared_head.norm``).
The block is built like the main model's last layer (an MoE block where that layer is MoE, as in
DeepSeek-V3). The modules are dropped at inference and export: generation and the KV cache use
the main model only.

The training loss (``archlab.objectives.mtp``) is L_main + lambda / D * sum_k L_MTP^k.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch
from torch import Tensor, nn

from archlab.nn.attention import attention_class
from archlab.nn.component import ID_BYTES, ActShape
from archlab.nn.ffn import ffn_class
from archlab.nn.moe.layer import MoELayer
from archlab.nn.norms import build_norm, norm_class, norm_params

if TYPE_CHECKING:
    from archlab.config.schema import ModelConfig


def mtp_layer(cfg: "ModelConfig") -> int:
    """The layer index an MTP module's block is built as: the main model's last layer."""
    return cfg.n_layers - 1


class MTPModule(nn.Module):
    """One depth of multi-token prediction: two norms, the (2D -> D) projection, one block, an output norm."""

    def __init__(self, cfg: "ModelConfig", block: type[nn.Module]):
        """``block``: the main model's block class (``model.block.type``), built as its last layer."""
        super().__init__()
        self.hidden_norm = build_norm(cfg, dim=cfg.d_model)
        self.embed_norm = build_norm(cfg, dim=cfg.d_model)
        self.proj = nn.Linear(2 * cfg.d_model, cfg.d_model, bias=False)
        self.block = block(cfg, mtp_layer(cfg))  # the main model's block layout
        self.out_norm = build_norm(cfg, dim=cfg.d_model)

    def forward(self, h_BSD: Tensor, emb_BSD: Tensor, ctx, run_block) -> tuple[Tensor, Optional[Tensor]]:
        """(h^k (B, S, D) before the output norm, the block's balancing loss or None). ``run_block(block, x,
        ctx)`` runs the block as the decoder runs its own (activation checkpointing included)."""
        x = self.proj(torch.cat([self.hidden_norm(h_BSD), self.embed_norm(emb_BSD)], dim=-1))  # (B, S, D)
        return run_block(self.block, x, ctx)

    # ------------------------------------------------------------------ facts

    @staticmethod
    def num_params(cfg: "ModelConfig", block: type[nn.Module]) -> int:
        D = cfg.d_model
        return 3 * norm_params(cfg, dim=D) + 2 * D * D + block.num_params(cfg, mtp_layer(cfg))

    @staticmethod
    def forward_flops(cfg: "ModelConfig", seq_len: int) -> dict[str, float]:
        """Forward matmul FLOPs per token of one module, by part: the projection, the block's attention and
        FFN (or experts and router), and the shared LM head it calls (2 * D * V)."""
        D, layer = cfg.d_model, mtp_layer(cfg)
        attn = sum(attention_class(cfg, layer).forward_flops(cfg, seq_len, layer=layer).values())
        if cfg.is_moe_layer(layer):
            ffn = sum(MoELayer.forward_flops(cfg))
        else:
            ffn = ffn_class(cfg).forward_flops(d_model=cfg.d_model, hidden=cfg.ffn_hidden)
        return {"proj": 2.0 * 2 * D * D, "attention": attn, "ffn": ffn, "lm_head": 2.0 * D * cfg.vocab_size}

    @staticmethod
    def saved_bytes(s: ActShape, block_bytes: float, input_kept: bool) -> float:
        """Bytes one module keeps for backward besides its block's (``block_bytes``, from the cost model's
        per-layer formula in the run's checkpointing mode): its two input norms, the projection's input (the
        (N, 2D) concatenation), the output norm, and the fused loss on the shared head (gradients wrt its
        input and the head's weight, the token count). ``input_kept``: another norm reads the same hidden
        state (the main model's final norm under pre-LN, the previous module's output norm), and what a
        norm keeps of its input tensor as it is (``Norm.saved``) is counted there."""
        cfg, n, a = s.cfg, s.n, s.act
        D, V = cfg.d_model, cfg.vocab_size
        norm = norm_class(cfg)
        keeps_input, _ = norm.saved(s, dim=D)
        norms = 3 * n * norm.saved_bytes(s, dim=D) - (n * D * a if input_kept and keeps_input else 0)
        return norms + n * 2 * D * a + block_bytes + n * D * a + V * D * a + ID_BYTES
