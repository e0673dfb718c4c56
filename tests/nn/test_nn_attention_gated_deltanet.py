"""Gated DeltaNet (``attention.type: gated_deltanet``): parity with transformers' Qwen3-Next layer (PyTorch path,
weights copied), the chunked form against the recurrent one, generation through the fixed-size cache against a
full forward, and its stated facts (parameters, FLOPs, cache bytes, validation) against the module.

Shape legend: B batch, S sequence, D model dim, Hk key heads, Hv value heads, Dk/Dv head dims, r = Hv / Hk.
"""

import random
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from archlab.config.schema import ModelConfig, NormConfig, PositionConfig
from archlab.errors import RecipeError
from archlab.model.validate import validate_model
from archlab.nn.attention import GatedDeltaNet, GatedDeltaNetConfig, LayerStateCache
from archlab.nn.attention.gated_deltanet import chunk_gated_delta_rule, recurrent_gated_delta_rule
from archlab.nn.positions import PosContext

ROOT = Path(__file__).resolve().parents[2]
transformers = pytest.importorskip("transformers")
from transformers.models.qwen3_next import modeling_qwen3_next as hf  # noqa: E402


def gdn_config(hk=2, hv=4, dk=8, dv=6, kernel=4, chunk=8, d_model=24, bias=False, eps=1e-6) -> ModelConfig:
    return ModelConfig(vocab_size=50, max_seq_len=64, d_model=d_model, n_layers=1, n_heads=4,
                       norm=NormConfig(type="rmsnorm", eps=eps), position=PositionConfig(type="none"),
                       attention=GatedDeltaNetConfig(bias=bias, gdn_k_heads=hk, gdn_v_heads=hv,
                                                 gdn_k_head_dim=dk, gdn_v_head_dim=dv, gdn_conv_kernel=kernel,
                                                 gdn_chunk_size=chunk, gdn_kernels="torch"))


def hf_layer(cfg: ModelConfig):
    a = cfg.attention
    c = transformers.Qwen3NextConfig(
        hidden_size=cfg.d_model, linear_num_key_heads=a.gdn_k_heads, linear_num_value_heads=a.gdn_v_heads,
        linear_key_head_dim=a.gdn_k_head_dim, linear_value_head_dim=a.gdn_v_head_dim,
        linear_conv_kernel_dim=a.gdn_conv_kernel, rms_norm_eps=cfg.norm.eps, num_hidden_layers=1,
        layer_types=["linear_attention"], hidden_act="silu")
    return hf.Qwen3NextGatedDeltaNet(c, layer_idx=0).eval()


def copy_from_hf(mine: GatedDeltaNet, theirs) -> None:
    """Qwen3-Next groups its fused projections by key head ([q, k, v-group, z-group] and [b-group, a-group]);
    archlab's in projection is [q; k; v; z; beta; alpha], each head-major."""
    Hk, r, Dk, Dv = mine.hk, mine.hv // mine.hk, mine.dk, mine.dv
    D = theirs.in_proj_qkvz.weight.shape[1]
    qkvz = theirs.in_proj_qkvz.weight.view(Hk, 2 * Dk + 2 * r * Dv, D)
    q, k, v, z = qkvz.split([Dk, Dk, r * Dv, r * Dv], dim=1)
    b, a = theirs.in_proj_ba.weight.view(Hk, 2 * r, D).split([r, r], dim=1)
    with torch.no_grad():
        mine.wqkv.weight.copy_(torch.cat([t.reshape(-1, D) for t in (q, k, v, z, b, a)]))
        mine.conv_weight.copy_(theirs.conv1d.weight)
        mine.A_log.copy_(theirs.A_log)
        mine.dt_bias.copy_(theirs.dt_bias)
        mine.norm.weight.copy_(theirs.norm.weight)
        mine.wo.weight.copy_(theirs.out_proj.weight)


def randomise(module: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)


CTX = PosContext()


def random_case(seed: int) -> ModelConfig:
    rng = random.Random(seed)
    hk = rng.choice([1, 2, 3])
    return gdn_config(hk=hk, hv=hk * rng.choice([1, 2]), dk=rng.choice([4, 8, 16]), dv=rng.choice([4, 6, 8]),
                      kernel=rng.choice([2, 3, 4]), chunk=64, d_model=rng.choice([16, 24, 32]))


@pytest.mark.parametrize("seed", range(4))
def test_matches_qwen3_next_layer(seed):
    cfg = random_case(seed)
    theirs = hf_layer(cfg)
    randomise(theirs, seed)
    mine = GatedDeltaNet(cfg, layer=0)
    copy_from_hf(mine, theirs)
    x = torch.randn(2, 37, cfg.d_model, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        torch.testing.assert_close(mine(x, CTX), theirs(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("chunk", [1, 5, 8, 64])
def test_chunk_size_changes_nothing(chunk):
    """Chunk lengths that do not divide S (the padded last chunk) give the outputs of HF's 64-token chunks."""
    cfg = gdn_config(chunk=chunk)
    theirs = hf_layer(cfg)
    randomise(theirs, 1)
    mine = GatedDeltaNet(cfg, layer=0)
    copy_from_hf(mine, theirs)
    x = torch.randn(3, 29, cfg.d_model)
    with torch.no_grad():
        torch.testing.assert_close(mine(x, CTX), theirs(x), atol=1e-5, rtol=1e-5)


def test_chunked_form_equals_recurrent_form():
    torch.manual_seed(0)
    B, H, S, Dk, Dv = 2, 3, 23, 8, 5
    q, k = (torch.nn.functional.normalize(torch.randn(B, H, S, Dk), dim=-1) for _ in range(2))
    v, beta = torch.randn(B, H, S, Dv), torch.rand(B, H, S)
    g = -torch.rand(B, H, S)
    state = torch.randn(B, H, Dk, Dv)
    o_rec, m_rec = recurrent_gated_delta_rule(q, k, v, g, beta, state)
    for chunk in (1, 4, 7, 23, 32):
        o, m = chunk_gated_delta_rule(q, k, v, g, beta, chunk, state)
        torch.testing.assert_close(o, o_rec, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(m, m_rec, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("prompt", [1, 6, 11])
def test_generation_through_the_cache_equals_a_full_forward(prompt):
    """A prompt (chunked, fills the state and conv buffer) then one token at a time (recurrent)."""
    cfg = gdn_config(chunk=4)
    layer = GatedDeltaNet(cfg, layer=0)
    randomise(layer, 3)
    x = torch.randn(2, 17, cfg.d_model)
    with torch.no_grad():
        full = layer(x, CTX)
        cache = layer.new_cache()
        steps = [layer(x[:, :prompt], CTX, cache)] + [layer(x[:, t:t + 1], CTX, cache) for t in range(prompt, 17)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    assert isinstance(cache, LayerStateCache) and cache.length == 17
    assert cache.conv.shape == (2, layer.conv_dim, cfg.attention.gdn_conv_kernel - 1)
    assert cache.state.shape == (2, layer.hv, layer.dk, layer.dv)


def test_matches_qwen3_next_generation_step():
    """HF's single-token path (recurrent rule, conv update) against the cache: prompt by the full forward."""
    cfg = gdn_config()
    theirs = hf_layer(cfg)
    randomise(theirs, 2)
    mine = GatedDeltaNet(cfg, layer=0)
    copy_from_hf(mine, theirs)
    x = torch.randn(1, 9, cfg.d_model)
    with torch.no_grad():
        cache = mine.new_cache()
        ours = torch.cat([mine(x[:, :5], CTX, cache)] + [mine(x[:, t:t + 1], CTX, cache) for t in range(5, 9)], 1)
        torch.testing.assert_close(ours, theirs(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("seed", range(3))
def test_params_and_flops_match_the_module(seed):
    cfg = random_case(seed)
    cfg.attention.gdn_chunk_size = [4, 7, 16][seed]
    cfg.attention.bias = seed == 1
    layer = GatedDeltaNet(cfg, layer=0)
    assert GatedDeltaNet.num_params(cfg, layer=0) == sum(p.numel() for p in layer.parameters())
    S = 21
    x = torch.randn(2, S, cfg.d_model, requires_grad=True)  # a layer's input needs its gradient in a model
    with FlopCounterMode(display=False) as counter:
        y = layer(x, CTX)
    forward = counter.get_total_flops() / (2 * S)
    with FlopCounterMode(display=False) as counter:
        y.square().sum().backward()
    assert forward == pytest.approx(sum(GatedDeltaNet.forward_flops(cfg, S, layer=0).values()), rel=1e-12)
    training = forward + counter.get_total_flops() / (2 * S)
    assert training == pytest.approx(sum(GatedDeltaNet.training_flops(cfg, S, layer=0).values()), rel=1e-12)


def test_cache_bytes_are_the_cache_tensors_and_constant_in_the_context():
    cfg = gdn_config()
    layer = GatedDeltaNet(cfg, layer=0)
    for S in (3, 30):
        cache = layer.new_cache()
        with torch.no_grad():
            layer(torch.randn(1, S, cfg.d_model), CTX, cache)
        held = cache.state.numel() * cache.state.element_size() + cache.conv.numel() * cache.conv.element_size()
        assert GatedDeltaNet.kv_cache_bytes(cfg, S, layer=0, dtype_bytes=4) == held


def test_fla_kernels_asked_for_but_absent_are_refused(monkeypatch):
    import archlab.nn.attention.gated_deltanet as gdn

    monkeypatch.setattr(gdn, "fla_ops", lambda: None)
    cfg = gdn_config()
    cfg.attention.gdn_kernels = "fla"
    with pytest.raises(RuntimeError, match="flash-linear-attention is not installed"):
        GatedDeltaNet(cfg, layer=0)(torch.randn(1, 3, cfg.d_model), CTX)


@pytest.mark.parametrize("key, value, message", [
    ("gdn_v_heads", 3, "multiple of gdn_k_heads"),
    ("gdn_conv_kernel", 0, "must be >= 1"),
    ("gdn_kernels", "triton", "must be one of auto, torch, fla"),
])
def test_bad_options_are_refused(key, value, message):
    cfg = gdn_config()
    setattr(cfg.attention, key, value)
    with pytest.raises(RecipeError, match=message):
        validate_model(cfg)


@pytest.mark.parametrize("chunk, dtype", [(64, "fp32"), (24, "bf16"), (100, "fp32"), (7, "bf16")])
def test_saved_bytes_match_the_saved_tensors(chunk, dtype):
    """One chunk (its last state update frees what only it reads), several, a padded last one; fp32 and bf16;
    without checkpointing and under selective checkpointing (the matmul outputs)."""
    import archlab
    from archlab.costs import activation_memory
    from archlab.costs.measure import saved_activation_bytes

    cfg = archlab.load_recipe(ROOT / "recipes/gdn/tiny.yaml", [
        "model.n_layers=1", "model.vocab_size=384", f"model.attention.gdn_chunk_size={chunk}"])
    for mode in ("none", "selective"):
        model = archlab.build_model(cfg).train().to(torch.bfloat16 if dtype == "bf16" else torch.float32)
        model.checkpointing = mode
        held = saved_activation_bytes(model, torch.randint(0, 383, (2, 65)))["total"]
        assert activation_memory(cfg, 2, 64, dtype=dtype, device="cpu", checkpointing=mode).total == held, mode
