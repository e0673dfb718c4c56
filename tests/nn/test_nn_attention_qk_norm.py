"""``attention.qk_norm_over``: the q/k norm per head (Dh-wide gains) or over the whole projections (all of q,
H*Dh wide; all of k, G*Dh wide) before the heads are split, against a reference by hand; its parameter count
against the built module; the recipe rules on the key.

Shape legend: B batch, S sequence, D model dim, H heads, G kv heads, Dh head dim.
"""

import math

import pytest
import torch

import archlab
from archlab.config.schema import ModelConfig, NormConfig, PositionConfig
from archlab.errors import RecipeError
from archlab.nn.attention import CausalSelfAttention, MHAConfig
from archlab.nn.positions import apply_rotary, build_positions


def cfg(over: str, n_kv_heads=2, norm="rmsnorm", position="rope", n_heads=4) -> ModelConfig:
    return ModelConfig(d_model=32, n_heads=n_heads, n_kv_heads=n_kv_heads, max_seq_len=64,
                       norm=NormConfig(type=norm), position=PositionConfig(type=position),
                       attention=MHAConfig(bias=False, qk_norm=True, qk_norm_over=over))


def randomised(c: ModelConfig) -> CausalSelfAttention:
    torch.manual_seed(0)
    attn = CausalSelfAttention(c, layer=0).eval()
    with torch.no_grad():
        for name, p in attn.named_parameters():
            if p.ndim == 1:  # gains (and biases) off their init values
                p.copy_(torch.randn_like(p) * 0.3 + (1.0 if name.endswith("weight") else 0.0))
    return attn


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def reference(attn: CausalSelfAttention, c: ModelConfig, x_BSD: torch.Tensor) -> torch.Tensor:
    """RMSNorm over all of q (B, S, H*Dh) and all of k (B, S, G*Dh), then heads, RoPE, causal softmax, by hand."""
    B, S, _ = x_BSD.shape
    H, G, Dh = c.n_heads, c.kv_heads, c.d_head
    q, k, v = attn.wqkv(x_BSD).split([H * Dh, G * Dh, G * Dh], dim=-1)
    q, k = rms(q, attn.q_norm.weight, c.norm.eps), rms(k, attn.k_norm.weight, c.norm.eps)
    q = q.view(B, S, H, Dh).transpose(1, 2)
    k = k.view(B, S, G, Dh).transpose(1, 2)[:, [h * G // H for h in range(H)]]  # (B, H, S, Dh)
    v = v.view(B, S, G, Dh).transpose(1, 2)[:, [h * G // H for h in range(H)]]
    ctx = build_positions(c).context(torch.arange(S), torch.arange(S))
    q, k = apply_rotary(q, ctx.cos, ctx.sin), apply_rotary(k, ctx.cos, ctx.sin)
    scores = torch.einsum("bhsd,bhtd->bhst", q, k) / math.sqrt(Dh)
    scores = scores.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
    y = torch.einsum("bhst,bhtd->bhsd", scores.softmax(-1), v)
    return attn.wo(y.transpose(1, 2).reshape(B, S, H * Dh))


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
def test_projection_norm_matches_the_reference(n_kv_heads):
    c = cfg("projection", n_kv_heads=n_kv_heads)
    attn = randomised(c)
    assert attn.q_norm.weight.shape == (4 * 8,) and attn.k_norm.weight.shape == (n_kv_heads * 8,)
    x = torch.randn(2, 10, 32)
    with torch.no_grad():
        torch.testing.assert_close(attn(x, build_positions(c).context(torch.arange(10), torch.arange(10))),
                                   reference(attn, c, x))


def test_projection_and_per_head_norms_differ_and_agree_for_one_head():
    """Over several heads the mean square of the whole projection is not each head's; with one head they are one."""
    x = torch.randn(2, 10, 32)

    def out(c):
        attn = randomised(c)
        with torch.no_grad():
            attn.q_norm.weight.fill_(1.0)
            attn.k_norm.weight.fill_(1.0)
            return attn(x, build_positions(c).context(torch.arange(10), torch.arange(10)))

    assert not torch.allclose(out(cfg("projection")), out(cfg("head")), atol=1e-3)
    torch.testing.assert_close(out(cfg("projection", n_kv_heads=1, n_heads=1)),
                               out(cfg("head", n_kv_heads=1, n_heads=1)))


def test_projection_norm_keeps_the_kv_cache_exact():
    c = cfg("projection")
    attn = randomised(c)
    pos = build_positions(c)
    x = torch.randn(1, 12, 32)
    from archlab.nn.attention import LayerKVCache

    cache = LayerKVCache()
    with torch.no_grad():
        full = attn(x, pos.context(torch.arange(12), torch.arange(12)))
        first = attn(x[:, :8], pos.context(torch.arange(8), torch.arange(8)), cache)
        rest = [attn(x[:, i:i + 1], pos.context(torch.arange(i, i + 1), torch.arange(i + 1)), cache)
                for i in range(8, 12)]
    torch.testing.assert_close(torch.cat([first, *rest], dim=1), full)


@pytest.mark.parametrize("over", ["head", "projection"])
@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
def test_num_params_counts_the_built_norms(over, norm):
    c = cfg(over, norm=norm)
    attn = CausalSelfAttention(c, layer=0)
    assert CausalSelfAttention.num_params(c, layer=0) == sum(p.numel() for p in attn.parameters())
    gains = sum(p.numel() for n, p in attn.named_parameters() if "_norm" in n)
    per_gain = 2 if norm == "layernorm" else 1  # LayerNorm: a gain and a bias
    assert gains == per_gain * ((4 + 2) * 8 if over == "projection" else 2 * 8)


@pytest.mark.parametrize("overrides, message", [
    (["model.attention.qk_norm_over=projection"],
     r"model.attention.qk_norm_over='projection': only used when attention.qk_norm is true"),
    (["model.attention.qk_norm=true", "model.attention.qk_norm_over=heads"],
     r"model.attention.qk_norm_over='heads': must be one of head, projection"),
    (["model.attention.type=mla", "model.position.type=rope", "model.attention.qk_norm_over=projection"],
     r"model.attention.qk_norm_over='projection': not a key of attention.type mla .*; qk_norm_over is read by "
     "attention.type mha, sliding_window"),
])
def test_a_qk_norm_over_that_does_nothing_or_is_unknown_is_refused(overrides, message):
    with pytest.raises(RecipeError, match=message):
        archlab.load_recipe(None, overrides)


def test_the_recipes_meaning_is_unchanged_by_default():
    m = archlab.model_config(archlab.load_recipe(None, ["model.attention.qk_norm=true"]))
    assert m.attention.qk_norm_over == "head"
    archlab.load_recipe(None, ["model.attention.qk_norm=true", "model.attention.qk_norm_over=projection"])
    archlab.load_recipe(None, ["model.attention.type=sliding_window", "model.attention.window=8",
                               "model.attention.qk_norm=true", "model.attention.qk_norm_over=projection"])
