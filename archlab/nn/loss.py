"""Next-token cross-entropy fused with the LM head, without materialising the (N, V) logits.

Shape legend: N tokens (B*S), D model dim, V vocabulary, C tokens per chunk.

The plain path, ``cross_entropy(h @ W^T, t)``, writes N x V logits, reads them for the softmax,
writes the log-probabilities, then in backward writes an N x V zero-filled gradient and reads
everything again: at V = 8192 that is 32x the size of the hidden states, streamed through main
memory several times. Here the tokens go through in chunks of C rows: each chunk's logits stay
small enough for the cache, and the gradient of the loss with respect to them,
``softmax - onehot``, is known in the forward already, so it is consumed immediately by the two
backward matmuls (grad wrt h and wrt W). Backward then only scales the stored gradients.
The same idea as Liger-Kernel's fused linear cross-entropy, in plain torch ops.

:func:`lm_loss` is that plain path, on logits the model returned: the reference the fused loss
is tested against, and what evaluation (which has the logits anyway) uses.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

IGNORE_INDEX = -100  # targets with this id do not count (torch's cross_entropy default)
# fp32 logits per chunk: 1024 tokens at V=8192. Measured on a busy 2-core CPU (N=2048, D=256,
# V=8192, forward + backward): 256-token chunks were 20% faster than the plain loss on one thread
# but slower on two (more, smaller GEMMs); 1024-token chunks were faster on both (15% and 6%).
CHUNK_BYTES = 32 * 2**20


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h_ND: Tensor, weight_VD: Tensor, targets_N: Tensor, chunk: int) -> Tensor:
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dtype = torch.promote_types(h_ND.dtype, weight_VD.dtype)  # no autocast in here: explicit dtypes
        with torch.autocast(h_ND.device.type, enabled=False):
            h, w = h_ND.to(dtype), weight_VD.to(dtype)
            grad_h = torch.empty_like(h) if need_h else None
            grad_w = torch.zeros_like(w) if need_w else None
            valid_N = targets_N != IGNORE_INDEX
            total = h.new_zeros((), dtype=torch.float32)
            # the chunk count, not N, sets the loop: under dynamic shapes torch.compile then guards on
            # ceil(N / chunk) instead of specialising on N
            for i in range(-(-h.shape[0] // chunk)):
                start, stop = i * chunk, (i + 1) * chunk
                h_CD, t_C, ok_C = h[start:stop], targets_N[start:stop].clamp_min(0), valid_N[start:stop]
                logp_CV = torch.log_softmax((h_CD @ w.T).float(), dim=-1)
                total -= (logp_CV.gather(1, t_C[:, None]).squeeze(1) * ok_C).sum()
                if not (need_h or need_w):
                    continue
                dlogits_CV = logp_CV.exp_()  # softmax, in place
                dlogits_CV[torch.arange(len(t_C), device=t_C.device), t_C] -= 1.0  # - onehot
                dlogits_CV = dlogits_CV.to(dtype)
                # ignored tokens: their rows of dlogits count nothing. Masked on the (C, D) side
                # (h rows for grad_w, grad_h rows), C x D multiplies instead of C x V, and without
                # asking on the host whether any token is ignored (a graph break under torch.compile)
                keep_C1 = ok_C[:, None].to(dtype)
                if need_h:
                    torch.mm(dlogits_CV, w, out=grad_h[start:stop]).mul_(keep_C1)
                if need_w:
                    grad_w.addmm_(dlogits_CV.T, h_CD * keep_C1)
        denom = valid_N.sum().clamp_min(1)  # a tensor: the count stays on the device
        ctx.save_for_backward(None if grad_h is None else grad_h.to(h_ND.dtype),
                              None if grad_w is None else grad_w.to(weight_VD.dtype), denom)
        return total / denom

    @staticmethod
    def backward(ctx, grad_loss: Tensor):
        grad_h, grad_w, denom = ctx.saved_tensors
        scale = grad_loss / denom
        return (None if grad_h is None else grad_h * scale.to(grad_h.dtype),
                None if grad_w is None else grad_w * scale.to(grad_w.dtype), None, None)


def linear_cross_entropy(h_ND: Tensor, weight_VD: Tensor, targets_N: Tensor, chunk: Optional[int] = None) -> Tensor:
    """mean over counted tokens of cross_entropy(h @ weight^T, targets), computed in chunks of
    ``chunk`` tokens; equals ``F.cross_entropy(h @ weight.T, targets)`` (fp32 accumulation).
    Targets equal to -100 are ignored. The default chunk holds CHUNK_BYTES of fp32 logits."""
    if h_ND.ndim != 2 or targets_N.shape != h_ND.shape[:1]:
        raise ValueError(f"expected h (N, D) and targets (N,), got {tuple(h_ND.shape)} and {tuple(targets_N.shape)}")
    if chunk is None:
        chunk = max(1, CHUNK_BYTES // (4 * weight_VD.shape[0]))
    return _LinearCrossEntropy.apply(h_ND, weight_VD, targets_N, chunk)


def lm_loss(logits_BSV: Tensor, targets_BS: Tensor, reduction: str = "mean") -> Tensor:
    """Next-token cross-entropy in nats on (B, S, V) logits (any leading dims: (N, V) too), upcast
    to fp32: the unfused reference of :func:`linear_cross_entropy`. Targets equal to -100 are
    ignored."""
    return F.cross_entropy(logits_BSV.float().flatten(0, -2), targets_BS.flatten(), reduction=reduction)
