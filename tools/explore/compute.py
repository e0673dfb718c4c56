"""The numbers each view shows, read from the real modules in one forward with
``archlab.nn.attention.capture`` and ``archlab.nn.moe.capture`` on.

Shape legend: S prompt tokens, T keys, V vocabulary, H heads, E experts, K experts per token.

``analyse(ex, text)`` returns the page's JSON for one model: tokens (id, text, character span),
the next-token logits (all V: the page computes softmax(logits / T) after top-k / top-p itself,
exactly as ``archlab.model.generate.filter_logits``), the data flow, each layer's attention
weights per head, the MoE routing per token, BERT's masked prediction at every position and T5's
span filling, the residual stream's norm per block, the logit lens and the KV cache.
``detail(...)`` adds one head's Q, K, V, scores, bias, mask and output, and its block's norms,
output projection and feed-forward internals.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from archlab.model.generate import generate, generate_seq2seq
from archlab.nn.attention.capture import AttentionRecord, capture_attention
from archlab.nn.attention.gated_deltanet import gdn_dims
from archlab.nn.moe.capture import capture_routing
from archlab.nn.moe.experts import capacity_for, dispatch
from archlab.objectives.mlm import mask_id
from archlab.objectives.span_corruption import sentinel_ids, start_id
from tools.explore.encode import array, decode
from tools.explore.kvcache import kv_view, layer_bytes
from tools.explore.load import Explorable, ExploreError
from tools.explore.steps import _stacks, block_steps, capture_steps, logit_lens, residual

GDN = "gated_deltanet"  # the fixed-state mixer: no attention map, no KV cache that grows
TOP = 20  # bars of the next-token view
MAX_CHARS = 20_000  # longest prompt accepted (characters), before tokenizing
MAX_NEW = 64  # most tokens one "generate N" adds
SPAN_TOKENS = 24  # T5 span filling: decoder steps
MASK_MARK = "[MASK]"
SENTINEL = re.compile(r"<extra_id_(\d+)>")
MAX_SENTINELS = 100


@dataclass
class Analysis:
    """One model's page data, and the captured records the detail view reads."""

    data: dict
    records: dict[tuple[str, int], AttentionRecord] = field(default_factory=dict)  # (stack, layer) -> record
    steps: dict[tuple[str, int], dict] = field(default_factory=dict)  # (stack, layer) -> tensors (tools.explore.steps)
    rerun: Optional[Callable[[], None]] = None  # the forward again (with capture_steps on): the blocks' insides
    inside: dict[tuple[str, int], dict] = field(default_factory=dict)  # filled by the first detail() that needs it
    stateful: dict[tuple[str, int], dict] = field(default_factory=dict)  # (stack, layer) -> a state mixer's facts


def token_text(ex: Explorable, i: int) -> str:
    """How token ``i`` reads in the page: special ids named, a lone UTF-8 byte as <0xNN>."""
    m = ex.model.cfg
    if ex.kind == "encoder" and i == mask_id(m):
        return MASK_MARK
    if ex.kind == "encoder_decoder":
        if i == start_id(m.vocab_size):
            return "<start>"
        if m.vocab_size - 1 - MAX_SENTINELS <= i <= m.vocab_size - 2:
            return f"<extra_id_{m.vocab_size - 2 - i}>"
    s = ex.codec.decode([i])
    if ex.byte_codec and i < 256 and ("\ufffd" in s or not (s.isprintable() or s in "\n\t")):
        return f"<0x{i:02X}>"
    return s


def _check_encodable(ex: Explorable, piece: str) -> None:
    bad = []
    for c in sorted(set(piece)):
        if not c.strip():
            continue
        d = ex.codec.decode(ex.codec.encode(c))
        if not d.strip() or "\ufffd" in d or "[UNK]" in d or "<unk>" in d:
            bad.append(c)
    if bad:
        raise ExploreError(f"the tokenizer of {ex.label} cannot encode the characters {''.join(bad)!r}: remove them")


def _markers(ex: Explorable) -> Optional[re.Pattern]:
    if ex.kind == "encoder":
        return re.compile(re.escape(MASK_MARK))
    if ex.kind == "encoder_decoder":
        return SENTINEL
    return None


def encode_prompt(ex: Explorable, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Token ids and their character spans; BERT's [MASK] and T5's <extra_id_N> become their ids."""
    if not isinstance(text, str) or not text:
        raise ExploreError("the prompt is empty: type at least one character")
    if len(text) > MAX_CHARS:
        raise ExploreError(f"the prompt has {len(text)} characters; at most {MAX_CHARS} are accepted")
    ids: list[int] = []
    spans: list[tuple[int, int]] = []
    pattern, at = _markers(ex), 0
    marks = list(pattern.finditer(text)) if pattern else []
    for piece_end, mark in [(mk.start(), mk) for mk in marks] + [(len(text), None)]:
        piece = text[at:piece_end]
        if piece:
            _check_encodable(ex, piece)
            piece_ids = ex.codec.encode(piece)
            prev = 0
            for n in range(1, len(piece_ids) + 1):
                cur = max(prev, min(len(piece), len(ex.codec.decode(piece_ids[:n]).rstrip("\ufffd"))))
                spans.append((at + prev, at + cur))
                prev = cur
            ids += piece_ids
        if mark is not None:
            if ex.kind == "encoder":
                ids.append(mask_id(ex.model.cfg))
            else:
                n = int(mark.group(1))
                if n >= MAX_SENTINELS:
                    raise ExploreError(f"{mark.group(0)}: sentinels are numbered 0 to {MAX_SENTINELS - 1}")
                ids.append(int(sentinel_ids(ex.model.cfg.vocab_size, n + 1)[-1]))
            spans.append((mark.start(), mark.end()))
            at = mark.end()
    if not ids:
        raise ExploreError("the prompt encodes to no tokens: type at least one character")
    limit = ex.max_len
    if limit is not None and len(ids) > limit:
        raise ExploreError(f"the prompt is {len(ids)} tokens; {ex.label} reads at most {limit} "
                           "(model.max_seq_len): shorten it")
    V = ex.model.cfg.vocab_size
    if max(ids) >= V:
        raise ExploreError(f"token id {max(ids)} is outside {ex.label}'s vocabulary (model.vocab_size={V})")
    return ids, spans


def _tokens(ex: Explorable, ids: list[int], spans=None) -> list[dict]:
    return [{"id": i, "text": token_text(ex, i), "span": list(spans[n]) if spans else None}
            for n, i in enumerate(ids)]


def _top(ex: Explorable, logits_V: torch.Tensor) -> list[dict]:
    vals, idx = logits_V.topk(min(TOP, logits_V.shape[-1]))
    return [{"id": int(i), "text": token_text(ex, int(i)), "logit": float(v)} for v, i in zip(vals, idx)]


def _layer_of(name: str) -> tuple[str, int]:
    """(stack, layer) of a captured module: blocks.3.attn -> (self, 3); encoder_blocks.1.attn ->
    (encoder, 1); blocks.2.cross -> (cross, 2)."""
    parts = name.split(".")
    stack = "encoder" if parts[0] == "encoder_blocks" else "cross" if parts[-1] == "cross" else "self"
    return stack, int(parts[1])


def flow(ex: Explorable) -> dict:
    """The data-flow overview: embedding + position -> blocks per stack -> final norm -> head."""
    m, model = ex.model.cfg, ex.model

    def blocks(mods) -> list[dict]:
        out = []
        for i, b in enumerate(mods):
            a = b.attn
            kind = a.type_name
            heads, kv_heads = m.n_heads, getattr(a, "n_kv_heads", m.n_heads)
            if kind == GDN:
                kv_heads, heads = gdn_dims(m)[:2]  # key heads, value heads
            out.append({"layer": i, "attention": kind, "heads": heads,
                        "kv_heads": kv_heads, "window": getattr(a, "window", None),
                        "causal": a.causal, "cross": hasattr(b, "cross"),
                        "ffn": (f"MoE: {m.moe.num_experts} experts, top-{m.moe.top_k}"
                                + (f", {m.moe.n_shared_experts} shared" if m.moe.n_shared_experts else "")
                                if getattr(b, "is_moe", False) else f"FFN ({m.ffn.type})")})
        return out

    stacks = [{"name": "decoder" if ex.kind != "encoder" else "encoder", "blocks": blocks(model.blocks)}]
    if ex.kind == "encoder_decoder":
        stacks.insert(0, {"name": "encoder", "blocks": blocks(model.encoder_blocks)})
    return {"embedding": f"token embedding ({m.vocab_size} x {m.d_model})", "position": m.position.type,
            "norm": f"{m.norm.type} ({m.norm.placement}-norm)", "stacks": stacks,
            "head": f"LM head ({m.d_model} -> {m.vocab_size}){', tied to the embedding' if m.tie_embeddings else ''}"}


def _mixers(ex: Explorable) -> dict[str, list[str]]:
    """Each stack's token mixer per block (``block.attn.type_name``)."""
    return {stack: [b.attn.type_name for b in blocks] for stack, blocks in _stacks(ex.model).items()}


def _attention_type(mixers: dict[str, list[str]]) -> str:
    """The one mixer every block uses, else the pattern: "hybrid: gated_deltanet x3, mha x1" (in block order)."""
    kinds = [k for ks in mixers.values() for k in ks]
    if len(set(kinds)) == 1:
        return kinds[0]
    runs: list[list] = []
    for k in mixers["self"]:
        if runs and runs[-1][0] == k:
            runs[-1][1] += 1
        else:
            runs.append([k, 1])
    return "hybrid: " + ", ".join(f"{k} x{n}" for k, n in runs)


def _stateful(ex: Explorable, S: int) -> dict[tuple[str, int], dict]:
    """The Gated DeltaNet blocks: what they keep instead of the keys and values (no attention map)."""
    m = ex.model.cfg
    out = {}
    for stack, kinds in _mixers(ex).items():
        for i, kind in enumerate(kinds):
            if kind == GDN:
                hk, hv, dk, dv = gdn_dims(m)
                out[(stack, i)] = {"mixer": kind, "state_bytes": layer_bytes(m, i, S), "tokens": S,
                                   "k_heads": hk, "v_heads": hv, "d_k": dk, "d_v": dv}
    return out


def _attention(caps) -> tuple[dict, dict]:
    views: dict[str, list] = {}
    records = {}
    for name, cap in caps.items():
        if not cap.records:
            continue
        rec = cap.records[-1]
        stack, layer = _layer_of(name)
        records[(stack, layer)] = rec
        views.setdefault(stack, []).append({
            "layer": layer, "heads": rec.q.shape[1], "kv_head": rec.kv_head, "has_bias": rec.bias is not None,
            "probs": array(rec.probs[0]), "allowed": array(rec.allowed, "u8")})
    for v in views.values():
        v.sort(key=lambda r: r["layer"])
    return views, records


def _moe(ex: Explorable, caps) -> list[dict]:
    m = ex.model.cfg
    out = []
    for name, routings in caps.items():
        if not routings:
            continue
        r = routings[-1]
        N = r.experts_NK.shape[0]
        d = dispatch(r.experts_NK, r.weights_NK, m.moe.num_experts, capacity_for(N, m.moe))
        out.append({"layer": int(name.split(".")[1]), "stack": "encoder" if name.startswith("encoder") else "self",
                    "router": m.moe.router.type, "num_experts": m.moe.num_experts, "top_k": m.moe.top_k,
                    "shared": m.moe.n_shared_experts, "experts": array(r.experts_NK, "i32"),
                    "weights": array(r.weights_NK), "probs": array(r.probs_NE),
                    "load": torch.bincount(r.experts_NK.flatten(), minlength=m.moe.num_experts).tolist(),
                    "dropped": array(d.dropped_NK(), "u8")})
    return sorted(out, key=lambda x: (x["stack"], x["layer"]))


@torch.no_grad()
def _masked(ex: Explorable, ids: list[int]) -> dict:
    """BERT: the prediction at each position with that position replaced by [MASK] (one batch of S rows)."""
    S, mid = len(ids), mask_id(ex.model.cfg)
    batch = torch.tensor([ids] * S)
    batch[torch.arange(S), torch.arange(S)] = mid
    logits_SV = ex.model(batch).logits[torch.arange(S), torch.arange(S)]  # (S, V)
    return {"logits": array(logits_SV), "top": [_top(ex, row) for row in logits_SV]}


def _span_filling(ex: Explorable, ids: list[int], text: str, out_ids: list[int]) -> str:
    """The prompt with each <extra_id_N> replaced by the decoder's span behind that sentinel."""
    V = ex.model.cfg.vocab_size
    spans: dict[int, list[int]] = {}
    current = None
    for i in out_ids[1:]:
        if V - 1 - MAX_SENTINELS <= i <= V - 2:
            current = V - 2 - i
            spans[current] = []
        elif ex.codec.eos_id is not None and i == ex.codec.eos_id:
            break
        elif current is not None:
            spans[current].append(i)
    return SENTINEL.sub(lambda mk: "[" + ex.codec.decode(spans.get(int(mk.group(1)), [])) + "]", text)


@torch.no_grad()
def analyse(ex: Explorable, text: str) -> Analysis:
    """The page data of ``text`` for one model."""
    ids, spans = encode_prompt(ex, text)
    x = torch.tensor([ids])
    data: dict = {"label": ex.label, "kind": ex.kind, "text": text, "tokens": _tokens(ex, ids, spans),
                  "vocab_size": ex.model.cfg.vocab_size, "max_len": ex.max_len, "flow": flow(ex),
                  "position": ex.model.cfg.position.type}
    mixers = _mixers(ex)
    data["attention_type"], data["mixers"] = _attention_type(mixers), mixers
    with capture_attention(ex.model) as att, capture_routing(ex.model) as rt:
        if ex.kind == "encoder_decoder":
            out_ids = generate_seq2seq(ex.model, x, SPAN_TOKENS, temperature=0.0,
                                       eos_id=ex.codec.eos_id)[0].tolist()
            for c in att.values():
                c.records.clear()
            for r in rt.values():
                r.clear()
            def forward():
                return ex.model(x, decoder_input_ids=torch.tensor([out_ids])).logits[0]
        else:
            def forward():
                return ex.model(x).logits[0]  # (S, V)
        with capture_steps(ex.model, inside=False) as steps:
            logits = forward()
    data["attention"], records = _attention(att)
    L = ex.model.cfg.n_layers
    data["residual"] = {stack: residual(steps, stack, L) for stack in ("encoder", "self") if (stack, 0) in steps}
    an = Analysis(data, records, steps, stateful=_stateful(ex, len(ids)))

    def rerun() -> None:
        with torch.no_grad(), capture_steps(ex.model) as inside:
            forward()
        an.inside = inside
    an.rerun = rerun
    data["lens"] = lens(an, ex, logits.shape[0] - 1)
    if ex.kind == "decoder":
        data["kv_cache"] = kv_view(ex.model.cfg, len(ids), ex.max_len)
    data["moe"] = _moe(ex, rt)
    if ex.kind == "encoder":
        data["masked"] = _masked(ex, ids)
    else:
        data["next"] = {"logits": array(logits[-1]), "top": _top(ex, logits[-1])}
    if ex.kind == "encoder_decoder":
        data["decoder_tokens"] = _tokens(ex, out_ids)
        data["filled"] = _span_filling(ex, ids, text, out_ids)
    return an


def detail(an: Analysis, stack: str, layer: int, head: int) -> dict:
    """One head's Q, K, V, scaled scores, bias, mask, softmax and output, and its block's steps; for a Gated
    DeltaNet block (no attention map) its ``mixer``, the bytes of its fixed-size state and its block's steps."""
    rec = an.records.get((stack, layer))
    state = an.stateful.get(("self" if stack == "cross" else stack, layer))
    if rec is None and state is not None and stack != "cross":
        return {"stack": stack, "layer": layer, "head": 0, **state, "block": block_steps(_inside(an), stack, layer)}
    if rec is None:
        raise ExploreError(f"no {stack} attention at layer {layer}")
    H = rec.q.shape[1]
    if not 0 <= head < H:
        raise ExploreError(f"head {head}: this layer has heads 0 to {H - 1}")
    g = rec.kv_head[head]
    return {"stack": stack, "layer": layer, "head": head, "kv_head": g, "scale": rec.scale,
            "q": array(rec.q[0, head]), "k": array(rec.k[0, g]), "v": array(rec.v[0, g]),
            "scores": array(rec.scores[0, head]), "bias": None if rec.bias is None else array(rec.bias[head]),
            "allowed": array(rec.allowed, "u8"), "probs": array(rec.probs[0, head]),
            "out": array(rec.out[0, head]),
            "block": block_steps(_inside(an), "self" if stack == "cross" else stack, layer)}


def _inside(an: Analysis) -> dict:
    """The blocks' norms, projections and FFN internals: a second forward, on the first detail asked
    (a new prompt's page does not wait for them)."""
    if not an.inside and an.rerun is not None:
        an.rerun()
    return an.inside


def lens(an: Analysis, ex: Explorable, pos: int) -> dict:
    """The logit lens at position ``pos`` (``tools.explore.steps.logit_lens``) with its tokens' texts."""
    S = an.steps[("self", 0)]["resid_in"].shape[0]
    if not 0 <= pos < S:
        raise ExploreError(f"lens position {pos}: this text has positions 0 to {S - 1}")
    out = logit_lens(ex.model, an.steps, ex.model.cfg.n_layers, pos)
    out["names"] = {int(i): token_text(ex, int(i)) for i in decode(out["ids"]).flatten()}
    return out


def generate_text(ex: Explorable, text: str, n: int, temperature: float, top_k: int, top_p: float,
                  seed: int) -> str:
    """``text`` continued by ``n`` tokens drawn as ``archlab.generate`` draws them."""
    if ex.kind != "decoder":
        raise ExploreError(f"{ex.label} is an {ex.kind}: it does not continue text left to right")
    if not 1 <= n <= MAX_NEW:
        raise ExploreError(f"generate {n}: choose 1 to {MAX_NEW} tokens")
    if temperature < 0 or top_k < 0 or not 0 < top_p <= 1:
        raise ExploreError("temperature >= 0, top-k >= 0 and top-p in (0, 1] are required")
    ids, _ = encode_prompt(ex, text)
    if ex.max_len is not None and len(ids) + n > ex.max_len:
        raise ExploreError(f"{len(ids)} prompt tokens + {n} new exceed {ex.label}'s {ex.max_len} positions")
    gen = torch.Generator().manual_seed(seed)
    out = generate(ex.model, torch.tensor([ids]), n, temperature=temperature, top_k=top_k, top_p=top_p,
                           generator=gen)
    return text + ex.codec.decode(out[0, len(ids):].tolist())
