"""The recipes at the sizes users study (GPT-3 Medium/Large/XL, LLaMA-style 350M and 1B, Mixtral-style, OLMoE-
and DeepSeek-V2-Lite-shaped MoE). Each is built on the meta device (no memory): its parameters equal the cost
model's count (archlab.costs.param_counts); its shape is the published model's; at the published vocabulary its
count is the published one, to the precision printed; and it trains as its comment says (token shards with
GPT-2's tokenizer, bf16, compile, 20 tokens per (active) parameter, within an 80 GB GPU under the launch named).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import archlab
from archlab.costs import param_counts
from archlab.costs.plan import Launch, training_plan

ROOT = Path(__file__).resolve().parents[1]
GPUS = 8  # the processes the recipes' global batches and launch lines assume (recipes/launch/ddp-8gpu.yaml)
TOKENS_PER_PARAM = 20  # Chinchilla (Hoffmann et al. 2022), on the active parameters for MoE

# recipe -> the launch its comment names: (ZeRO stage, expert-parallel size) over GPUS processes
LAUNCH = {
    "dense/350m": (0, 1), "dense/760m": (0, 1), "dense/1.3b": (0, 1),
    "llama/350m": (0, 1), "llama/1b": (0, 1), "llama/v2-lite-dense": (0, 1),
    "mixtral/350m": (0, 1), "mixtral/1b": (2, 8), "deepseek/v2-lite": (2, 8), "olmoe/1b-7b": (2, 8),
}
NAMES = sorted(LAUNCH)

# the published shapes, from the papers and model configs (not from the recipes): dotted attributes of
# archlab.model_config(recipe)
SHAPES = {
    # GPT-3 (Brown et al. 2020, table 2.1), context 2048. XL prints 24 heads of 128, which do not tile
    # d=2048; the recipe keeps d_head 128 (16 heads): the count does not depend on the split
    "dense/350m": {"n_layers": 24, "d_model": 1024, "n_heads": 16, "ffn_hidden": 4096, "max_seq_len": 2048},
    "dense/760m": {"n_layers": 24, "d_model": 1536, "n_heads": 16, "ffn_hidden": 6144, "max_seq_len": 2048},
    "dense/1.3b": {"n_layers": 24, "d_model": 2048, "d_head": 128, "ffn_hidden": 8192, "max_seq_len": 2048},
    # SmolLM-360M's config.json (tied embeddings)
    "llama/350m": {"n_layers": 32, "d_model": 960, "n_heads": 15, "kv_heads": 5, "ffn_hidden": 2560,
                   "tie_embeddings": True, "max_seq_len": 2048},
    # TinyLlama-1.1B's config.json
    "llama/1b": {"n_layers": 22, "d_model": 2048, "n_heads": 32, "kv_heads": 4, "ffn_hidden": 5632,
                 "tie_embeddings": False, "max_seq_len": 2048},
    # DeepSeek-V2-Lite (DeepSeek-V2, appendix B; config.json): MLA, 64 routed top-6 + 2 shared experts of 1408,
    # first layer dense (10944); the dense peer has a SwiGLU of (6 + 2) * 1408 in every layer
    "deepseek/v2-lite": {"n_layers": 27, "d_model": 2048, "n_heads": 16, "attention.type": "mla",
                         "attention.q_lora_rank": None, "attention.kv_lora_rank": 512,
                         "attention.qk_nope_head_dim": 128, "attention.qk_rope_head_dim": 64,
                         "attention.v_head_dim": 128, "ffn_hidden": 10944, "moe.num_experts": 64, "moe.top_k": 6,
                         "moe.expert_hidden": 1408, "moe.n_shared_experts": 2, "moe.first_k_dense": 1,
                         "tie_embeddings": False},
    "llama/v2-lite-dense": {"n_layers": 27, "d_model": 2048, "n_heads": 16, "attention.type": "mla",
                            "attention.kv_lora_rank": 512, "ffn_hidden": (6 + 2) * 1408, "moe": None},
    # OLMoE-1B-7B (Muennighoff et al. 2024; config.json): 64 experts of 1024, top-8, no shared expert, QK-norm
    # over the whole query and key projections
    "olmoe/1b-7b": {"n_layers": 16, "d_model": 2048, "n_heads": 16, "kv_heads": 16, "attention.qk_norm": True,
                    "attention.qk_norm_over": "projection",
                    "moe.num_experts": 64, "moe.top_k": 8, "moe.expert_hidden": 1024, "moe.n_shared_experts": 0,
                    "moe.router.renormalize": False, "tie_embeddings": False, "max_seq_len": 4096},
    # Mixtral-style ladder: the LLaMA peer's shape, 8 experts of half its SwiGLU hidden, top-2
    "mixtral/350m": {"n_layers": 32, "d_model": 960, "moe.num_experts": 8, "moe.top_k": 2,
                     "moe.expert_hidden": 2560 // 2},
    "mixtral/1b": {"n_layers": 22, "d_model": 2048, "moe.num_experts": 8, "moe.top_k": 2,
                   "moe.expert_hidden": 5632 // 2},
}


def around(printed: float, half: float) -> tuple[float, float]:
    """The counts that print as ``printed``: within ``half`` of it (half a unit of its last printed digit)."""
    return printed - half, printed + half


# Published counts: (recipe, overrides giving the published model's vocabulary, count, (low, high) range of the
# printed value). The recipes hold GPT-2's 50257 ids in 50304 rows (FineWeb shards); the published models'
# vocabularies are restored here. Counts: "total"; "active"; "active_no_input_table": active without the input
# embedding table.
PUBLISHED = {
    # GPT-3 table 2.1 (GPT-2's 50257 ids, tied embeddings, 2048 learned positions)
    "gpt3-small": ("dense/125m", ["model.vocab_size=50257"], "total", around(125e6, 0.5e6)),
    # the table's "350M" is a label: the shape it prints holds 355.9M (1.7% more), so 2% here
    "gpt3-medium": ("dense/350m", ["model.vocab_size=50257"], "total", around(350e6, 0.02 * 350e6)),
    "gpt3-large": ("dense/760m", ["model.vocab_size=50257"], "total", around(760e6, 0.5e6)),
    "gpt3-xl": ("dense/1.3b", ["model.vocab_size=50257"], "total", around(1.3e9, 0.05e9)),
    # SmolLM-360M (49152 ids, tied): the Hugging Face hub's size of its safetensors, 362M
    "smollm-360m": ("llama/350m", ["model.vocab_size=49152"], "total", around(362e6, 0.5e6)),
    # TinyLlama-1.1B (LLaMA-2's 32000 ids, untied): exactly 1,100,048,384 (its safetensors), printed 1.1B
    "tinyllama-1.1b": ("llama/1b", ["model.vocab_size=32000"], "total", around(1_100_048_384, 0)),
    # OLMoE-1B-7B (50304 rows, as the recipe; untied), paper: 6.9B total, 1.3B active; exactly 6,919,161,856 as
    # OlmoeForCausalLM at its config (the q/k norms' gains span the projections: 2048 each)
    "olmoe-total": ("olmoe/1b-7b", [], "total", around(6_919_161_856, 0)),
    "olmoe-active": ("olmoe/1b-7b", [], "active", around(1.3e9, 0.05e9)),
    # DeepSeek-V2-Lite (102400 ids, untied): 15.7B total; its "2.4B activated" is the active count without the
    # input embedding table (2.451B; with both tables 2.66B), printed truncated
    "v2-lite-total": ("deepseek/v2-lite", ["model.vocab_size=102400"], "total", around(15.7e9, 0.05e9)),
    "v2-lite-active": ("deepseek/v2-lite", ["model.vocab_size=102400"], "active_no_input_table", (2.4e9, 2.5e9)),
}


def load(name: str, overrides=()):
    return archlab.load_recipe(ROOT / "recipes" / f"{name}.yaml", list(overrides))


def built_counts(cfg) -> dict[str, int]:
    """Counted on the module built on the meta device: total; active leaves out, per MoE layer, the (E - K) / E
    share of its routed experts that a token does not visit; the input embedding table."""
    model = archlab.build_model(cfg, device="meta")
    total = sum(p.numel() for p in model.parameters())  # a tied head appears once
    inactive = 0
    for block in model.blocks:
        if block.is_moe:
            E, K = block.ffn.moe.num_experts, block.ffn.moe.top_k
            inactive += sum(p.numel() for p in block.ffn.experts.parameters()) * (E - K) // E
    active = total - inactive
    return {"total": total, "active": active, "active_no_input_table": active - model.embed.weight.numel()}


def attr(obj, dotted: str):
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def published_matches(name: str, overrides=()) -> bool:
    """Whether the recipe (with ``overrides`` on top of the published vocabulary) has the published count."""
    recipe, vocab, kind, (low, high) = PUBLISHED[name]
    return low <= built_counts(load(recipe, [*vocab, *overrides]))[kind] <= high


def test_every_recipe_has_a_shape_and_a_launch():
    assert set(SHAPES) == set(LAUNCH)
    assert all((ROOT / "recipes" / f"{n}.yaml").is_file() for n in NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_built_model_matches_the_cost_model(name):
    cfg = load(name)
    counts = param_counts(cfg)
    built = built_counts(cfg)
    assert (built["total"], built["active"]) == (counts.total, counts.active)
    if cfg.model.moe is not None:
        assert counts.total > 2.5 * counts.active  # really sparse


@pytest.mark.parametrize("name", NAMES)
def test_recipe_has_the_published_shape(name):
    m = archlab.model_config(load(name))
    assert {key: attr(m, key) for key in SHAPES[name]} == SHAPES[name]


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_count_at_the_published_vocabulary_is_the_published_one(name):
    recipe, vocab, kind, (low, high) = PUBLISHED[name]
    n = built_counts(load(recipe, vocab))[kind]
    assert low <= n <= high, (recipe, kind, n, low, high)


@pytest.mark.parametrize("name, wrong", [("gpt3-large", "model.n_layers=23"), ("olmoe-total", "model.n_layers=15"),
                                         ("tinyllama-1.1b", "model.ffn.hidden=5504"),
                                         ("v2-lite-total", "model.moe.num_experts=56")])
def test_a_wrong_shape_misses_the_published_count(name, wrong):
    """The check above has teeth: one layer, expert or FFN width off and the count leaves the printed range."""
    assert published_matches(name) and not published_matches(name, [wrong])


@pytest.mark.parametrize("name", NAMES)
def test_recipe_trains_on_gpt2_token_shards_in_bf16_compiled(name):
    cfg = load(name)
    d, t = cfg.data, cfg.train
    assert (d.source, d.shard_format) == ("tokens", "llmc") and "fineweb" in d.train_shards
    assert "fineweb" in d.val_shards and str(d.tokenizer).endswith("gpt2/tokenizer.json")
    assert cfg.model.vocab_size == 50304  # GPT-2's 50257 ids, padded to a multiple of 64
    assert (t.precision, t.compile, t.seq_len) == ("bf16", True, cfg.model.max_seq_len)


@pytest.mark.parametrize("name", NAMES)
def test_token_budget_is_20_tokens_per_active_parameter(name):
    cfg = load(name)
    t = cfg.train
    tokens = t.max_steps * t.micro_batch_size * t.grad_accum * GPUS * t.seq_len
    assert tokens / (TOKENS_PER_PARAM * param_counts(cfg).active) == pytest.approx(1.0, abs=0.02)


@pytest.mark.parametrize("name", NAMES)
def test_training_fits_an_80gb_gpu_under_its_launch(name):
    """The plan (archlab.costs.plan: checked against torch's MemTracker under FakeTensorMode) of the launch the
    recipe's comment names fits an H100 with 10% of it kept free (CUDA context, NCCL, fragmentation)."""
    zero, ep = LAUNCH[name]
    cfg = load(name, [f"model.moe.ep_size={ep}"] if ep > 1 else [])
    plan = training_plan(cfg, Launch(world=GPUS, backend="deepspeed" if zero else "plain", zero_stage=zero), gpu="h100")
    assert plan.fits, f"{plan.memory.peak / 2**30:.1f} GiB of {plan.usable_bytes / 2**30:.1f}"


@pytest.mark.parametrize("moe, peer", [("mixtral/350m", "llama/350m"), ("mixtral/1b", "llama/1b"),
                                       ("deepseek/v2-lite", "llama/v2-lite-dense")])
def test_moe_recipe_has_its_dense_peers_active_parameters(moe, peer):
    """Active = the peer's total + the routers - what a narrower dense first layer saves (SwiGLU: 3 * D * H)."""
    cfg = load(moe)
    assert cfg.compare_with == f"recipes/{peer}.yaml"
    m, p = archlab.model_config(cfg), archlab.model_config(load(peer))
    routers = sum(m.d_model * m.moe.num_experts for i in range(m.n_layers) if m.is_moe_layer(i))
    narrower = m.moe.first_k_dense * 3 * m.d_model * (p.ffn_hidden - m.ffn_hidden)
    assert param_counts(m).active == param_counts(p).total + routers - narrower
