"""Autoregressive sampling with a KV cache: temperature, top-k and top-p (nucleus) filtering.

Shape legend: B batch, S prompt length, V vocabulary.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from archlab.model.decoder import Decoder
from archlab.objectives.span_corruption import start_id as default_start


def filter_logits(logits_BV: Tensor, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """Mask to -inf every token outside the top-k and outside the smallest set whose probability
    mass reaches top_p. 0 / 1.0 switch the filter off."""
    if top_k > 0:
        kth = torch.topk(logits_BV, min(top_k, logits_BV.shape[-1]), dim=-1).values[..., -1:]
        logits_BV = logits_BV.masked_fill(logits_BV < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits_BV, descending=True, dim=-1)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop_sorted = cum - sorted_logits.softmax(-1) >= top_p  # mass before this token already >= p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits_BV = logits_BV.masked_fill(drop, float("-inf"))
    return logits_BV


def pick(logits_BV: Tensor, temperature: float, top_k: int, top_p: float, generator: Optional[torch.Generator],
         eos_id: Optional[int], done_B: Tensor) -> Tensor:
    """The next id of each sequence (B,): argmax at temperature 0, else a draw from the filtered
    distribution; a finished sequence (``done_B``, updated in place) repeats ``eos_id``."""
    if temperature == 0:
        nxt = logits_BV.argmax(-1)
    else:
        probs = filter_logits(logits_BV / temperature, top_k, top_p).softmax(-1)
        nxt = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    if eos_id is not None:
        nxt = torch.where(done_B, torch.full_like(nxt, eos_id), nxt)
        done_B |= nxt == eos_id
    return nxt


@torch.no_grad()
def generate(
    model: Decoder,
    input_ids: Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    eos_id: Optional[int] = None,
    generator: Optional[torch.Generator] = None,
) -> Tensor:
    """Continue ``input_ids`` (B, S) by up to ``max_new_tokens``; returns (B, S + new).

    temperature 0 is greedy decoding. The prompt is processed once, then one token per step
    against the KV cache.
    """
    if getattr(model.cfg, "type", None) == "encoder_decoder":
        raise ValueError("model.type=encoder_decoder: generate() continues a decoder-only model; an encoder-"
                         "decoder fills spans: generate_seq2seq(model, input_ids, ...) encodes input_ids and decodes")
    was_training = model.training
    model.eval()
    cache = model.new_kv_cache()
    out = input_ids
    logits = model(input_ids, kv_cache=cache).logits[:, -1]  # (B, V)
    done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
    for step in range(max_new_tokens):
        nxt = pick(logits, temperature, top_k, top_p, generator, eos_id, done)
        out = torch.cat([out, nxt[:, None]], dim=1)
        if step + 1 == max_new_tokens or (eos_id is not None and bool(done.all())):
            break  # the last token needs no forward pass of its own
        logits = model(nxt[:, None], kv_cache=cache).logits[:, -1]
    model.train(was_training)
    return out


@torch.no_grad()
def generate_seq2seq(
    model,
    input_ids: Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    eos_id: Optional[int] = None,
    generator: Optional[torch.Generator] = None,
    start_id: Optional[int] = None,
) -> Tensor:
    """An encoder-decoder's output for ``input_ids`` (B, M): (B, 1 + new) decoder ids, starting with
    ``start_id`` (default: the span-corruption start id, the vocabulary's last row).

    The input is encoded once; each decoder step reads its self-attention cache and each layer's
    cross-attention keys/values of the encoder's output, projected at the first step and reused
    (:class:`archlab.model.encoder_decoder.Seq2SeqCache`). temperature 0 is greedy decoding.
    """
    was_training = model.training
    model.eval()
    cache = model.new_kv_cache(input_ids)
    first = default_start(model.cfg.vocab_size) if start_id is None else start_id
    out = torch.full((input_ids.shape[0], 1), first, dtype=input_ids.dtype, device=input_ids.device)
    done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
    for _ in range(max_new_tokens):
        logits = model(None, out[:, -1:], kv_cache=cache).logits[:, -1]  # (B, V)
        out = torch.cat([out, pick(logits, temperature, top_k, top_p, generator, eos_id, done)[:, None]], dim=1)
        if eos_id is not None and bool(done.all()):
            break
    model.train(was_training)
    return out
