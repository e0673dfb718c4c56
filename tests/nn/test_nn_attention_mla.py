"""Multi-head latent attention (``attention.type: mla``): against the equations written out by
hand, the absorbed decode path against the training path, causality, the latent KV cache, and
its stated facts (parameters, FLOPs, saved bytes, cache bytes, validation) against the module.

Shape legend: B batch, S sequence, D model dim, H heads, P qk_nope_head_dim, R qk_rope_head_dim,
V v_head_dim, C kv_lora_rank, Q q_lora_rank, V_ vocabulary.
"""

import math
import random

import pytest
import torch

import archlab
from archlab.config.schema import (
    AttentionConfig,
    BalanceConfig,
    FFNConfig,
    ModelConfig,
    MoEConfig,
    NormConfig,
    PositionConfig,
    RopeScalingConfig,
    RouterConfig,
)
from archlab.costs import activation_memory, forward_flops, kv_cache_bytes, training_flops_per_token
from archlab.costs.measure import flops_by_component, measured_flops, saved_activation_bytes
from archlab.errors import RecipeError
from archlab.nn.attention import MLAConfig, MultiHeadLatentAttention, attention_class
from archlab.nn.positions import apply_rotary, build_positions

VOCAB = 61


def mla(q_lora=None, kv=16, rope=4, nope=6, v=10, scaling="none", bias=False, norm="rmsnorm", **kw) -> ModelConfig:
    base = dict(vocab_size=VOCAB, max_seq_len=64, d_model=32, n_layers=2, n_heads=4,
                norm=NormConfig(type=norm),
                position=PositionConfig(type="rope", rope_scaling=RopeScalingConfig(
                    type=scaling, factor=1.0 if scaling == "none" else 4.0,
                    original_max_seq_len=16 if scaling == "yarn" else None)),
                attention=MLAConfig(bias=bias, q_lora_rank=q_lora, kv_lora_rank=kv,
                                          qk_rope_head_dim=rope, qk_nope_head_dim=nope, v_head_dim=v),
                ffn=FFNConfig(type="swiglu", bias=False, hidden=48))
    base.update(kw)
    return ModelConfig(**base)


CASES = {
    "full-rank-q": mla(),
    "low-rank-q": mla(q_lora=12),
    "yarn": mla(q_lora=8, scaling="yarn"),
    "linear-bias": mla(scaling="linear", bias=True),
    "v=qk-layernorm": mla(nope=6, rope=4, v=10, kv=8, norm="layernorm"),
    "one-head": mla(n_heads=1, nope=8, rope=2, v=4),
}


def randomised(module: torch.nn.Module, gain: float = 5.0) -> torch.nn.Module:
    """Norm gains and biases off their init values (ones/zeros would hide a swap); the matrices
    times ``gain`` (a model's N(0, 0.02) init gives nearly uniform attention, where a wrong score
    scale or temperature would not show)."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.ndim == 1:
                p.copy_(torch.randn_like(p) * 0.3 + (1.0 if "norm" in name else 0.0))
            else:
                p.mul_(gain)
    return module


def reference(attn: MultiHeadLatentAttention, c: ModelConfig, x_BSD: torch.Tensor) -> torch.Tensor:
    """The module docstring's equations, one einsum each; YaRN's temperature t on the whole score
    (DeepSeek's mscale^2), the RoPE tables used without it."""
    B, S, _ = x_BSD.shape
    a, H = c.attention, c.n_heads
    P, R, V, C = a.qk_nope_head_dim, a.qk_rope_head_dim, a.v_head_dim, a.kv_lora_rank
    w = attn.wqkv
    q = w.q(x_BSD) if a.q_lora_rank is None else w.q_up(w.q_norm(w.q_down(x_BSD)))
    q_nope, q_rope = q.view(B, S, H, P + R).split([P, R], dim=-1)  # (B, S, H, P), (B, S, H, R)
    latent = w.kv_down(x_BSD)
    c_BSC, k_rope = w.kv_norm(latent[..., :C]), latent[..., C:]
    W = w.kv_up.weight.view(H, P + V, C)
    k_nope = torch.einsum("hpc,btc->bhtp", W[:, :P], c_BSC)  # (B, H, T, P)
    v = torch.einsum("hvc,btc->bhtv", W[:, P:], c_BSC)  # (B, H, T, V)
    ctx = build_positions(c).context(torch.arange(S), torch.arange(S))
    t = attn.nope_gain ** 0.5
    cos, sin = ctx.cos / t, ctx.sin / t  # (S, R), without the temperature
    q_rope = apply_rotary(q_rope.transpose(1, 2), cos, sin)  # (B, H, S, R)
    k_rope = apply_rotary(k_rope, cos, sin)  # (B, T, R)
    scores = torch.einsum("bshp,bhtp->bhst", q_nope, k_nope) + torch.einsum("bhsr,btr->bhst", q_rope, k_rope)
    scores = scores * (P + R) ** -0.5 * t**2
    scores = scores.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
    y = torch.einsum("bhst,bhtv->bshv", scores.softmax(-1), v).reshape(B, S, H * V)
    return attn.wo(y)


@pytest.mark.parametrize("name", list(CASES))
def test_mla_matches_the_equations(name):
    c = CASES[name]
    attn = randomised(MultiHeadLatentAttention(c, layer=0), gain=1.0).eval()  # torch's own init
    x = torch.randn(2, 12, c.d_model)
    ctx = build_positions(c).context(torch.arange(12), torch.arange(12))
    with torch.no_grad():
        torch.testing.assert_close(attn(x, ctx), reference(attn, c, x))


def test_yarn_puts_the_temperature_on_the_whole_score():
    c = CASES["yarn"]
    attn = MultiHeadLatentAttention(c, layer=0)
    assert attn.nope_gain == pytest.approx((0.1 * math.log(4.0) + 1.0) ** 2)
    assert MultiHeadLatentAttention(CASES["linear-bias"], layer=0).nope_gain == 1.0
    assert attn.scale == pytest.approx(1 / math.sqrt(6 + 4))


def cached_logits(model, ids: torch.Tensor, chunks) -> tuple[torch.Tensor, object]:
    """Logits of ``ids`` fed through the KV cache in pieces of the given lengths."""
    cache, out, t = model.new_kv_cache(), [], 0
    for n in chunks:
        out.append(model(ids[:, t:t + n], kv_cache=cache).logits)
        t += n
    return torch.cat(out, dim=1), cache


@pytest.mark.parametrize("name", list(CASES))
def test_absorbed_decode_equals_the_training_path(name):
    """The cache path (W_UK absorbed into the query, W_UV applied after attention over the latent)
    gives the training path's logits: a prompt at once, single tokens, then a chunk."""
    c = CASES[name]
    model = randomised(archlab.build_model(c)).eval()
    ids = torch.randint(0, VOCAB, (3, 15))
    with torch.no_grad():
        full = model(ids).logits
        cached, cache = cached_logits(model, ids, [6, 1, 1, 1, 1, 1, 1, 3])
    assert cache.length == 15
    torch.testing.assert_close(cached, full)


def test_the_cache_holds_only_the_latent_and_the_shared_rope_key():
    c = CASES["low-rank-q"]
    model = archlab.build_model(c).eval()
    with torch.no_grad():
        _, cache = cached_logits(model, torch.randint(0, VOCAB, (3, 9)), [7, 1, 1])
    for layer in cache.layers:
        assert layer.k.shape == (3, 9, c.attention.kv_lora_rank)  # the latent c
        assert layer.v.shape == (3, 9, c.attention.qk_rope_head_dim)  # RoPE(k_R), one for all heads
    held = sum(layer.k.nbytes + layer.v.nbytes for layer in cache.layers)
    assert kv_cache_bytes(c, batch=3, context=9, dtype="fp32") == held
    # what MLA buys: GQA with 2 key/value heads of d_head 8 caches 2 * 2 * 8 = 32 per position; MLA 16 + 4
    gqa = ModelConfig(**{**c.__dict__, "attention": AttentionConfig(), "n_kv_heads": 2})
    assert kv_cache_bytes(gqa, 1, 100, "bf16") / kv_cache_bytes(c, 1, 100, "bf16") == 32 / 20


@pytest.mark.parametrize("scaling", ["none", "yarn"])
def test_changing_token_t_never_changes_earlier_logits(scaling):
    model = randomised(archlab.build_model(mla(q_lora=8, scaling=scaling))).eval()
    ids = torch.randint(0, VOCAB, (2, 12))
    with torch.no_grad():
        base = model(ids).logits
        for t in (0, 5, 11):
            changed = ids.clone()
            changed[:, t] = (changed[:, t] + 1) % VOCAB
            logits = model(changed).logits
            torch.testing.assert_close(logits[:, :t], base[:, :t], rtol=0, atol=0)
            assert not torch.allclose(logits[:, t], base[:, t])


def test_greedy_generation_equals_argmax_of_full_forwards():
    model = randomised(archlab.build_model(mla(q_lora=8, scaling="yarn"))).eval()
    prompt = torch.randint(0, VOCAB, (2, 5))
    out = archlab.generate(model, prompt, max_new_tokens=8, temperature=0)
    ids = prompt
    with torch.no_grad():
        for _ in range(8):
            ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, ids)


def test_rope_rotates_the_rope_head_dim_only():
    c = mla(rope=6, nope=4)
    assert c.rotary_dim == 6 and attention_class(c).rotary_dim(c) == 6
    assert build_positions(c).inv_freq.shape == (3,)


# ----------------------------------------------------------------------------- stated facts


def random_mla(seed: int, moe: bool = False) -> ModelConfig:
    """A random valid MLA model: head dims, ranks, q_lora on/off, norms, biases, dropout, scaling."""
    rng = random.Random(seed)
    nope, rope = rng.choice([2, 4, 6]), rng.choice([2, 4, 8])
    c = mla(q_lora=rng.choice([None, 8, 12]), kv=rng.choice([4, 8, 16]), rope=rope, nope=nope,
            v=rng.choice([nope + rope, 4, 8]), scaling=rng.choice(["none", "linear", "yarn"]),
            bias=rng.random() < 0.5, norm=rng.choice(["rmsnorm", "layernorm"]),
            n_heads=rng.choice([1, 2, 4]), tie_embeddings=rng.random() < 0.5, dropout=rng.choice([0.0, 0.1]))
    c.attention.dropout = rng.choice([0.0, 0.0, 0.1])
    if moe:
        c.moe = MoEConfig(num_experts=4, top_k=2, expert_hidden=16, n_shared_experts=1, first_k_dense=1,
                          router=RouterConfig(type="sigmoid_topk", n_groups=2, topk_groups=1),
                          balance=BalanceConfig(bias_update_rate=1e-3))
    return c


def test_param_count_from_the_config_equals_the_built_module():
    for seed in range(20):
        c = random_mla(seed)
        attn = MultiHeadLatentAttention(c, layer=0)
        assert MultiHeadLatentAttention.num_params(c, layer=0) == sum(p.numel() for p in attn.parameters()), c
        assert archlab.num_params(c) == sum(p.numel() for p in archlab.build_model(c).parameters())


def test_biases_sit_on_the_down_projections_and_the_output_only():
    """DeepSeek's layout: an up-projection bias would break the absorption."""
    attn = MultiHeadLatentAttention(mla(q_lora=8, bias=True), layer=0)
    w = attn.wqkv
    assert w.q_down.bias is not None and w.kv_down.bias is not None and attn.wo.bias is not None
    assert w.q_up.bias is None and w.kv_up.bias is None
    assert MultiHeadLatentAttention(mla(bias=True), layer=0).wqkv.q.bias is None


@pytest.mark.parametrize("seed", range(4))
def test_flops_match_flop_counter(seed):
    """Projections under qkv_proj, W_O under out_proj, Q K^T with P + R and P V with V channels."""
    c = random_mla(seed, moe=seed % 2 == 1)
    model = archlab.build_model(c).train()
    S = 16
    ids = torch.randint(0, VOCAB, (1, S + 1))
    assert training_flops_per_token(c, S) == pytest.approx(measured_flops(model, ids)["total"] / S, rel=1e-9)
    parts = flops_by_component(measured_flops(model, ids, backward=False, loss="logits"))
    est = forward_flops(c, S)
    for name in ("qkv_proj", "out_proj"):
        assert getattr(est, name) == pytest.approx(parts[name] / S, rel=1e-9), name
    assert est.attention == pytest.approx(parts["attention"] / S, rel=1e-9)
    a = c.attention
    assert est.attn_scores == 2 * S * c.n_heads * (a.qk_nope_head_dim + a.qk_rope_head_dim) * c.n_layers
    assert est.attn_values == 2 * S * c.n_heads * a.v_head_dim * c.n_layers


@pytest.mark.parametrize("seed", range(6))
def test_saved_bytes_match_saved_tensors(seed):
    """The bytes autograd keeps, fp32 and bf16, without, with full and with selective
    checkpointing (the fused kernel when V = P + R, the math kernel otherwise or with dropout)."""
    c = random_mla(seed, moe=seed % 2 == 1)
    B, S = 2, 16
    for dtype, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        for mode in ("none", "full", "selective"):
            model = archlab.build_model(c).train().to(dt)
            model.checkpointing = mode
            measured = saved_activation_bytes(model, torch.randint(0, VOCAB, (B, S + 1)))["total"]
            assert activation_memory(c, B, S, dtype=dtype, device="cpu", checkpointing=mode).total == measured, \
                (dtype, mode)


def test_compiles_without_graph_breaks():
    model = archlab.build_model(mla(q_lora=8, scaling="yarn")).train()
    ids = torch.randint(0, VOCAB, (2, 17))
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(ids[:, :-1], targets=ids[:, 1:]).loss,
                               model(ids[:, :-1], targets=ids[:, 1:]).loss)


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize("override, message", [
    ("model.attention.kv_lora_rank=0", "model.attention.kv_lora_rank=0: mla compresses keys and values"),
    ("model.attention.q_lora_rank=0", "model.attention.q_lora_rank=0: must be >= 1, or null"),
    ("model.attention.qk_rope_head_dim=0", "model.attention.qk_rope_head_dim=0: must be a positive"),
    ("model.attention.qk_nope_head_dim=-1", "model.attention.qk_nope_head_dim=-1: must be a positive"),
    ("model.attention.v_head_dim=0", "model.attention.v_head_dim=0: must be a positive"),
    ("model.attention.qk_rope_head_dim=5", "model.attention.qk_rope_head_dim=5: RoPE rotates pairs"),
    ("model.position.type=alibi", "model.position.type='alibi': mla carries positions in its decoupled RoPE key"),
    ("model.position.type=learned", "model.position.type='learned': mla .* use position.type=rope"),
    ("model.attention.qk_norm=true",  # mla normalises its latents, not per-head q and k
     r"model.attention.qk_norm=True: not a key of attention.type mla \(its keys: .*\); qk_norm is read by "
     "attention.type mha, sliding_window"),
    ("model.n_kv_heads=2", "model.n_kv_heads=2: mla has no key/value head groups"),
    ("model.attention.dropout=1.0", "model.attention.dropout=1.0: must lie in"),
])
def test_invalid_settings_are_refused_naming_the_key(override, message):
    base = ["model.attention.type=mla", "model.position.type=rope", "model.attention.kv_lora_rank=16",
            "model.attention.qk_rope_head_dim=8", "model.attention.qk_nope_head_dim=16",
            "model.attention.v_head_dim=16"]
    archlab.load_recipe(None, base)  # valid as it stands
    with pytest.raises(RecipeError, match=message):
        archlab.load_recipe(None, [*base, override])


def test_the_recipes_validate_and_mla_ignores_d_model_divisibility():
    archlab.load_recipe("recipes/deepseek/v3-tiny.yaml")
    archlab.load_recipe("recipes/deepseek/v3-mini.yaml")
    c = archlab.load_recipe(None, ["model.attention.type=mla", "model.position.type=rope", "model.d_model=30",
                                   "model.n_heads=4", "model.attention.kv_lora_rank=8",
                                   "model.attention.qk_rope_head_dim=4", "model.attention.qk_nope_head_dim=4",
                                   "model.attention.v_head_dim=4"])
    model = archlab.build_model(c)
    assert model(torch.randint(0, 100, (1, 5))).logits.shape == (1, 5, c.model.vocab_size)
