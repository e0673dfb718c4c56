"""Causal self-attention against an explicit reference: MHA/GQA/MQA, scale, QK-norm, ALiBi, KV cache.

Shape legend: B batch, S sequence, D model dim, H heads, G kv heads, Dh head dim.
"""

import math

import pytest
import torch

from archlab.config.schema import ModelConfig, NormConfig, PositionConfig
from archlab.nn.attention import CausalSelfAttention, LayerKVCache, MHAConfig
from archlab.nn.positions import apply_rotary, build_positions


def cfg(n_kv_heads=None, position="none", scale=None, qk_norm=False, bias=True, dropout=0.0) -> ModelConfig:
    return ModelConfig(d_model=32, n_heads=4, n_kv_heads=n_kv_heads, max_seq_len=64,
                       norm=NormConfig(type="rmsnorm"), position=PositionConfig(type=position),
                       attention=MHAConfig(bias=bias, scale=scale, qk_norm=qk_norm, dropout=dropout))


def reference(attn: CausalSelfAttention, c: ModelConfig, x_BSD: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T * scale + alibi + causal) v with K/V head h // (H/G) per query head, by hand."""
    B, S, _ = x_BSD.shape
    H, G, Dh = c.n_heads, c.kv_heads, c.d_head
    q, k, v = attn.wqkv(x_BSD).split([H * Dh, G * Dh, G * Dh], dim=-1)
    q = q.view(B, S, H, Dh).transpose(1, 2)
    k = k.view(B, S, G, Dh).transpose(1, 2)[:, [h * G // H for h in range(H)]]  # (B, H, S, Dh)
    v = v.view(B, S, G, Dh).transpose(1, 2)[:, [h * G // H for h in range(H)]]
    if attn.q_norm is not None:
        q, k = attn.q_norm(q), attn.k_norm(k)
    ctx = build_positions(c).context(torch.arange(S), torch.arange(S))
    if ctx.cos is not None:
        q, k = apply_rotary(q, ctx.cos, ctx.sin), apply_rotary(k, ctx.cos, ctx.sin)
    scale = c.attention.scale if c.attention.scale is not None else 1 / math.sqrt(Dh)
    scores = torch.einsum("bhsd,bhtd->bhst", q, k) * scale
    if ctx.bias is not None:
        scores = scores + ctx.bias
    scores = scores.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
    y = torch.einsum("bhst,bhtd->bhsd", scores.softmax(-1), v)
    return attn.wo(y.transpose(1, 2).reshape(B, S, H * Dh))


CASES = {
    "mha": cfg(),
    "gqa": cfg(n_kv_heads=2),
    "mqa": cfg(n_kv_heads=1),
    "rope-gqa": cfg(n_kv_heads=2, position="rope", bias=False),
    "alibi": cfg(position="alibi"),
    "alibi-mqa": cfg(n_kv_heads=1, position="alibi"),
    "scale=1": cfg(scale=1.0),
    "qk-norm": cfg(qk_norm=True, position="rope"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_attention_matches_reference(name):
    c = CASES[name]
    attn = CausalSelfAttention(c, layer=0).eval()
    if attn.q_norm is not None:
        with torch.no_grad():
            attn.q_norm.weight.uniform_(0.5, 1.5), attn.k_norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 9, 32)
    pos = build_positions(c)
    y = attn(x, pos.context(torch.arange(9), torch.arange(9)))
    torch.testing.assert_close(y, reference(attn, c, x))


def test_scale_switch_changes_output():
    torch.manual_seed(0)
    a = CausalSelfAttention(cfg(), layer=0).eval()
    b = CausalSelfAttention(cfg(scale=1.0), layer=0).eval()
    b.load_state_dict(a.state_dict())
    x = torch.randn(1, 6, 32) * 3
    ctx = build_positions(cfg()).context(torch.arange(6), torch.arange(6))
    assert not torch.allclose(a(x, ctx), b(x, ctx), atol=1e-4)


@pytest.mark.parametrize("name", ["gqa", "rope-gqa", "alibi-mqa"])
def test_kv_cache_in_chunks_equals_full_pass(name):
    c = CASES[name]
    attn = CausalSelfAttention(c, layer=0).eval()
    pos = build_positions(c)
    x = torch.randn(2, 10, 32)
    full = attn(x, pos.context(torch.arange(10), torch.arange(10)))
    cache, outs, start = LayerKVCache(), [], 0
    for size in (4, 1, 3, 1, 1):  # a prompt, then single tokens and a chunk
        p = torch.arange(start, start + size)
        outs.append(attn(x[:, start:start + size], pos.context(p, torch.arange(start + size)), cache))
        start += size
    assert cache.length == 10 and cache.k.shape == (2, c.kv_heads, 10, c.d_head)
    torch.testing.assert_close(torch.cat(outs, dim=1), full)


def test_gqa_equals_mha_with_repeated_kv_heads():
    """GQA is MHA whose K/V heads are shared: copying each KV head into its query heads' slots
    gives an MHA layer with the same output."""
    gqa_cfg, mha_cfg = cfg(n_kv_heads=2), cfg()
    gqa, mha = CausalSelfAttention(gqa_cfg, layer=0).eval(), CausalSelfAttention(mha_cfg, layer=0).eval()
    Dh = 8
    q, k, v = gqa.wqkv.weight.split([32, 16, 16])
    rep = lambda t: t.view(2, Dh, 32).repeat_interleave(2, dim=0).reshape(32, 32)  # noqa: E731
    qb, kb, vb = gqa.wqkv.bias.split([32, 16, 16])
    repb = lambda t: t.view(2, Dh).repeat_interleave(2, dim=0).reshape(32)  # noqa: E731
    with torch.no_grad():
        mha.wqkv.weight.copy_(torch.cat([q, rep(k), rep(v)]))
        mha.wqkv.bias.copy_(torch.cat([qb, repb(kb), repb(vb)]))
        mha.wo.load_state_dict(gqa.wo.state_dict())
    x = torch.randn(2, 7, 32)
    ctx = build_positions(gqa_cfg).context(torch.arange(7), torch.arange(7))
    torch.testing.assert_close(gqa(x, ctx), mha(x, ctx))


def test_param_count_and_bias_switch():
    for c in (cfg(), cfg(n_kv_heads=1, bias=False), cfg(qk_norm=True)):
        attn = CausalSelfAttention(c, layer=0)
        assert CausalSelfAttention.num_params(c, layer=0) == sum(p.numel() for p in attn.parameters())
    assert CausalSelfAttention(cfg(bias=False), layer=0).wqkv.bias is None


def test_attention_dropout_only_in_training():
    c = cfg(dropout=0.5)
    attn = CausalSelfAttention(c, layer=0)
    x = torch.randn(1, 8, 32)
    ctx = build_positions(c).context(torch.arange(8), torch.arange(8))
    attn.train()
    assert not torch.allclose(attn(x, ctx), attn(x, ctx))
    attn.eval()
    torch.testing.assert_close(attn(x, ctx), attn(x, ctx))
