"""Position encodings: RoPE's relative property and scalings, ALiBi's slopes, the sinusoid formula."""

import math

import pytest
import torch

from archlab.config.schema import ModelConfig, PositionConfig, RopeScalingConfig
from archlab.nn.positions import (
    RotaryPositions,
    alibi_slopes,
    apply_rotary,
    build_positions,
    rope_inv_freq,
)


def rope_cfg(scaling: str = "none", factor: float = 1.0, d_model: int = 64, n_heads: int = 4) -> ModelConfig:
    sc = RopeScalingConfig(type=scaling, factor=factor, original_max_seq_len=64 if scaling == "yarn" else None)
    return ModelConfig(d_model=d_model, n_heads=n_heads, max_seq_len=256,
                       position=PositionConfig(type="rope", rope_scaling=sc))


def rotated(rope: RotaryPositions, x_D: torch.Tensor, pos: int) -> torch.Tensor:
    ctx = rope.context(torch.tensor([pos]), torch.tensor([pos]))
    return apply_rotary(x_D[None, None, None, :], ctx.cos, ctx.sin)[0, 0, 0]


@pytest.mark.parametrize("scaling,factor", [("none", 1.0), ("linear", 4.0), ("ntk", 4.0), ("yarn", 4.0)])
def test_rope_dot_product_depends_only_on_offset(scaling, factor):
    rope = build_positions(rope_cfg(scaling, factor))
    q, k = torch.randn(16), torch.randn(16)
    for offset in (0, 3, 17):
        dots = [rotated(rope, q, n + offset) @ rotated(rope, k, n) for n in (0, 5, 40, 200)]
        torch.testing.assert_close(torch.stack(dots), dots[0].expand(4), rtol=1e-4, atol=1e-4)
    # ...and it does depend on the offset
    assert not torch.allclose(rotated(rope, q, 3) @ rotated(rope, k, 0), rotated(rope, q, 9) @ rotated(rope, k, 0))


def test_rope_rotation_preserves_norm_and_is_identity_at_zero():
    rope = build_positions(rope_cfg())
    x = torch.randn(16)
    torch.testing.assert_close(rotated(rope, x, 0), x)
    torch.testing.assert_close(rotated(rope, x, 123).norm(), x.norm())


def test_rope_linear_scaling_is_position_interpolation():
    """Linear scaling by s at position s*p rotates exactly like unscaled RoPE at position p."""
    plain, scaled = build_positions(rope_cfg()), build_positions(rope_cfg("linear", 4.0))
    x = torch.randn(16)
    torch.testing.assert_close(rotated(scaled, x, 4 * 25), rotated(plain, x, 25))


def test_ntk_stretches_the_base():
    d, base, s = 16, 10000.0, 8.0
    inv, temp = rope_inv_freq(d, base, RopeScalingConfig(type="ntk", factor=s), 128)
    expected = 1.0 / (base * s ** (d / (d - 2))) ** (torch.arange(0, d, 2).float() / d)
    torch.testing.assert_close(inv, expected)
    assert temp == 1.0


@pytest.mark.parametrize("rope_type", ["linear", "yarn"])
def test_rope_scalings_match_transformers(rope_type):
    """Inverse frequencies and attention temperature equal HF's ``modeling_rope_utils``."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    sc = RopeScalingConfig(type=rope_type, factor=4.0, original_max_seq_len=64)
    params = {"rope_type": rope_type, "rope_theta": 10000.0, "factor": 4.0}
    if rope_type == "yarn":
        params.update(original_max_position_embeddings=64, beta_fast=32.0, beta_slow=1.0)
    hf_cfg = LlamaConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=256, rope_parameters=params)
    hf_inv, hf_temp = ROPE_INIT_FUNCTIONS[rope_type](hf_cfg, "cpu")
    inv, temp = rope_inv_freq(16, 10000.0, sc, 256)
    torch.testing.assert_close(inv, hf_inv)
    assert temp == pytest.approx(hf_temp)
    if rope_type == "yarn":
        assert temp == pytest.approx(0.1 * math.log(4.0) + 1.0)


def test_alibi_slopes_match_the_paper():
    """Press et al. 2022: for 8 heads 1/2, 1/4, ..., 1/256; geometric from 2^(-8/n) with that ratio."""
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    torch.testing.assert_close(alibi_slopes(16), torch.tensor([2.0 ** -(0.5 * (i + 1)) for i in range(16)]))
    torch.testing.assert_close(alibi_slopes(4), torch.tensor([2.0 ** -(2 * (i + 1)) for i in range(4)]))
    # not a power of two (the paper's code): the 8-head slopes, then every other 16-head slope
    expected12 = [2.0 ** -(i + 1) for i in range(8)] + [2.0 ** -(0.5 * (2 * i + 1)) for i in range(4)]
    torch.testing.assert_close(alibi_slopes(12), torch.tensor(expected12))


def test_alibi_bias_is_minus_slope_times_distance():
    alibi = build_positions(ModelConfig(d_model=32, n_heads=4, position=PositionConfig(type="alibi")))
    bias = alibi.context(torch.arange(2, 5), torch.arange(5)).bias  # (H, S=3, T=5)
    assert bias.shape == (4, 3, 5)
    slopes = alibi_slopes(4)
    for h in range(4):
        for i, qi in enumerate(range(2, 5)):
            for j in range(5):
                assert bias[h, i, j].item() == pytest.approx(-slopes[h].item() * (qi - j))


def test_sinusoidal_matches_formula():
    d = 16
    pe_mod = build_positions(ModelConfig(d_model=d, n_heads=4, position=PositionConfig(type="sinusoidal")))
    pos = torch.arange(50)
    pe = pe_mod.embed(torch.zeros(1, 50, d), pos)[0]
    for p in (0, 1, 7, 49):
        for i in range(d // 2):
            angle = p / 10000 ** (2 * i / d)
            assert pe[p, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-5)
            assert pe[p, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-5)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("buckets, reach", [(32, 128), (8, 20), (16, 16)])
def test_relative_buckets_equal_t5s(bidirectional, buckets, reach):
    """T5's bucketing (transformers' ``T5Attention._relative_position_bucket``) on offsets -300 ... 300."""
    from transformers.models.t5.modeling_t5 import T5Attention

    from archlab.nn.positions import relative_bucket

    offset = torch.arange(-300, 301)[None, :] - torch.arange(0, 5)[:, None]
    ours = relative_bucket(offset, bidirectional, buckets, reach)
    theirs = T5Attention._relative_position_bucket(offset, bidirectional, buckets, reach)
    assert torch.equal(ours, theirs)
    assert int(ours.max()) == buckets - 1 and int(ours.min()) == 0


def test_a_position_encoding_receives_its_node_and_its_site():
    """Built from its own config and the site's facts, not the model config: the same module as the model's."""
    cfg = rope_cfg("linear", 2.0)
    own = RotaryPositions(cfg.position, d_model=64, n_heads=4, max_seq_len=256, rotary_dim=16)
    torch.testing.assert_close(own.inv_freq, build_positions(cfg).inv_freq)
    assert own.inv_freq.shape == (8,)
