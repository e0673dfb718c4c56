"""The parallel block (``model.block.type: parallel``): attention and feed-forward both read the layer's
input and add to the residual together (GPT-J; PaLM sec. 2; GPT-NeoX).

Shape legend: B batch, S sequence, D model dim.

    shared_norm true  (GPT-J, PaLM):  x + attn(norm(x)) + ffn(norm(x))     one norm
    shared_norm false (GPT-NeoX):     x + attn(norm1(x)) + ffn(norm2(x))   two norms of the same x

The FFN no longer waits for the attention's output, so the two input projections can run as one
matmul (PaLM reports ~15% faster training at large scale); the FLOPs are the sequential block's.
Pre-LN only: no published model defines a post-LN parallel block (norm(x + attn(x) + ffn(x)) would
feed both branches the unnormalised residual stream).
"""

from __future__ import annotations

from typing import Optional

from torch import Tensor, nn

from archlab.config.schema import ModelConfig
from archlab.errors import fail
from archlab.model.decoder import BLOCKS, Block
from archlab.nn.attention import LayerKVCache, build_attention
from archlab.nn.component import ActShape
from archlab.nn.norms import build_norm, norm_class
from archlab.nn.positions import PosContext


@BLOCKS.register("parallel")
class ParallelBlock(Block):
    """x + drop(attn(norm(x))) + drop(ffn(norm'(x))), norm' = norm when ``shared_norm`` (``ffn_norm`` is None)."""

    options = frozenset({"shared_norm"})

    def __init__(self, cfg: ModelConfig, layer: int, causal: bool = True):
        nn.Module.__init__(self)
        self.pre = True
        self.attn_norm = build_norm(cfg, dim=cfg.d_model)
        self.attn = build_attention(cfg, layer=layer, causal=causal)
        self.ffn_norm = None if cfg.block.shared_norm else build_norm(cfg, dim=cfg.d_model)
        self.build_ffn(cfg, layer)
        self.drop = nn.Dropout(cfg.dropout)

    @classmethod
    def validate(cls, m, prefix: str = "model") -> None:
        if m.norm.placement != "pre":
            fail(f"{prefix}.block.type", m.block.type, f"the parallel block is pre-LN only (model.norm.placement="
                 f"{m.norm.placement}): both branches read norm(x) and add to x; set norm.placement=pre")

    @staticmethod
    def n_norms(cfg: ModelConfig) -> int:
        return 1 if cfg.block.shared_norm else 2

    @staticmethod
    def norms_saved_bytes(s: ActShape) -> float:
        """One norm; or two norms of the same x, whose input tensor (when a norm keeps it as it is) is kept once."""
        norm, D = norm_class(s.cfg), s.cfg.d_model
        if s.cfg.block.shared_norm:
            return s.n * norm.saved_bytes(s, dim=D)
        keeps_input, _ = norm.saved(s, dim=D)
        return s.n * (2 * norm.saved_bytes(s, dim=D) - keeps_input * D * s.act)

    @staticmethod
    def ffn_reads_attention_input(cfg: ModelConfig) -> bool:
        return cfg.block.shared_norm

    def forward(self, x_BSD: Tensor, ctx: PosContext, cache: Optional[LayerKVCache] = None):
        h_BSD = self.attn_norm(x_BSD)
        a_BSD = self.attn(h_BSD, ctx, cache)
        f_BSD, aux = self._ffn(h_BSD if self.ffn_norm is None else self.ffn_norm(x_BSD))
        return x_BSD + self.drop(a_BSD) + self.drop(f_BSD), aux
