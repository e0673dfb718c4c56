"""``train.compile: true`` without graph breaks: every family's training call compiles in one graph.

What the trainer compiles is ``model(ids, targets=...)``: embeddings and positions, the blocks (MoE
router, dispatch, experts, balancing terms and routing statistics included) and the fused LM-head
cross-entropy. Here that call is compiled with ``fullgraph=True`` (a graph break is an error), run
forward and backward, and compared with eager: loss, aux loss, every gradient, and the routing
counts recorded as a side effect (which drive DeepSeek's aux-loss-free bias).

Backend ``aot_eager``: dynamo and AOT autograd capture exactly the graphs inductor would be given
(graph breaks happen there, not in code generation) and run them with eager kernels, about a
second per model where inductor's C++ compilation takes 8-25 s per model on a 2-core CPU; the
results equal eager's (measured: bit for bit). tests/train/test_train_compile.py runs inductor
through the trainer.
"""

import pytest
import torch

import archlab
from archlab.nn.moe import moe_layers

FAMILIES = ["dense", "llama", "mixtral", "deepseek", "vanilla"]
SMALL = ["model.vocab_size=384", "model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.max_seq_len=128"]


def small_model(root, family: str, *overrides: str):
    cfg = archlab.load_recipe(root / "recipes" / family / "tiny.yaml", [*SMALL, *overrides])
    return archlab.build_model(cfg).train()


def training_call(model, ids):
    """The trainer's forward: fused loss from ``targets=``, plus the balancing terms."""
    out = model(ids[:, :-1], targets=ids[:, 1:])
    return out.loss, out.aux_loss


def step_counts(model) -> list[torch.Tensor]:
    return [layer.stats.take_step_counts() for layer in moe_layers(model)]


@pytest.mark.parametrize("family", FAMILIES)
def test_compile_fullgraph_training_call_equals_eager(root, family):
    model = small_model(root, family)
    ids = torch.randint(0, 384, (4, 33))
    params = list(model.parameters())

    def run(fn):
        loss, aux = training_call(fn, ids)
        return (loss, aux, *torch.autograd.grad(loss + aux, params)), step_counts(model)

    ref, ref_counts = run(model)
    out, counts = run(torch.compile(model, fullgraph=True, backend="aot_eager"))
    for a, b in zip(out, ref):
        torch.testing.assert_close(a, b)
    assert len(counts) == len(ref_counts) == sum(b.is_moe for b in model.blocks)
    for a, b in zip(counts, ref_counts):
        torch.testing.assert_close(a, b)
    if family in ("mixtral", "deepseek"):
        assert out[1] > 0  # the balancing terms are part of the compiled graph


def test_kv_cache_generation_still_works_after_compiling(root):
    """Generation stays eager; compiling the training call changes nothing in it."""
    model = small_model(root, "mixtral").eval()
    torch.compile(model, fullgraph=True, backend="aot_eager")(torch.randint(0, 384, (1, 8)))
    prompt = torch.randint(0, 384, (2, 5))
    out = archlab.generate(model, prompt, max_new_tokens=6, temperature=0)
    full = model(out[:, :-1]).logits  # greedy: each new token is the argmax of the full forward
    assert torch.equal(out[:, 5:], full[:, 4:].argmax(-1))


def test_learned_positions_refuse_to_extrapolate_through_the_kv_cache(root):
    """The table-length check reads Python ints (cache length + S), not the position tensor: it
    still fires when the cache carries the sequence past model.max_seq_len."""
    model = small_model(root, "dense", "model.max_seq_len=8", "train.seq_len=8").eval()
    cache = model.new_kv_cache()
    model(torch.zeros(1, 6, dtype=torch.long), kv_cache=cache)
    model(torch.zeros(1, 2, dtype=torch.long), kv_cache=cache)  # positions 6, 7: the last ones
    with pytest.raises(ValueError, match="position 8 is beyond the learned table"):
        model(torch.zeros(1, 1, dtype=torch.long), kv_cache=cache)


@pytest.mark.parametrize("family", ["dense", "deepseek"])
def test_compile_dynamic_shapes_one_graph_for_two_shapes(root, family):
    """Dynamic shapes, which torch.compile switches to by itself once a compiled function sees a
    second shape (a second model, another batch size): one graph, no break, serves two batch
    sizes and lengths, MoE dispatch included (its shapes are sized by N, K and E alone)."""
    from torch._dynamo.utils import counters

    model = small_model(root, family)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager", dynamic=True)
    counters.clear()
    for B, S in ((2, 17), (3, 25)):
        ids = torch.randint(0, 384, (B, S + 1))
        for a, b in zip(training_call(compiled, ids), training_call(model, ids)):
            torch.testing.assert_close(a, b)
    assert counters["stats"]["unique_graphs"] == 1
