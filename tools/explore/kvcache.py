"""The KV-cache view: what generation keeps per layer, in bytes, as the attention classes state it
(``kv_cache_bytes`` of ``archlab.nn.attention``), for the run's own attention and for the other
variants at the same width (d_model, heads, head dim).

Prefill of S prompt tokens stores ``kv_cache_bytes(S)`` per layer; each decoded token adds
``kv_cache_bytes(S + 1) - kv_cache_bytes(S)`` (0 once a sliding window is full).
"""

from __future__ import annotations

from dataclasses import replace

from archlab.nn.attention import attention_class, layer_type
from archlab.nn.attention.mha import MHAConfig
from archlab.nn.attention.mla import MLAConfig
from archlab.nn.attention.sliding import SlidingWindowConfig

DTYPE_BYTES = 4  # the explorer runs the model in fp32
SLIDING_WINDOW = 64  # window of the sliding-window row when the run has none
# the MLA row when the run has none: DeepSeek-V3's proportions (latent C = 4 head dims, RoPE key R = half of one)


def _variants(cfg) -> list[tuple[str, str, object]]:
    """(name, what it keeps per position, config) of each variant at the run's width."""
    H, Dh, a = cfg.n_heads, cfg.d_head, cfg.attention
    # a hybrid's rows: each variant in every layer (no pattern), set with the variant's own config
    plain = replace(cfg.layers, pattern=None) if getattr(cfg.layers, "pattern", None) else cfg.layers
    gqa = cfg.kv_heads if 1 < cfg.kv_heads < H else max(1, H // 4 if H % 4 == 0 else H // 2)
    # each variant its own config (type chooses the dataclass), with the run's bias
    mla = a if a.type == "mla" else MLAConfig(bias=a.bias, kv_lora_rank=4 * Dh, qk_rope_head_dim=max(2, Dh // 2),
                                              qk_nope_head_dim=Dh, v_head_dim=Dh)
    window = a.window if a.type == "sliding_window" and a.window else SLIDING_WINDOW
    mha = MHAConfig(bias=a.bias)
    out = [("MHA", f"K and V of {H} heads x {Dh}", replace(cfg, n_kv_heads=None, attention=mha, layers=plain)),
           ("GQA", f"K and V of {gqa} shared heads x {Dh}", replace(cfg, n_kv_heads=gqa, attention=mha, layers=plain)),
           ("MQA", f"K and V of 1 shared head x {Dh}", replace(cfg, n_kv_heads=1, attention=mha, layers=plain)),
           ("MLA", f"latent c ({mla.kv_lora_rank}) + shared RoPE key ({mla.qk_rope_head_dim})",
            replace(cfg, n_kv_heads=None, attention=mla, layers=plain)),
           ("sliding window", f"K and V of {cfg.kv_heads} heads x {Dh}, last {window - 1} positions",
            replace(cfg, attention=SlidingWindowConfig(bias=a.bias, window=window, global_every=0), layers=plain))]
    return out


def layer_bytes(cfg, layer: int, context: int) -> float:
    """What layer ``layer`` keeps for generation after ``context`` tokens: its own ``kv_cache_bytes`` (a
    Gated DeltaNet layer: its fixed-size state, whatever the context)."""
    return float(attention_class(cfg, layer).kv_cache_bytes(cfg, context, layer=layer, dtype_bytes=DTYPE_BYTES))


def mixers(cfg) -> list[str]:
    """Each layer's token mixer (``attention.type`` or its ``model.layers.pattern`` entry)."""
    return [layer_type(cfg, i) for i in range(cfg.n_layers)]


def _per_layer(cfg, context: int) -> list[float]:
    return [layer_bytes(cfg, i, context) for i in range(cfg.n_layers)]


def kv_view(cfg, S: int, max_len: int | None) -> dict:
    """The run's cache after a prefill of ``S`` tokens and per decoded token (per layer), and the
    variants' totals at ``S`` and at the model's full context."""
    full = max_len or S
    prefill = _per_layer(cfg, S)
    step = [b - a for a, b in zip(prefill, _per_layer(cfg, S + 1))]
    rows = []
    for name, keeps, vcfg in _variants(cfg):
        rows.append({"name": name, "keeps": keeps, "prefill": sum(_per_layer(vcfg, S)),
                     "per_token": sum(_per_layer(vcfg, S + 1)) - sum(_per_layer(vcfg, S)),
                     "full": sum(_per_layer(vcfg, full))})
    kinds = mixers(cfg)
    return {"attention": kinds[0] if len(set(kinds)) == 1 else "hybrid", "mixers": kinds,
            "kv_heads": cfg.kv_heads, "heads": cfg.n_heads, "d_head": cfg.d_head,
            "dtype_bytes": DTYPE_BYTES, "tokens": S, "context": full, "prefill": prefill, "per_token": step,
            "variants": rows}
