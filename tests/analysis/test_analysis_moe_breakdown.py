"""analysis.measurements.moe_breakdown: the phases are the layer's forward in pieces, each timed call trains the
parameters of its phase, and a trained run is timed layer by layer."""

import pytest
import torch

from analysis.measurements import moe_breakdown
from archlab.config import load_recipe
from archlab.model import build_model
from archlab.nn.moe.layer import MoELayer

TINY = ["model.vocab_size=384", "data.max_bytes=150000", "model.d_model=32", "model.n_layers=2",
        "train.seq_len=32", "train.micro_batch_size=4", "train.warmup_steps=0"]


def _model(recipe: str, extra=()):
    cfg = load_recipe(recipe, [*TINY, *extra])
    torch.manual_seed(0)
    model = build_model(cfg.model)
    model.train()
    return model, cfg


@pytest.mark.parametrize("recipe", ["recipes/mixtral/tiny.yaml", "recipes/deepseek/tiny.yaml"])
def test_the_phases_chained_give_the_layers_output(recipe):
    model, cfg = _model(recipe)
    x_BS = torch.randint(0, 300, (4, 32))
    seen = moe_breakdown.ffn_inputs(model, x_BS)
    assert len(seen) == cfg.model.n_layers and all(x.shape == (4, 32, 32) for _, x in seen)
    layers = [(f, x) for f, x in seen if isinstance(f, MoELayer)]
    assert layers
    for layer, x_BSD in layers:
        with torch.no_grad():
            *_, y_ND = moe_breakdown.chain(layer, x_BSD)
            want, _ = layer(x_BSD)
        torch.testing.assert_close(y_ND.view_as(want), want)


def test_each_timed_phase_runs_backward_into_its_own_parameters():
    model, _ = _model("recipes/deepseek/tiny.yaml", ["model.n_layers=1", "model.moe.first_k_dense=0"])
    (layer, x_BSD), = moe_breakdown.ffn_inputs(model, torch.randint(0, 300, (4, 32)))
    calls = moe_breakdown.moe_phases(layer, x_BSD)
    assert set(calls) == {"router", "dispatch", "experts", "combine", "shared", moe_breakdown.WHOLE}
    owned = {"router": [layer.router.gate.weight], "experts": [layer.experts.w_up, layer.experts.w_down],
             "shared": [p for p in layer.shared.parameters()]}
    for phase, params in owned.items():
        model.zero_grad(set_to_none=True)
        calls[phase]()
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in params), phase
        others = [p for q, ps in owned.items() if q != phase for p in ps]
        assert all(p.grad is None for p in others), phase


def test_breakdown_of_trained_runs_times_every_layer(tmp_path):
    from archlab.train.loop import Trainer

    runs = {}
    for name, recipe in [("dense", "recipes/llama/tiny.yaml"), ("moe", "recipes/deepseek/tiny.yaml")]:
        cfg = load_recipe(recipe, [*TINY, f"data.cache_dir={tmp_path / 'cache'}", "train.max_steps=2",
                                   f"train.out_dir={tmp_path}", f"train.run_name={name}", "train.eval_every=2",
                                   "train.eval_batches=1", "train.tensorboard=false"])
        Trainer(cfg).run()
        runs[name] = str(tmp_path / name)
    out = moe_breakdown.breakdown(runs, rounds=2, repeats=1, threads=1)
    assert out["dense"]["layers"] == {"moe": 0, "dense": 2} and set(out["dense"]["ms"]) == {moe_breakdown.DENSE}
    # DeepSeek-tiny's first layer is dense (first_k_dense = 1), the second an MoE layer with shared experts
    assert out["moe"]["layers"] == {"moe": 1, "dense": 1}
    assert set(out["moe"]["ms"]) == {*moe_breakdown.PHASES, moe_breakdown.WHOLE, moe_breakdown.DENSE}
    assert all(len(v) == 2 and min(v) > 0 for v in out["moe"]["rounds"].values())
    assert out["moe"]["tokens"] == 4 * 32
