"""Generation: KV-cache logits equal a full forward; greedy decoding; top-k / top-p filtering.

Shape legend: B batch, S sequence, V vocabulary.
"""

import pytest
import torch

import archlab
from archlab.config.schema import AttentionConfig, ModelConfig, PositionConfig, RopeScalingConfig
from archlab.model.generate import filter_logits
from archlab.nn.attention import MLAConfig, SlidingWindowConfig

ATTENTION = {
    "mha": AttentionConfig(),
    "sliding_window": SlidingWindowConfig(window=5),  # the 14 tokens span several windows
    "global_every_2": SlidingWindowConfig(window=5, global_every=2),
    "mla": MLAConfig(q_lora_rank=12, kv_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=8,
                           v_head_dim=8),
}


def model_for(position: str, n_kv_heads: int = 2, scaling: str = "none", attention: str = "mha"):
    c = ModelConfig(vocab_size=40, max_seq_len=32, d_model=32, n_layers=2, n_heads=4,
                    n_kv_heads=None if attention == "mla" else n_kv_heads, attention=ATTENTION[attention],
                    position=PositionConfig(type=position, rope_scaling=RopeScalingConfig(
                        type=scaling, factor=1.0 if scaling == "none" else 2.0)))
    return archlab.build_model(c).eval()


@pytest.mark.parametrize("position,n_kv_heads,scaling,attention", [
    ("learned", 4, "none", "mha"), ("sinusoidal", 4, "none", "mha"), ("rope", 2, "none", "mha"),
    ("rope", 1, "yarn", "mha"), ("alibi", 2, "none", "mha"), ("none", 1, "none", "mha"),
    ("rope", 2, "none", "sliding_window"), ("sinusoidal", 1, "none", "sliding_window"),
    ("learned", 4, "none", "sliding_window"), ("none", 2, "none", "global_every_2"),
    ("rope", 4, "none", "mla"), ("rope", 4, "yarn", "mla"),
])
def test_kv_cache_logits_equal_full_forward(position, n_kv_heads, scaling, attention):
    model = model_for(position, n_kv_heads, scaling, attention)
    ids = torch.randint(0, 40, (3, 14))
    with torch.no_grad():
        full = model(ids).logits  # (B, S, V)
        cache = model.new_kv_cache()
        steps = [model(ids[:, :6], kv_cache=cache).logits]  # the prompt at once
        for t in range(6, 14):  # then one token at a time
            steps.append(model(ids[:, t:t + 1], kv_cache=cache).logits)
    assert cache.length == 14
    torch.testing.assert_close(torch.cat(steps, dim=1), full)


def test_greedy_generate_equals_argmax_of_full_forward():
    model = model_for("rope")
    prompt = torch.randint(0, 40, (2, 5))
    out = archlab.generate(model, prompt, max_new_tokens=8, temperature=0)
    assert out.shape == (2, 13) and torch.equal(out[:, :5], prompt)
    ids = prompt
    with torch.no_grad():
        for _ in range(8):  # no cache: the slow, obviously right way
            ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, ids)


def test_sampling_is_reproducible_with_a_generator_and_restores_train_mode():
    model = model_for("alibi").train()
    prompt = torch.randint(0, 40, (2, 3))
    a = archlab.generate(model, prompt, 10, temperature=1.0, top_k=5, generator=torch.Generator().manual_seed(1))
    b = archlab.generate(model, prompt, 10, temperature=1.0, top_k=5, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and model.training


def test_eos_stops_a_row_and_pads_it():
    model = model_for("rope")
    prompt = torch.randint(0, 40, (2, 3))
    greedy = archlab.generate(model, prompt, 6, temperature=0)
    eos = int(greedy[0, 4])  # the second token row 0 generates
    out = archlab.generate(model, prompt, 6, temperature=0, eos_id=eos)
    assert (out[0, 4:] == eos).all()
    first_eos_row1 = (greedy[1, 3:] == eos).nonzero()
    if len(first_eos_row1) == 0:  # row 1 never meets eos: it runs to the end unchanged
        assert torch.equal(out[1], greedy[1])


def test_top_k_keeps_the_k_largest():
    logits = torch.tensor([[1.0, 5.0, 3.0, 4.0, 2.0]])
    kept = filter_logits(logits, top_k=2).isfinite()
    assert kept.tolist() == [[False, True, False, True, False]]


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([[0.5, 0.05, 0.3, 0.15]])
    logits = probs.log()
    assert filter_logits(logits, top_p=0.5).isfinite().tolist() == [[True, False, False, False]]
    assert filter_logits(logits, top_p=0.7).isfinite().tolist() == [[True, False, True, False]]
    assert filter_logits(logits, top_p=0.95).isfinite().tolist() == [[True, False, True, True]]
    assert filter_logits(logits, top_p=1.0).isfinite().all()


def test_top_k_and_top_p_never_sample_a_filtered_token():
    model = model_for("rope")
    prompt = torch.randint(0, 40, (4, 3))
    gen = torch.Generator().manual_seed(0)
    out = archlab.generate(model, prompt, 1, temperature=1.0, top_k=3, generator=gen)
    with torch.no_grad():
        top3 = model(prompt).logits[:, -1].topk(3).indices
    assert all(out[b, -1] in top3[b] for b in range(4))


def test_generation_fills_learned_positions_to_the_last_one():
    """A prompt of S tokens plus n new ones feeds positions 0..S+n-2: the final token is never fed
    back, so a learned table of S+n-1 positions suffices."""
    model = model_for("learned", n_kv_heads=4)  # max_seq_len 32
    out = archlab.generate(model, torch.randint(0, 40, (1, 30)), max_new_tokens=3, temperature=0)
    assert out.shape == (1, 33)
