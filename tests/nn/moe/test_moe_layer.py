"""MoELayer: the grouped-GEMM dispatch against a looped reference, forward and backward;
parameter counts; capacity dropping; the selection bias as a buffer; the experts' dtype under
autocast; the padded fallback of ``archlab::grouped_mm`` and its grid while compiled."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from archlab.config.schema import (
    BalanceConfig,
    FFNConfig,
    ModelConfig,
    MoEConfig,
    NormConfig,
    PositionConfig,
    RouterConfig,
)
from archlab.model.build import build_model
from archlab.nn.moe import MoELayer, moe_layers
from archlab.nn.moe import experts as experts_mod
from archlab.nn.moe.experts import _grouped_mm_ok, compilable_grouped_mm, grouped_linear, padded_grouped_mm


def make_cfg(ffn="swiglu", d=32, **moe) -> ModelConfig:
    router = RouterConfig(**moe.pop("router", {}))
    balance = BalanceConfig(**moe.pop("balance", {}))
    m = MoEConfig(**{"num_experts": 8, "top_k": 2, "expert_hidden": 24, **moe}, router=router, balance=balance)
    return ModelConfig(vocab_size=97, max_seq_len=64, d_model=d, n_layers=3, n_heads=4, n_kv_heads=2,
                       norm=NormConfig(type="rmsnorm"), position=PositionConfig(type="rope"),
                       ffn=FFNConfig(type=ffn, bias=False), moe=m)


def reference_moe(layer: MoELayer, x_BSD: torch.Tensor) -> torch.Tensor:
    """The obvious looped form: for each token and each of its K experts (in token order, counting
    each expert's slots to apply the capacity), run that expert's FFN and add its weighted output."""
    B, S, D = x_BSD.shape
    x_ND = x_BSD.reshape(-1, D)
    r = layer.router(x_ND)
    m = layer.moe
    cap = (None if m.capacity_factor is None
           else max(math.ceil(B * S * m.top_k / m.num_experts * m.capacity_factor), m.min_capacity))
    used = [0] * m.num_experts
    w_up, w_down = layer.experts.w_up, layer.experts.w_down
    rows = []
    for n in range(x_ND.shape[0]):
        y = torch.zeros_like(x_ND[n])
        for k in range(m.top_k):
            e = int(r.experts_NK[n, k])
            used[e] += 1
            if cap is not None and used[e] > cap:
                continue
            h = x_ND[n] @ w_up[e]
            if layer.experts.kind == "swiglu":
                g, u = h.chunk(2)
                h = F.silu(g) * u
            else:
                h = F.gelu(h, approximate="tanh")
            y = y + r.weights_NK[n, k] * (h @ w_down[e])
        rows.append(y)
    y_ND = torch.stack(rows)
    if layer.shared is not None:
        y_ND = y_ND + layer.shared(x_ND)
    return y_ND.view(B, S, D)


CASES = {
    "mixtral": dict(),
    "gelu": dict(ffn="gelu"),
    "capacity": dict(capacity_factor=0.5, min_capacity=1),
    "deepseek": dict(num_experts=16, top_k=3, n_shared_experts=2, expert_hidden=8,
                     router=dict(type="sigmoid_topk", n_groups=4, topk_groups=2, route_scale=2.5),
                     balance=dict(bias_update_rate=1e-3)),
    "no_renorm_k1": dict(top_k=1, router=dict(renormalize=False)),
}


@pytest.mark.parametrize("path", ["padded", "grouped"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_moe_fast_path_matches_looped_reference_forward_and_backward(case, path, monkeypatch):
    kw = dict(CASES[case])
    layer = MoELayer(make_cfg(ffn=kw.pop("ffn", "swiglu"), **kw))
    layer.experts.mode = path
    calls = []
    monkeypatch.setattr(experts_mod, "grouped_linear", lambda *a: calls.append(1) or grouped_linear(*a))
    if layer.router.expert_bias is not None:
        layer.router.expert_bias.copy_(torch.randn(layer.moe.num_experts) * 0.05)
    x = torch.randn(2, 11, 32, requires_grad=True)
    y, _ = layer(x)
    g = torch.randn_like(y)
    grads = torch.autograd.grad(y, [x, *layer.parameters()], g)
    y_ref = reference_moe(layer, x)
    grads_ref = torch.autograd.grad(y_ref, [x, *layer.parameters()], g)
    torch.testing.assert_close(y, y_ref, rtol=1e-4, atol=1e-6)
    for a, b in zip(grads, grads_ref):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert bool(calls) == (path == "grouped")


def test_moe_capacity_case_really_drops_and_later_tokens_drop_first():
    torch.manual_seed(1)
    layer = MoELayer(make_cfg(capacity_factor=0.5, min_capacity=1))
    x = torch.randn(1, 16, 32)
    layer.train()
    layer(x)
    s = layer.stats.read(lambda t: t, [])
    assert s["dropped_slots"] > 0
    # the first token never drops: its slots are first in every expert's queue
    y_full = MoELayer(make_cfg())
    y_full.load_state_dict(layer.state_dict())
    y_drop, _ = layer(x)
    y_ref, _ = y_full(x)
    torch.testing.assert_close(y_drop[0, 0], y_ref[0, 0])
    assert not torch.allclose(y_drop, y_ref)


def test_moe_grouped_linear_handles_uneven_counts_and_expanded_gradients():
    counts = torch.tensor([3, 0, 5, 1])
    x = torch.randn(int(counts.sum()), 8, requires_grad=True)  # 9 rows: any count works
    w = torch.randn(4, 8, 12, requires_grad=True)
    assert _grouped_mm_ok(x, w)
    y = grouped_linear(x, w, counts)
    ref = torch.cat([xi @ w[i] for i, xi in enumerate(x.split(counts.tolist()))])
    torch.testing.assert_close(y, ref)
    ga = torch.autograd.grad(y.sum(), [x, w])  # stride-0 gradient: grouped_mm needs it contiguous
    gb = torch.autograd.grad(ref.sum(), [x, w])
    for u, v in zip(ga, gb):
        torch.testing.assert_close(u, v)


def test_moe_cpu_picks_grouped_mm_when_padding_would_be_large(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)  # one thread always picks grouped_mm
    layer = MoELayer(make_cfg())
    with torch.no_grad():
        layer.router.gate.weight.zero_()
        layer.router.gate.weight[0, 0] = 10.0  # every token to expert 0 (and one other)
    x = torch.randn(1, 16, 32)
    x[..., 0] = 1.0
    calls = []
    monkeypatch.setattr(experts_mod, "grouped_linear", lambda *a: calls.append(1) or grouped_linear(*a))
    y, _ = layer(x)
    assert calls, "a (16 x 8)-row padded grid for 32 slots should have gone to grouped_mm"
    torch.testing.assert_close(y, reference_moe(layer, x), rtol=1e-4, atol=1e-6)


def test_moe_bf16_forward_backward_runs():
    layer = MoELayer(make_cfg(balance=dict(bias_update_rate=1e-3))).to(torch.bfloat16)
    assert layer.experts.w_up.dtype == torch.bfloat16
    assert layer.router.expert_bias.dtype == torch.float32  # sign steps of 1e-3 survive
    x = torch.randn(2, 8, 32, dtype=torch.bfloat16, requires_grad=True)
    y, aux = layer(x)
    y.float().sum().backward()
    assert y.dtype == torch.bfloat16 and torch.isfinite(x.grad.float()).all()


@pytest.mark.parametrize("case", sorted(CASES))
def test_moe_num_params_and_active_params_match_the_module(case):
    kw = dict(CASES[case])
    cfg = make_cfg(ffn=kw.pop("ffn", "swiglu"), **kw)
    layer = MoELayer(cfg)
    assert MoELayer.num_params(cfg) == sum(p.numel() for p in layer.parameters())
    m = cfg.moe
    per_expert = (layer.experts.w_up[0].numel() + layer.experts.w_down[0].numel())
    shared = sum(p.numel() for p in layer.shared.parameters()) if layer.shared is not None else 0
    assert MoELayer.active_params(cfg) == m.top_k * per_expert + shared + layer.router.gate.weight.numel()


def test_moe_selection_bias_is_a_saved_buffer_without_gradient():
    cfg = make_cfg(balance=dict(bias_update_rate=1e-3))
    layer = MoELayer(cfg)
    names = [n for n, _ in layer.named_parameters()]
    assert not any("expert_bias" in n for n in names)
    assert "router.expert_bias" in layer.state_dict()
    assert "router.expert_bias" not in MoELayer(make_cfg()).state_dict()


def test_moe_decoder_places_dense_and_moe_layers_and_counts_params():
    cfg = make_cfg(first_k_dense=1, every=1)
    cfg.n_layers = 4
    cfg.moe.every = 2
    model = build_model(cfg)
    assert [b.is_moe for b in model.blocks] == [False, True, False, True]
    assert len(moe_layers(model)) == 2
    from archlab.model.build import num_params
    assert num_params(cfg) == sum(p.numel() for p in model.parameters())


def test_moe_init_gives_down_projections_the_residual_std():
    cfg = make_cfg(n_shared_experts=1, expert_hidden=256, num_experts=4, d=256)
    cfg.n_heads = 8
    cfg.n_layers = 8
    model = build_model(cfg)
    layer = moe_layers(model)[0]
    std, res = cfg.init_std, cfg.init_std / math.sqrt(2 * cfg.n_layers)
    assert abs(layer.experts.w_up.std().item() - std) < 0.1 * std
    assert abs(layer.experts.w_down.std().item() - res) < 0.1 * res
    assert abs(layer.shared.down.weight.std().item() - res) < 0.1 * res


def test_moe_odd_widths_use_the_padded_fallback():
    layer = MoELayer(make_cfg(expert_hidden=7))
    assert not _grouped_mm_ok(torch.zeros(1, 32), layer.experts.w_down)
    x = torch.randn(1, 5, 32, requires_grad=True)
    y, _ = layer(x)
    torch.testing.assert_close(y, reference_moe(layer, x), rtol=1e-4, atol=1e-6)


def test_moe_grouped_path_under_cpu_autocast():
    layer = MoELayer(make_cfg())
    layer.experts.mode = "grouped"
    x = torch.randn(2, 8, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, _ = layer(x.to(torch.bfloat16))
    ref, _ = layer(x)
    torch.testing.assert_close(y.float(), ref, rtol=0.05, atol=0.02)


def test_moe_auto_mode_choice_by_threads_and_padding(monkeypatch):
    layer = MoELayer(make_cfg())
    x = torch.randn(4, 32)
    d = experts_mod.Dispatch(torch.arange(8), torch.tensor([2, 1, 1, 1, 1, 1, 1, 0]), torch.tensor(0), torch.ones(4, 2))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert layer.experts._use_grouped_mm(x, d)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert not layer.experts._use_grouped_mm(x, d)  # 8 * 2 = 16 rows for 8 slots: 2x, padded
    layer.experts.max_padding = 1.5
    assert layer.experts._use_grouped_mm(x, d)


class MatmulDtypes(TorchDispatchMode):
    """Records (op name, input dtypes) of every matmul-type aten op run under it."""

    OPS = {torch.ops.aten.mm.default, torch.ops.aten.bmm.default, torch.ops.aten._grouped_mm.default}

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.OPS:
            self.seen.append((func.overloadpacket.__name__, args[0].dtype, args[1].dtype))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("mode", ["grouped", "padded"])
def test_moe_experts_run_in_the_autocast_dtype_with_fp32_weights(mode):
    """fp32 weights and activations under bf16 autocast (the trainer's mixed precision): the
    routed rows and the expert weights reach grouped_mm / bmm as bf16, gradients stay fp32."""
    layer = MoELayer(make_cfg())
    layer.experts.mode = mode
    x = torch.randn(2, 8, 32, requires_grad=True)
    x_ND, rec = x.view(-1, 32), MatmulDtypes()
    d = layer.router.dispatch(layer.router(x_ND), 16)
    with torch.autocast("cpu", dtype=torch.bfloat16), rec:
        y = layer.experts(x_ND, d)
    assert {name for name, *_ in rec.seen} == ({"_grouped_mm"} if mode == "grouped" else {"bmm"})
    assert all(a == b == torch.bfloat16 for _, a, b in rec.seen), rec.seen
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert layer.experts.w_up.grad.dtype == torch.float32 and x.grad.dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y_layer, _ = layer(x)
    torch.testing.assert_close(y_layer.float(), reference_moe(layer, x), rtol=0.05, atol=0.02)


@pytest.mark.parametrize("width", [8, 7])  # 7: rows not 16-byte aligned, grouped_mm has no kernel
def test_padded_grouped_mm_equals_grouped_mm_in_both_forms(width):
    counts = torch.tensor([3, 0, 5, 1])
    offs = torch.cumsum(counts, 0).to(torch.int32)
    x = torch.randn(11, width, dtype=torch.float64)  # two rows beyond offs[-1]: no group's
    w = torch.randn(4, width, 6, dtype=torch.float64)
    g = torch.randn(11, 6, dtype=torch.float64)
    y = padded_grouped_mm(x, w, offs)
    gw = padded_grouped_mm(x.t(), g, offs)  # the weight-gradient form
    for e, (lo, hi) in enumerate(zip([0, *offs[:-1].tolist()], offs.tolist())):
        torch.testing.assert_close(y[lo:hi], x[lo:hi] @ w[e])
        torch.testing.assert_close(gw[e], x[lo:hi].t() @ g[lo:hi])
    assert torch.equal(y[9:], torch.zeros(2, 6, dtype=torch.float64))
    x32, w32 = x.float().requires_grad_(), w.float().requires_grad_()
    torch.library.opcheck(compilable_grouped_mm, (x32[:9], w32, offs))  # the kernel (8) or the fallback (7)
    torch.testing.assert_close(compilable_grouped_mm(x32[:9], w32, offs), y[:9].float())


def test_moe_compiled_fallback_pads_to_the_real_largest_load(monkeypatch):
    """Compiled dropless layer with widths grouped_mm has no kernel for (hidden 7, fp32): every
    bmm runs on E x (the step's real largest load) rows, not on the worst-case E x N grid."""
    layer = MoELayer(make_cfg(expert_hidden=7)).train()
    x = torch.randn(2, 11, 32, requires_grad=True)
    ref = layer(x)[0]
    ref_grads = torch.autograd.grad(ref.sum(), (x, layer.experts.w_up))
    layer.stats.take_step_counts()
    grid_rows, bmm = [], torch.bmm

    def recording_bmm(a, b):
        # rows of the (E, C, X) grid; a weight-gradient bmm takes it transposed, (E, X, C)
        grid_rows.append(a.shape[0] * (a.shape[1] if a.stride(-1) == 1 else a.shape[2]))
        return bmm(a, b)

    monkeypatch.setattr(torch, "bmm", recording_bmm)
    y = torch.compile(layer, fullgraph=True, backend="aot_eager")(x)[0]
    grads = torch.autograd.grad(y.sum(), (x, layer.experts.w_up))
    E, N, largest = 8, 22, int(layer.stats.take_step_counts().max())
    assert largest < N
    # 2 forward, 4 backward (input and weight gradients of both projections)
    assert grid_rows == [E * largest] * 6, (grid_rows, E * largest)
    torch.testing.assert_close(y, ref)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b)


class HostReads(TorchDispatchMode):
    """Counts reads of a tensor's value on the host (``aten._local_scalar_dense``: a sync on CUDA)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func is torch.ops.aten._local_scalar_dense.default
        return func(*args, **(kwargs or {}))


def test_moe_static_capacity_rows_read_nothing_and_keep_at_most_e_times_c(monkeypatch):
    """The capacity layout compiled (and off CPU): R = min(N*K, E*C) packed rows, built without
    reading the routing on the host; the rows past the kept slots are padding no slot reads."""
    layer = MoELayer(make_cfg(capacity_factor=0.5, min_capacity=1))
    x_ND = torch.randn(16, 32)
    d = layer.router.dispatch(layer.router(x_ND), 16)
    C = experts_mod.capacity_for(16, layer.moe)
    assert int(d.dropped) > 0 and 8 * C < 16 * 2
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    reads = HostReads()
    with reads:
        layout = experts_mod.row_layout(d, padded=False)
    assert reads.count == 0
    kept = 16 * 2 - int(d.dropped)
    assert layout.slot_R.numel() == 8 * C and int(layout.rows_E.sum()) == 8 * C
    assert sorted(layout.row_S[layout.row_S < 8 * C].tolist()) == list(range(kept))  # kept slots first, once each
    assert (layout.slot_R[kept:] == 16 * 2).all()  # then padding rows that hold no slot
