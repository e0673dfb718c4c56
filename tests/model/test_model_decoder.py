"""The decoder: every recipe builds, parameters are counted from the config, causality, init.

Shape legend: B batch, S sequence, V vocabulary.
"""

import math
import random
from pathlib import Path

import pytest
import torch

import archlab
from archlab.config.schema import (
    AttentionConfig,
    FFNConfig,
    ModelConfig,
    NormConfig,
    PositionConfig,
    RopeScalingConfig,
)
from archlab.nn.attention import GatedDeltaNetConfig, MHAConfig, MLAConfig, SlidingWindowConfig
from archlab.nn.ffn import SwiGLUConfig
from archlab.nn.norms import LayerNormConfig

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted(p for p in (ROOT / "recipes").rglob("*.yaml") if "launch" not in p.relative_to(ROOT / "recipes").parts)
BUILD_ON_CPU_BELOW = 2_500_000  # bigger models are built on the meta device (no memory, no init time)


def test_recipes_found():
    assert len(RECIPES) >= 10, RECIPES


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: str(p.relative_to(ROOT / "recipes")))
def test_recipe_loads_builds_and_counts_its_parameters(path):
    cfg = archlab.load_recipe(path)
    expected = archlab.num_params(cfg)
    device = "meta" if expected > BUILD_ON_CPU_BELOW else None
    model = archlab.build_model(cfg, device=device)
    assert sum(p.numel() for p in model.parameters()) == expected
    if device is None:
        ids = torch.randint(0, cfg.model.vocab_size, (2, 8))
        out = model(ids, ids) if cfg.model.type == "encoder_decoder" else model(ids)  # T5 also reads decoder ids
        assert out.logits.shape == (2, 8, cfg.model.vocab_size)
        assert out.aux_loss.shape == () and torch.isfinite(out.logits).all()


def random_model_config(rng: random.Random) -> ModelConfig:
    n_heads = rng.choice([1, 2, 4, 8])
    d_model = n_heads * rng.choice([2, 4, 6, 8])
    position = rng.choice(["learned", "sinusoidal", "rope", "alibi", "none"])
    scaling = rng.choice(["none", "linear", "ntk", "yarn"]) if position == "rope" else "none"
    vocab_size, max_seq_len, n_layers = rng.randint(5, 300), rng.randint(4, 64), rng.randint(1, 4)
    n_kv_heads = rng.choice([g for g in range(1, n_heads + 1) if n_heads % g == 0] + [None])
    norm_type, placement = rng.choice(["layernorm", "rmsnorm"]), rng.choice(["pre", "post"])
    norm_bias = rng.random() < 0.5
    attention = MHAConfig(bias=rng.random() < 0.5, qk_norm=rng.random() < 0.3)
    ffn_type, ffn_bias = rng.choice(["gelu", "relu", "swiglu"]), rng.random() < 0.5
    hidden, multiple_of = rng.choice([None, rng.randint(1, 50)]), rng.choice([1, 8, 32])
    # a key only another variant reads stays at its default (archlab.config.options refuses it otherwise)
    return ModelConfig(
        vocab_size=vocab_size, max_seq_len=max_seq_len, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        norm=LayerNormConfig(type=norm_type, placement=placement, bias=norm_bias if norm_type == "layernorm" else True),
        position=PositionConfig(type=position, rope_scaling=RopeScalingConfig(
            type=scaling, factor=1.0 if scaling == "none" else 2.0)),
        attention=attention,
        ffn=SwiGLUConfig(bias=ffn_bias, hidden=hidden, multiple_of=multiple_of if hidden is None else 32)
        if ffn_type == "swiglu" else FFNConfig(type=ffn_type, bias=ffn_bias, hidden=hidden),
        tie_embeddings=rng.random() < 0.5,
    )


def test_param_count_from_config_on_random_configs():
    rng = random.Random(0)
    for _ in range(40):
        c = random_model_config(rng)
        model = archlab.build_model(c)
        assert archlab.num_params(c) == sum(p.numel() for p in model.parameters()), c


def tiny(position: str, **kw) -> ModelConfig:
    base = dict(vocab_size=50, max_seq_len=32, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                position=PositionConfig(type=position))
    base.update(kw)
    return ModelConfig(**base)


ATTENTION_OPTIONS = {  # small settings of each attention variant (a window shorter than the 12-token test)
    "mha": AttentionConfig(),
    "sliding_window": SlidingWindowConfig(window=4),
    "mla": MLAConfig(q_lora_rank=12, kv_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=8,
                           v_head_dim=8),
    "gated_deltanet": GatedDeltaNetConfig(gdn_chunk_size=5),  # chunks that do not divide 12
}
REFUSED_PAIRS = {("sliding_window", "alibi"), ("sliding_window", "relative")} | {
    ("mla", p) for p in ("learned", "sinusoidal", "alibi", "relative", "none")} | {
    ("gated_deltanet", p) for p in ("rope", "alibi", "relative")}


def attention_tiny(attention: str, position: str, **kw) -> ModelConfig:
    kv = None if attention == "mla" else 2
    return tiny(position, attention=ATTENTION_OPTIONS[attention], n_kv_heads=kv, **kw)


def _pairs() -> list[tuple[str, str]]:
    from archlab.config import RecipeError
    from archlab.config.validate import validate_model
    from archlab.nn.attention import ATTENTIONS
    from archlab.nn.positions import POSITIONS

    valid, refused = [], set()
    for a in ATTENTIONS.names():
        for p in POSITIONS.names():
            try:
                validate_model(attention_tiny(a, p))
                valid.append((a, p))
            except RecipeError:
                refused.add((a, p))
    assert refused == REFUSED_PAIRS  # only the documented combinations are refused
    return valid


@pytest.mark.parametrize("attention, position", _pairs())
@pytest.mark.parametrize("placement", ["pre", "post"])
def test_changing_token_t_never_changes_earlier_logits(attention, position, placement):
    """Causality for every attention x position combination a recipe may use."""
    model = archlab.build_model(attention_tiny(attention, position, norm=NormConfig(placement=placement))).eval()
    ids = torch.randint(0, 50, (2, 12))
    base = model(ids).logits
    for t in (0, 5, 11):
        changed = ids.clone()
        changed[:, t] = (changed[:, t] + 1) % 50
        logits = model(changed).logits
        torch.testing.assert_close(logits[:, :t], base[:, :t], rtol=0, atol=0)
        assert not torch.allclose(logits[:, t], base[:, t])


def test_tied_and_untied_embeddings():
    tied = archlab.build_model(tiny("rope", tie_embeddings=True))
    untied = archlab.build_model(tiny("rope", tie_embeddings=False))
    assert tied.lm_head.weight is tied.embed.weight
    assert untied.lm_head.weight is not untied.embed.weight
    assert archlab.num_params(untied.cfg) - archlab.num_params(tied.cfg) == 50 * 32


@pytest.mark.parametrize("tie", [True, False])
def test_scale_embeddings_multiplies_the_input_embedding_only(tie):
    """scale_embeddings (the 2017 Transformer): the input side sees sqrt(d_model) x the table, the
    LM head (tied or not) its weights as they are; the same as an untied model whose input table is
    pre-multiplied, so the scaled model is exactly that and nothing else. No extra parameters."""
    cfg = tiny("sinusoidal", tie_embeddings=tie, scale_embeddings=True)
    scaled = archlab.build_model(cfg)
    plain = archlab.build_model(tiny("sinusoidal", tie_embeddings=False))
    plain.load_state_dict(scaled.state_dict(), strict=False)  # the head (tied: the same table)
    with torch.no_grad():
        plain.embed.weight.copy_(scaled.embed.weight * math.sqrt(32))
        plain.lm_head.weight.copy_(scaled.lm_head.weight)
    ids = torch.randint(0, 50, (2, 12))
    torch.testing.assert_close(scaled(ids).logits, plain(ids).logits)
    assert archlab.num_params(cfg) == archlab.num_params(tiny("sinusoidal", tie_embeddings=tie))


def test_gpt2_scaled_residual_init():
    """Residual projections (attention out, FFN down) get std init_std / sqrt(2 n_layers)."""
    c = ModelConfig(vocab_size=64, d_model=256, n_layers=8, n_heads=4, init_std=0.02)
    model = archlab.build_model(c)
    res_std = 0.02 / math.sqrt(16)
    for blk in model.blocks:
        assert blk.attn.wo.weight.std().item() == pytest.approx(res_std, rel=0.05)
        assert blk.ffn.down.weight.std().item() == pytest.approx(res_std, rel=0.05)
        assert blk.attn.wqkv.weight.std().item() == pytest.approx(0.02, rel=0.05)
        assert torch.all(blk.attn.wqkv.bias == 0)
    assert model.embed.weight.std().item() == pytest.approx(0.02, rel=0.05)
    flat = archlab.build_model(ModelConfig(vocab_size=64, d_model=256, n_layers=8, n_heads=4,
                                           scaled_residual_init=False))
    assert flat.blocks[0].attn.wo.weight.std().item() == pytest.approx(0.02, rel=0.05)


def test_post_ln_has_no_final_norm_and_pre_ln_does():
    post_ln = archlab.build_model(tiny("none", norm=NormConfig(placement="post")))
    assert isinstance(post_ln.final_norm, torch.nn.Identity)
    assert not isinstance(archlab.build_model(tiny("none")).final_norm, torch.nn.Identity)


def test_learned_positions_refuse_to_extrapolate():
    model = archlab.build_model(tiny("learned", max_seq_len=8))
    with pytest.raises(ValueError, match="beyond the learned table"):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_dropout_only_in_training():
    model = archlab.build_model(tiny("rope", dropout=0.3))
    ids = torch.randint(0, 50, (2, 8))
    model.train()
    assert not torch.allclose(model(ids).logits, model(ids).logits)
    model.eval()
    torch.testing.assert_close(model(ids).logits, model(ids).logits)


def test_backward_reaches_every_parameter():
    model = archlab.build_model(tiny("rope", attention=MHAConfig(qk_norm=True), tie_embeddings=False))
    ids = torch.randint(0, 50, (2, 8))
    model(ids).logits.logsumexp(-1).mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
