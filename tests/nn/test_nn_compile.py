"""Building blocks under ``torch.compile(fullgraph=True)``: the MoE layer in every dispatch form
(dropless or capacity, grouped_mm or padded grid, a width grouped_mm has no kernel for) and the
fused LM-head loss trace in one graph, forward and backward, and equal eager; the opaque
``archlab::grouped_mm`` op passes torch's own op checks.

Backend ``aot_eager``: dynamo and AOT autograd capture exactly the graphs inductor would be
given (graph breaks happen there, not in code generation), then run them with eager kernels, in
about a second per layer where inductor's C++ compilation takes 10-20 s on a 2-core CPU. So the
compiled results equal eager's up to fp32 rounding (measured: bit for bit). Inductor runs in
tests/train/test_train_compile.py.
"""

import pytest
import torch

from archlab.config.schema import BalanceConfig, FFNConfig, ModelConfig, MoEConfig, NormConfig, RouterConfig
from archlab.nn.loss import linear_cross_entropy
from archlab.nn.moe import MoELayer
from archlab.nn.moe.experts import compilable_grouped_mm


def moe_layer(ffn="swiglu", **moe) -> MoELayer:
    router = RouterConfig(**moe.pop("router", {}))
    balance = BalanceConfig(**moe.pop("balance", {"aux_loss_coeff": 0.01, "z_loss_coeff": 0.001}))
    m = MoEConfig(**{"num_experts": 8, "top_k": 2, "expert_hidden": 24, **moe}, router=router, balance=balance)
    cfg = ModelConfig(vocab_size=97, max_seq_len=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                      norm=NormConfig(type="rmsnorm"), ffn=FFNConfig(type=ffn, bias=False), moe=m)
    return MoELayer(cfg).train()


# mode: what GroupedExperts.layout picks while compiling. auto -> packed rows and grouped_mm (R = N*K);
# padded -> the static grid, C = capacity, or N when dropless; odd width -> no grouped_mm kernel: packed rows
# through archlab::grouped_mm's fallback, a grid padded to the step's real largest load inside the opaque op
CASES = {
    "dropless-grouped": dict(),
    "dropless-padded": dict(mode="padded"),
    "capacity-grouped": dict(mode="grouped", capacity_factor=0.5, min_capacity=1),
    "capacity-padded": dict(mode="padded", capacity_factor=0.5, min_capacity=1),
    "odd-width": dict(expert_hidden=7),
    "deepseek": dict(num_experts=16, top_k=3, n_shared_experts=2, expert_hidden=8,
                     router=dict(type="sigmoid_topk", n_groups=4, topk_groups=2, route_scale=2.5),
                     balance=dict(seq_aux_loss_coeff=1e-3, bias_update_rate=1e-3)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_moe_layer_compiles_in_one_graph_and_equals_eager(case):
    kw = dict(CASES[case])
    mode = kw.pop("mode", "auto")
    layer = moe_layer(**kw)
    layer.experts.mode = mode
    if layer.router.expert_bias is not None:
        layer.router.expert_bias.copy_(torch.randn(layer.moe.num_experts) * 0.05)
    x = torch.randn(2, 11, 32, requires_grad=True)
    g = torch.randn(2, 11, 32)
    params = [x, *layer.parameters()]

    def run(fn):
        y, aux = fn(x)
        return (y, aux, *torch.autograd.grad((y * g).sum() + aux, params)), layer.stats.take_step_counts()

    ref, ref_counts = run(layer)
    out, counts = run(torch.compile(layer, fullgraph=True, backend="aot_eager"))
    for a, b in zip(out, ref):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(counts, ref_counts)  # routing statistics are still recorded when compiled
    if "capacity" in case:
        assert layer.stats.read(lambda t: t, [])["dropped_slots"] > 0  # the capacity really dropped slots


def test_moe_layer_compiled_bf16_traces_torch_grouped_mm():
    """bf16 is the dtype torch's fake grouped_mm accepts: the native op is traced, not the wrapper."""
    layer = moe_layer().to(torch.bfloat16)
    layer.experts.mode = "grouped"
    x = torch.randn(2, 8, 32, dtype=torch.bfloat16, requires_grad=True)
    y_ref, _ = layer(x)
    y, aux = torch.compile(layer, fullgraph=True, backend="aot_eager")(x)
    y.float().sum().backward()
    torch.testing.assert_close(y, y_ref)
    assert torch.isfinite(x.grad.float()).all()


def test_linear_cross_entropy_compiles_in_one_graph_with_ignored_targets():
    h = torch.randn(50, 16, requires_grad=True)
    w = (torch.randn(30, 16) * 0.3).requires_grad_()
    t = torch.randint(0, 30, (50,))
    t[[3, 10, 11]] = -100

    def loss_and_grads(fn):
        loss = fn(h, w, t, 7)
        return (loss, *torch.autograd.grad(loss * 2.5, (h, w)))

    ref = loss_and_grads(linear_cross_entropy)
    out = loss_and_grads(torch.compile(linear_cross_entropy, fullgraph=True, backend="aot_eager"))
    for a, b in zip(out, ref):
        torch.testing.assert_close(a, b)


def test_compilable_grouped_mm_passes_torch_opcheck_and_equals_grouped_mm():
    counts = torch.tensor([3, 0, 5, 1])
    offs = torch.cumsum(counts, 0).to(torch.int32)
    x = torch.randn(9, 8, requires_grad=True)
    w = torch.randn(4, 8, 12, requires_grad=True)
    torch.library.opcheck(compilable_grouped_mm, (x, w, offs))
    y = compilable_grouped_mm(x, w, offs)
    y_ref = torch.nn.functional.grouped_mm(x, w, offs=offs)
    g = torch.randn_like(y)
    assert torch.equal(y, y_ref)
    for a, b in zip(torch.autograd.grad(y, (x, w), g), torch.autograd.grad(y_ref, (x, w), g)):
        assert torch.equal(a, b)
