"""Attention capture: what one attention call computed, kept for inspection (``tools.explore``).

Shape legend: B batch, S queries, T keys, H query heads, G key/value heads, Dh / Dv head dims.

Off by default: a variant tests ``self.capture is not None`` once per forward, nothing more. While
an :class:`AttentionCapture` is set (``capture_attention(model)``), the variant passes the q, k, v,
scale, the keys each query may see and the additive score bias it handed to SDPA to
:meth:`AttentionCapture.record`, which writes the weights out explicitly:
softmax(q k^T * scale + bias + mask) and their product with v. Only full forwards are recorded (no
KV cache); generation's incremental steps are not.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional

import torch
from torch import Tensor, nn


@dataclass
class AttentionRecord:
    """One attention call of one layer, detached, in fp32."""

    q: Tensor  # (B, H, S, Dh) as SDPA saw it (after RoPE / q-k norm)
    k: Tensor  # (B, G, T, Dh)
    v: Tensor  # (B, G, T, Dv)
    scale: float
    allowed: Tensor  # (S, T) bool: the keys each query may see (causal, window; all for an encoder)
    bias: Optional[Tensor]  # (H, S, T) additive score bias (ALiBi, T5 relative), or None
    scores: Tensor  # (B, H, S, T) q k^T * scale, before bias and mask
    probs: Tensor  # (B, H, S, T) softmax(scores + bias, masked), rows sum to 1
    out: Tensor  # (B, H, S, Dv) probs @ v: the heads' outputs before the output projection

    @property
    def kv_head(self) -> list[int]:
        """The key/value head each query head reads (GQA / MQA share one among H // G heads)."""
        H, G = self.q.shape[1], self.k.shape[1]
        return [h // (H // G) for h in range(H)]


class AttentionCapture:
    """The records of one attention module, in call order."""

    def __init__(self):
        self.records: list[AttentionRecord] = []

    @torch.no_grad()
    def record(self, q: Tensor, k: Tensor, v: Tensor, *, scale: float, allowed: Tensor,
               bias: Optional[Tensor] = None) -> None:
        q, k, v = q.detach().float(), k.detach().float(), v.detach().float()
        H, G = q.shape[1], k.shape[1]
        k_rep, v_rep = k.repeat_interleave(H // G, dim=1), v.repeat_interleave(H // G, dim=1)  # (B, H, T, D)
        scores = q @ k_rep.transpose(-1, -2) * scale  # (B, H, S, T)
        logits = scores if bias is None else scores + bias.float()
        probs = logits.masked_fill(~allowed, float("-inf")).softmax(-1)
        self.records.append(AttentionRecord(q, k, v, float(scale), allowed.clone(),
                                            None if bias is None else bias.detach().float(), scores, probs,
                                            probs @ v_rep))


class Capturable:
    """Mixed into every attention module: ``capture`` is None (off) or where its calls are recorded."""

    capture: Optional[AttentionCapture] = None


def causal_allowed(S: int, T: int, device=None, window: Optional[int] = None) -> Tensor:
    """(S, T) bool: query i (at position T - S + i) sees key j when 0 <= i' - j (< window)."""
    offset = torch.arange(T - S, T, device=device)[:, None] - torch.arange(T, device=device)[None, :]
    ok = offset >= 0
    return ok & (offset < window) if window is not None else ok


@contextmanager
def capture_attention(model: nn.Module) -> Iterator[dict[str, AttentionCapture]]:
    """{module name: capture} for every attention module of ``model`` (self- and cross-attention)
    while the block runs; the modules are reset to no capture on exit."""
    mods = {name: m for name, m in model.named_modules() if isinstance(m, Capturable)}
    caps = {name: AttentionCapture() for name in mods}
    for name, m in mods.items():
        m.capture = caps[name]
    try:
        yield caps
    finally:
        for m in mods.values():
            m.capture = None
