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
# V=8192, forward + backward): on one thread 256 and 512 were 4% faster than 1024 (its two 32 MB
# buffers are fresh mappings, see _forward_eager), on two threads of a loaded machine 1024 was
# 15% faster than 512 (half the chunks, half the parallel regions that wait on a descheduled thread).
CHUNK_BYTES = 32 * 2**20


def _forward_eager(h: Tensor, w: Tensor, b: Optional[Tensor], targets_N: Tensor, valid_N: Tensor, chunk: int,
                   need_h: bool, need_w: bool, need_b: bool
                   ) -> tuple[Tensor, Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
    """(summed loss, grad_h, grad_W, grad_b) without autograd, eager: every chunk writes its logits and
    probabilities into the same two (C, V) buffers (a fresh C x V tensor per chunk can be a fresh
    mapping from the allocator, glibc maps every allocation of 32 MB and more anew, and its page
    faults cost about as much as the softmax, measured on CPU). The loss reads log-sum-exp off the
    softmax itself: at the row's largest logit p_max = exp(logit_max - lse), and p_max >= 1/V
    cannot underflow; so no log-softmax pass and no exp pass over C x V, just the softmax (one
    fused pass) and two max reductions (values only), together measured 3x cheaper."""
    N, V = h.shape[0], w.shape[0]
    t_N1 = targets_N.clamp_min(0)[:, None]
    # ignored tokens count nothing: their rows of h are zeroed for grad_W, their rows of grad_h at
    # the end (N x D multiplies, not N x V)
    keep_N1 = valid_N[:, None].to(h.dtype)
    h_kept = h * keep_N1 if need_w else None
    grad_h = torch.empty_like(h) if need_h else None
    grad_w = (torch.empty_like(w) if N else torch.zeros_like(w)) if need_w else None  # chunk 0 writes it
    grad_b = torch.zeros(V, dtype=torch.float32, device=h.device) if need_b else None
    logits_buf = h.new_empty(min(chunk, N), V)
    probs_buf = h.new_empty(min(chunk, N), V, dtype=torch.float32)
    losses = [h.new_zeros(0, dtype=torch.float32)]
    for i in range(-(-N // chunk)):
        rows = slice(i * chunk, (i + 1) * chunk)
        h_CD, t_C1 = h[rows], t_N1[rows]
        if b is None:
            logits_CV = torch.mm(h_CD, w.T, out=logits_buf[:h_CD.shape[0]])
        else:
            logits_CV = torch.addmm(b, h_CD, w.T, out=logits_buf[:h_CD.shape[0]])
        probs_CV = torch.softmax(logits_CV, 1, dtype=torch.float32, out=probs_buf[:h_CD.shape[0]])
        lse_C1 = logits_CV.amax(1, keepdim=True).float() - probs_CV.amax(1, keepdim=True).log()
        losses.append((lse_C1 - logits_CV.gather(1, t_C1).float()).squeeze(1))
        if not (need_h or need_w or need_b):
            continue
        dlogits_CV = probs_CV.scatter_add_(1, t_C1, probs_CV.new_full(t_C1.shape, -1.0)).to(h.dtype)  # - onehot
        if need_b:  # the counted rows' sum (elementwise: no matmul)
            grad_b += (dlogits_CV * keep_N1[rows]).sum(0, dtype=torch.float32)
        if need_h:
            torch.mm(dlogits_CV, w, out=grad_h[rows])
        if need_w and i == 0:
            torch.mm(dlogits_CV.T, h_kept[rows], out=grad_w)
        elif need_w:
            grad_w.addmm_(dlogits_CV.T, h_kept[rows])
    if need_h:
        grad_h.mul_(keep_N1)
    return (torch.cat(losses) * valid_N).sum(), grad_h, grad_w, grad_b


def _forward_compiled(h: Tensor, w: Tensor, b: Optional[Tensor], targets_N: Tensor, valid_N: Tensor, chunk: int,
                      need_h: bool, need_w: bool, need_b: bool
                      ) -> tuple[Tensor, Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
    """:func:`_forward_eager` in the form torch.compile handles best (measured 5-10% faster
    compiled than the eager form): log-softmax and its exp in place, so that the compiled graph
    fuses them into one loop over the chunk's logits buffer, and no buffers of our own (the
    compiler plans the memory). Ignored tokens are masked on the (C, D) side, without asking on
    the host whether any token is ignored (a graph break)."""
    grad_h = torch.empty_like(h) if need_h else None
    grad_w = torch.zeros_like(w) if need_w else None
    grad_b = h.new_zeros(w.shape[0], dtype=torch.float32) if need_b else None
    total = h.new_zeros((), dtype=torch.float32)
    # the chunk count, not N, sets the loop: under dynamic shapes torch.compile then guards on
    # ceil(N / chunk) instead of specialising on N
    for i in range(-(-h.shape[0] // chunk)):
        start, stop = i * chunk, (i + 1) * chunk
        h_CD, t_C, ok_C = h[start:stop], targets_N[start:stop].clamp_min(0), valid_N[start:stop]
        logits_CV = h_CD @ w.T if b is None else torch.addmm(b, h_CD, w.T)
        logp_CV = torch.log_softmax(logits_CV.float(), dim=-1)
        total -= (logp_CV.gather(1, t_C[:, None]).squeeze(1) * ok_C).sum()
        if not (need_h or need_w or need_b):
            continue
        dlogits_CV = logp_CV.exp_()  # softmax, in place
        dlogits_CV[torch.arange(len(t_C), device=t_C.device), t_C] -= 1.0  # - onehot
        dlogits_CV = dlogits_CV.to(h.dtype)
        keep_C1 = ok_C[:, None].to(h.dtype)
        if need_h:
            torch.mm(dlogits_CV, w, out=grad_h[start:stop]).mul_(keep_C1)
        if need_w:
            grad_w.addmm_(dlogits_CV.T, h_CD * keep_C1)
        if need_b:
            grad_b += (dlogits_CV * keep_C1).sum(0, dtype=torch.float32)
    return total, grad_h, grad_w, grad_b


class _LinearCrossEntropy(torch.autograd.Function):
    """Per chunk of C tokens: logits = h W^T (+ b) and the loss, then softmax - onehot, the gradient
    wrt the logits, consumed at once by grad_h = dlogits W, grad_W += dlogits^T h and grad_b += its
    column sums; backward only scales them."""

    @staticmethod
    def forward(ctx, h_ND: Tensor, weight_VD: Tensor, targets_N: Tensor, chunk: int,
                bias_V: Optional[Tensor] = None) -> Tensor:
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        need_b = bias_V is not None and ctx.needs_input_grad[4]
        dtype = torch.promote_types(h_ND.dtype, weight_VD.dtype)  # no autocast in here: explicit dtypes
        with torch.autocast(h_ND.device.type, enabled=False):
            h, w = h_ND.to(dtype), weight_VD.to(dtype)
            b = None if bias_V is None else bias_V.to(dtype)
            valid_N = targets_N != IGNORE_INDEX
            forward = _forward_compiled if torch.compiler.is_compiling() else _forward_eager
            total, grad_h, grad_w, grad_b = forward(h, w, b, targets_N, valid_N, chunk, need_h, need_w, need_b)
        denom = valid_N.sum().clamp_min(1)  # a tensor: the count stays on the device
        ctx.save_for_backward(None if grad_h is None else grad_h.to(h_ND.dtype),
                              None if grad_w is None else grad_w.to(weight_VD.dtype),
                              None if grad_b is None else grad_b.to(bias_V.dtype), denom)
        return total / denom

    @staticmethod
    def backward(ctx, grad_loss: Tensor):
        grad_h, grad_w, grad_b, denom = ctx.saved_tensors
        scale = grad_loss / denom
        return (None if grad_h is None else grad_h * scale.to(grad_h.dtype),
                None if grad_w is None else grad_w * scale.to(grad_w.dtype), None, None,
                None if grad_b is None else grad_b * scale.to(grad_b.dtype))


def linear_cross_entropy(h_ND: Tensor, weight_VD: Tensor, targets_N: Tensor, chunk: Optional[int] = None,
                         bias_V: Optional[Tensor] = None) -> Tensor:
    """mean over counted tokens of cross_entropy(h @ weight^T + bias, targets), computed in chunks of
    ``chunk`` tokens; equals ``F.cross_entropy(F.linear(h, weight, bias), targets)`` (fp32 accumulation).
    Targets equal to -100 are ignored. The default chunk holds CHUNK_BYTES of fp32 logits. ``bias_V``: an
    output bias (BERT's MLM head), or None."""
    if h_ND.ndim != 2 or targets_N.shape != h_ND.shape[:1]:
        raise ValueError(f"expected h (N, D) and targets (N,), got {tuple(h_ND.shape)} and {tuple(targets_N.shape)}")
    if chunk is None:
        chunk = max(1, CHUNK_BYTES // (4 * weight_VD.shape[0]))
    return _LinearCrossEntropy.apply(h_ND, weight_VD, targets_N, chunk, bias_V)


def lm_loss(logits_BSV: Tensor, targets_BS: Tensor, reduction: str = "mean") -> Tensor:
    """Next-token cross-entropy in nats on (B, S, V) logits (any leading dims: (N, V) too), upcast
    to fp32: the unfused reference of :func:`linear_cross_entropy`. Targets equal to -100 are
    ignored."""
    return F.cross_entropy(logits_BSV.float().flatten(0, -2), targets_BS.flatten(), reduction=reduction)
