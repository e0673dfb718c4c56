"""Routing capture: the experts and gate weights captured from each router, run through the layer's
own experts (plus its shared experts), rebuild the MoE layer's output: what is captured is what the
layer used.

Shape legend: N tokens, D model dim, E routed experts, K experts per token.
"""

from __future__ import annotations

import pytest
import torch

import archlab
from archlab.nn.moe.capture import capture_routing
from archlab.nn.moe.layer import MoELayer


def _expert(layer: MoELayer, e: int, x_D: torch.Tensor) -> torch.Tensor:
    ex = layer.experts
    return ex.act(x_D @ ex.w_up[e]) @ ex.w_down[e]


@pytest.mark.parametrize("recipe", ["recipes/mixtral/tiny.yaml", "recipes/deepseek/tiny.yaml"])
def test_captured_routing_rebuilds_the_layer_output(recipe):
    cfg = archlab.load_recipe(recipe, ["model.n_layers=2"])
    torch.manual_seed(0)
    model = archlab.build_model(cfg).eval()
    for m in model.modules():  # a non-zero selection bias, so that choice and gate weights differ
        if getattr(m, "expert_bias", None) is not None:
            m.expert_bias.normal_(0.0, 0.05)
    seen: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    layers = {n: m for n, m in model.named_modules() if isinstance(m, MoELayer)}
    hooks = [m.register_forward_hook(lambda _m, inp, out, n=n: seen.__setitem__(n, (inp[0], out[0])))
             for n, m in layers.items()]
    with capture_routing(model) as caps, torch.no_grad():
        model(torch.randint(0, 500, (2, 10)))
    for h in hooks:
        h.remove()
    assert set(caps) == {f"{n}.router" for n in layers} and layers
    K = model.cfg.moe.top_k
    for name, layer in layers.items():
        (r,) = caps[f"{name}.router"]
        x_BSD, y_BSD = seen[name]
        x_ND, y_ND = x_BSD.reshape(-1, x_BSD.shape[-1]), y_BSD.reshape(-1, y_BSD.shape[-1])
        assert r.experts_NK.shape == (x_ND.shape[0], K)
        with torch.no_grad():
            rebuilt = torch.stack([sum(r.weights_NK[n, k] * _expert(layer, int(r.experts_NK[n, k]), x_ND[n])
                                       for k in range(K)) for n in range(x_ND.shape[0])])
            if layer.shared is not None:
                rebuilt = rebuilt + layer.shared(x_ND)
        torch.testing.assert_close(rebuilt, y_ND, atol=1e-5, rtol=1e-4)
    # outside the block the hooks are gone
    assert all(not m._forward_hooks for m in model.modules())
