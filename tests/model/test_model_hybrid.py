"""Hybrid decoders (``model.layers.pattern``): which mixer each layer gets, the pattern's refusals, parameters and
the generation cache (KV of the attention layers, fixed-size state of the Gated DeltaNet layers) against the built
model, generation against a full forward, logits equal to transformers' Qwen3-Next with copied weights, and the
hybrid and pure Gated DeltaNet recipes training a few steps.

Shape legend: B batch, S sequence, V vocabulary.
"""

import sys
from pathlib import Path

import pytest
import torch

import archlab
from archlab.config.schema import FFNConfig, LayersConfig, ModelConfig, NormConfig, PositionConfig
from archlab.costs import kv_cache_bytes
from archlab.errors import RecipeError
from archlab.model.validate import validate_model
from archlab.nn.attention import AttentionConfig, GatedDeltaNetConfig, LayerKVCache, LayerStateCache
from archlab.nn.component import variant_class

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "nn"))
from test_nn_attention_gated_deltanet import copy_from_hf, randomise  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PATTERN = ["gated_deltanet", "gated_deltanet", "gated_deltanet", "mha"]
HYBRID = variant_class(AttentionConfig, ["gated_deltanet", "mha"])  # the pattern's config: the keys of both


def hybrid(n_layers=4, pattern=PATTERN, **attention) -> ModelConfig:
    return ModelConfig(vocab_size=61, max_seq_len=64, d_model=32, n_layers=n_layers, n_heads=4, n_kv_heads=2,
                       norm=NormConfig(type="rmsnorm", eps=1e-6), position=PositionConfig(type="rope"),
                       attention=HYBRID(bias=False, qk_norm=True, gdn_k_heads=2, gdn_v_heads=4, gdn_chunk_size=8,
                                        gdn_kernels="torch", **attention),
                       ffn=FFNConfig(type="swiglu", bias=False), layers=LayersConfig(pattern=list(pattern)),
                       tie_embeddings=False)


def test_the_pattern_places_the_mixers_and_says_which():
    model = archlab.build_model(hybrid(n_layers=8))
    assert [b.attn.type_name for b in model.blocks] == PATTERN * 2
    assert archlab.num_params(model.cfg) == sum(p.numel() for p in model.parameters())
    kinds = [type(layer) for layer in model.new_kv_cache().layers]
    assert kinds == [LayerStateCache] * 3 + [LayerKVCache] + [LayerStateCache] * 3 + [LayerKVCache]


@pytest.mark.parametrize("change, message", [
    (dict(pattern=["gated_deltanet", "mamba"]), r"layers.pattern\[1\]='mamba': must be one of gated_deltanet, mha"),
    (dict(n_layers=6), "must be a multiple of the layer pattern's length \\(4\\)"),
])
def test_a_bad_pattern_is_refused(change, message):
    with pytest.raises(RecipeError, match=message):
        validate_model(hybrid(**change))


def test_attention_type_beside_a_pattern_and_a_pattern_outside_a_decoder_are_refused():
    cfg = hybrid()
    cfg.attention.type = "sliding_window"
    with pytest.raises(RecipeError, match="attention.type='sliding_window': model.layers.pattern places"):
        validate_model(cfg)
    with pytest.raises(RecipeError, match="a layer pattern needs model.type decoder"):
        archlab.load_recipe(ROOT / "recipes/bert/tiny.yaml", ["model.layers.pattern=[mha]"])


def test_options_of_every_patterned_type_are_read_and_others_refused():
    validate_model(hybrid())  # gdn_* and qk_norm: read by a type of the pattern
    with pytest.raises(RecipeError, match=r"gdn_k_heads=2: not a key of attention.type mha \(its keys: type, bias, "
                                          r"scale, dropout, qk_norm, qk_norm_over, output_gate, rotary_fraction\); "
                                          "gdn_k_heads is read by attention.type gated_deltanet"):
        archlab.load_recipe(ROOT / "recipes/llama/tiny.yaml", ["model.attention.gdn_k_heads=2"])
    with pytest.raises(RecipeError, match=r"window=8: not a key of attention.type gated_deltanet, mha \(its keys: "
                                          r".*\); window is read by attention.type sliding_window"):
        archlab.load_recipe(ROOT / "recipes/hybrid/tiny.yaml", ["model.attention.window=8"])


def test_generation_through_the_cache_equals_a_full_forward():
    model = archlab.build_model(hybrid()).eval()
    ids = torch.randint(0, 61, (2, 19))
    with torch.no_grad():
        full = model(ids).logits
        cache = model.new_kv_cache()
        steps = [model(ids[:, :7], kv_cache=cache).logits] + [
            model(ids[:, t:t + 1], kv_cache=cache).logits for t in range(7, 19)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def _held(cache) -> int:
    return sum(layer.state.nbytes + layer.conv.nbytes if isinstance(layer, LayerStateCache)
               else layer.k.nbytes + layer.v.nbytes for layer in cache.layers)


def test_cache_bytes_are_the_cache_tensors_and_only_the_attention_layers_grow():
    cfg = hybrid()
    model = archlab.build_model(cfg).eval()
    held = {}
    for S in (20, 40):
        cache = model.new_kv_cache()
        with torch.no_grad():
            model(torch.randint(0, 61, (3, S)), kv_cache=cache)
        held[S] = _held(cache)
        assert kv_cache_bytes(cfg, batch=3, context=S, dtype="fp32") == held[S]
    kv_per_position = 3 * 2 * cfg.kv_heads * cfg.d_head * 4  # one mha layer, batch 3, fp32
    assert held[40] - held[20] == 20 * kv_per_position


# ----------------------------------------------------------------------------- Qwen3-Next parity

def test_logits_match_qwen3_next_with_linear_attention_layers_and_dense_mlps():
    """A Qwen3-Next whose layers are all linear attention with dense MLPs (``mlp_only_layers``) against the pure
    Gated DeltaNet decoder: its (1 + w) RMSNorms hold w + 1 in archlab's, its MLP's gate and up rows are
    archlab's [gate; up]. (The hybrid, with Qwen3-Next's gated, partly rotated full attention, is compared through
    the adapter: tests/hf/test_hf_qwen3_next.py.)"""
    transformers = pytest.importorskip("transformers")
    L, D, F = 3, 32, 48
    hf_cfg = transformers.Qwen3NextConfig(
        vocab_size=61, hidden_size=D, intermediate_size=F, num_hidden_layers=L, layer_types=["linear_attention"] * L,
        mlp_only_layers=list(range(L)), linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
        linear_value_head_dim=6, linear_conv_kernel_dim=4, rms_norm_eps=1e-6, tie_word_embeddings=False,
        num_attention_heads=4, num_key_value_heads=2, hidden_act="silu")
    theirs = transformers.Qwen3NextForCausalLM(hf_cfg).eval()
    randomise(theirs, 0)
    cfg = ModelConfig(vocab_size=61, max_seq_len=64, d_model=D, n_layers=L, n_heads=4,
                      norm=NormConfig(type="rmsnorm", eps=1e-6), position=PositionConfig(type="none"),
                      attention=GatedDeltaNetConfig(bias=False, gdn_k_heads=2, gdn_v_heads=4,
                                                gdn_k_head_dim=8, gdn_v_head_dim=6, gdn_kernels="torch"),
                      ffn=FFNConfig(type="swiglu", bias=False, hidden=F), tie_embeddings=False)
    mine = archlab.build_model(cfg).eval()
    with torch.no_grad():
        mine.embed.weight.copy_(theirs.model.embed_tokens.weight)
        mine.lm_head.weight.copy_(theirs.lm_head.weight)
        mine.final_norm.weight.copy_(1 + theirs.model.norm.weight)
        for block, layer in zip(mine.blocks, theirs.model.layers):
            copy_from_hf(block.attn, layer.linear_attn)
            block.attn_norm.weight.copy_(1 + layer.input_layernorm.weight)
            block.ffn_norm.weight.copy_(1 + layer.post_attention_layernorm.weight)
            block.ffn.gate_up.weight.copy_(torch.cat([layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight]))
            block.ffn.down.weight.copy_(layer.mlp.down_proj.weight)
    ids = torch.randint(0, 61, (2, 23))
    with torch.no_grad():
        torch.testing.assert_close(mine(ids).logits, theirs(ids, use_cache=False).logits, atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- recipes

@pytest.fixture(scope="module")
def data_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("hybrid-cache")  # one tokenizer for the four runs


@pytest.mark.parametrize("recipe", ["hybrid/tiny", "hybrid/s", "hybrid/qwen3-next-tiny", "gdn/tiny", "gdn/s"])
def test_recipe_trains(recipe, tmp_path, data_cache):
    """A few steps of each recipe at a CPU-test width (its depth cut to one pattern period)."""
    from archlab.train import train

    # a quarter of a 12-wide head is 3 channels, no RoPE pair: Qwen3-Next's partial RoPE keeps 24-wide heads
    heads = ["model.n_heads=2"] if recipe == "hybrid/qwen3-next-tiny" else []
    cfg = archlab.load_recipe(ROOT / "recipes" / f"{recipe}.yaml", [
        *heads, "model.vocab_size=384", "model.d_model=48", "model.n_layers=4", "model.attention.gdn_chunk_size=16",
        "train.seq_len=32", "train.micro_batch_size=4", "train.max_steps=3", "train.warmup_steps=1",
        "train.log_every=1", "train.eval_every=3", "train.eval_batches=1", "train.ckpt_every=100",
        "train.eval_context_multipliers=[1]", "data.max_bytes=60000", f"data.cache_dir={data_cache}",
        f"train.out_dir={tmp_path}", "train.run_name=run"])
    summary = train(cfg)
    assert summary["final_train_loss"] < 7.0 and torch.isfinite(torch.tensor(summary["final_train_loss"]))
