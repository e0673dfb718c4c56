"""Import from Hugging Face (``archlab.from_hf``), every family: a random-init tiny ``transformers`` model saved
to a folder becomes an archlab run whose logits equal the HF model's (fp32, CPU, default assert_close
tolerances, as the export tests), and exporting that run gives back the same tensors, key for key, exactly."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

import archlab
from archlab.hf import export_hf
from archlab.train.checkpoint import load_model

V = 300  # >= archlab's 260 for a recipe without a tokenizer file


def _configs():
    import transformers as T

    small = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4)
    llama = dict(small, intermediate_size=64, num_key_value_heads=2, max_position_embeddings=64,
                 tie_word_embeddings=False)
    return {
        "gpt2": T.GPT2Config(vocab_size=V, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                             activation_function="gelu_new"),
        "gptj": T.GPTJConfig(vocab_size=V, n_positions=32, n_embd=32, n_layer=2, n_head=4, rotary_dim=8,
                             activation_function="gelu_new", tie_word_embeddings=False),
        "gpt_neox": T.GPTNeoXConfig(**small, intermediate_size=64, max_position_embeddings=32, hidden_act="gelu_new",
                                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                     "partial_rotary_factor": 1.0}),
        "llama": T.LlamaConfig(**llama, attention_bias=True),
        "mistral": T.MistralConfig(**llama, sliding_window=6),
        "mixtral": T.MixtralConfig(**{**llama, "intermediate_size": 24}, num_local_experts=4, num_experts_per_tok=2),
        "qwen3_moe": T.Qwen3MoeConfig(**llama, head_dim=8, moe_intermediate_size=24, num_experts=4,
                                      num_experts_per_tok=2, mlp_only_layers=[0], norm_topk_prob=False),
        "olmoe": T.OlmoeConfig(**{**llama, "intermediate_size": 24}, num_experts=4, num_experts_per_tok=2),
        "deepseek_v3": T.DeepseekV3Config(**{**small, "num_hidden_layers": 3}, num_key_value_heads=4,
                                          intermediate_size=64, moe_intermediate_size=16, n_routed_experts=8,
                                          num_experts_per_tok=2, n_shared_experts=1, n_group=2, topk_group=1,
                                          first_k_dense_replace=1, q_lora_rank=16, kv_lora_rank=16,
                                          qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, rms_norm_eps=1e-6,
                                          max_position_embeddings=64, routed_scaling_factor=2.5),
        "bert": T.BertConfig(**small, intermediate_size=64, max_position_embeddings=32, hidden_act="gelu_new",
                             type_vocab_size=1),
        "t5": T.T5Config(vocab_size=V, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                         feed_forward_proj="relu", decoder_start_token_id=V - 1,
                         relative_attention_num_buckets=8, relative_attention_max_distance=16),
    }


# what archlab has no tensor for, zero (GPT-J's head bias; BERT's token types: folded into the positions on import,
# test_bert_token_type_row_folds_into_the_positions), so that the export gives back every tensor
KEEP_ZERO = {"lm_head.bias", "bert.embeddings.token_type_embeddings.weight"}


def hf_model(family: str, seed: int = 0, config=None):
    """A random ``transformers`` model of ``family`` (of ``config``, else the family's tiny one): every tensor
    drawn (norm gains around 1), so that no mapping error hides behind an init value."""
    import transformers as T

    torch.manual_seed(seed)
    config = config if config is not None else _configs()[family]
    hf = getattr(T, archlab.hf.ADAPTERS.get(family).hf_class_name)(config).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name in KEEP_ZERO:
                p.zero_()
            else:
                p.copy_(torch.randn_like(p) * 0.2 + (1.0 if "norm" in name.lower() and p.ndim == 1
                                                     and "bias" not in name else 0.0))
        for name, b in hf.named_buffers():
            if name.endswith("e_score_correction_bias"):  # DeepSeek-V3's selection bias: a buffer
                b.copy_(torch.randn_like(b) * 0.2)
    return hf


def logits(model_or_hf, ids, dec=None, hf: bool = False):
    with torch.no_grad():
        if dec is None:
            return model_or_hf(ids).logits
        return model_or_hf(input_ids=ids, decoder_input_ids=dec).logits if hf else model_or_hf(ids, dec).logits


FAMILIES = ("bert", "deepseek_v3", "gpt2", "gpt_neox", "gptj", "llama", "mistral", "mixtral", "olmoe", "qwen3_moe",
            "t5")


@pytest.mark.parametrize("family", FAMILIES)
def test_import_keeps_the_logits_and_export_gives_back_the_same_tensors(family, tmp_path):
    _import_and_export(hf_model(family), family, tmp_path)


@pytest.mark.parametrize("family", ["bert", "gpt_neox"])
def test_the_exact_gelu_imports_and_exports(family, tmp_path):
    """hidden_act='gelu' (erf; BERT's default, Pythia's) is archlab's ffn.approximate=none, and back."""
    kept = dict(_configs()[family].to_dict())
    kept.pop("hidden_act")  # BERT's default is the exact GELU; GPT-NeoX's too: set it by name all the same
    config = type(_configs()[family])(**kept)
    if family == "gpt_neox":
        config.hidden_act = "gelu"
    assert config.hidden_act == "gelu"
    model = _import_and_export(hf_model(family, config=config), family, tmp_path)
    assert model.cfg.ffn.type == "gelu" and model.cfg.ffn.approximate == "none"
    assert json.loads((tmp_path / "back" / "config.json").read_text())["hidden_act"] == "gelu"


def _import_and_export(hf, family: str, tmp_path):
    """Import ``hf`` (logits equal), export the run (every tensor given back exactly); the archlab model."""
    hf.save_pretrained(tmp_path / "hf")
    run = archlab.from_hf(tmp_path / "hf", tmp_path / "runs" / family)
    model, _ = load_model(run)
    ids = torch.randint(0, V, (2, 16))
    dec = torch.randint(0, V, (2, 9)) if family == "t5" else None
    theirs, ours = logits(hf, ids, dec, hf=True), logits(model, ids, dec)
    torch.testing.assert_close(theirs, ours)
    print(f"{family}: max |logit diff| {float((theirs - ours).abs().max()):.2e}")

    out = export_hf(model, tmp_path / "back")
    before, after = load_file(str(tmp_path / "hf" / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert sorted(before) == sorted(after)
    unequal = [k for k in before if not torch.equal(before[k], after[k])]
    assert not unequal, unequal
    return model


def test_bert_token_type_row_folds_into_the_positions(tmp_path):
    """HF adds token type 0 to every position when no types are given: the import adds it to the position table."""
    hf = hf_model("bert")
    with torch.no_grad():
        hf.bert.embeddings.token_type_embeddings.weight.normal_(0, 0.5)
    hf.save_pretrained(tmp_path / "hf")
    model, _ = load_model(archlab.from_hf(tmp_path / "hf", tmp_path / "run"))
    ids = torch.randint(0, V, (2, 16))
    torch.testing.assert_close(logits(hf, ids, hf=True), logits(model, ids))


def test_olmoe_renormalised_with_biases_imports_and_exports(tmp_path):
    """norm_topk_prob=true (moe.router.renormalize) and attention_bias=true, multi-head: OLMoE's other settings."""
    import transformers as T

    config = T.OlmoeConfig(vocab_size=V, hidden_size=32, intermediate_size=24, num_hidden_layers=2,
                           num_attention_heads=4, max_position_embeddings=64, num_experts=4, num_experts_per_tok=2,
                           norm_topk_prob=True, attention_bias=True)
    model = _import_and_export(hf_model("olmoe", config=config), "olmoe", tmp_path)
    a, m = model.cfg.attention, model.cfg.moe
    assert (a.qk_norm, a.qk_norm_over, a.bias, m.router.renormalize) == (True, "projection", True, True)
    assert model.blocks[0].attn.q_norm.weight.shape == (32,) and model.blocks[0].attn.k_norm.weight.shape == (32,)


def test_the_olmoe_recipe_exports_as_olmoe_and_a_per_head_qk_norm_does_not():
    from archlab.hf import find_adapter

    shrink = ["model.d_model=64", "model.n_layers=2", "model.n_heads=4", "model.moe.num_experts=4",
              "model.moe.top_k=2", "model.moe.expert_hidden=32", "model.max_seq_len=64", "train.seq_len=64"]
    cfg = archlab.model_config(archlab.load_recipe("recipes/olmoe/1b-7b.yaml", shrink))
    assert find_adapter(cfg).family == "olmoe"
    per_head = archlab.model_config(archlab.load_recipe("recipes/olmoe/1b-7b.yaml",
                                                        [*shrink, "model.attention.qk_norm_over=head"]))
    why = archlab.hf.ADAPTERS.get("olmoe")().matches(per_head)
    assert why is not None and "qk_norm_over=head" in why


@pytest.mark.parametrize("family,key,value,rule", [
    ("gpt2", "activation_function", "gelu_fast", "gelu_new / gelu_pytorch_tanh"),
    ("llama", "hidden_act", "gelu", "hidden_act='silu'"),
    ("llama", "rope_parameters", {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
     "default, linear and yarn"),
    ("t5", "tie_word_embeddings", False, "tie_word_embeddings=true"),
    ("gpt_neox", "use_parallel_residual", False, "use_parallel_residual=true"),
    ("olmoe", "clip_qkv", 8.0, "clip_qkv=null"),
])
def test_a_key_archlab_cannot_express_is_refused_by_name(family, key, value, rule, tmp_path):
    config = _configs()[family]
    setattr(config, key, value)
    config.save_pretrained(tmp_path / "hf")
    shown = "rope_parameters.rope_type" if key == "rope_parameters" else key
    with pytest.raises(ValueError, match=rf"config.json: {shown}=.*archlab supports .*{rule}") as err:
        archlab.from_hf(tmp_path / "hf", tmp_path / "run")
    assert "\n" not in str(err.value)


def test_an_existing_run_folder_is_refused_without_force(tmp_path):
    hf_model("gpt2").save_pretrained(tmp_path / "hf")
    run = archlab.from_hf(tmp_path / "hf", tmp_path / "run")
    with pytest.raises(FileExistsError, match="already exists.*--force"):
        archlab.from_hf(tmp_path / "hf", run)
    shutil.rmtree(run / "checkpoints")
    archlab.from_hf(tmp_path / "hf", run, force=True)
    assert load_model(run)[0].cfg.n_layers == 2
