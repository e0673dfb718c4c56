"""The GELU MLP's two forms (``model.ffn.approximate``): tanh (the default, GPT-2's) and none (the exact
x * Phi(x), BERT's and GPT-NeoX's), in the MLP, the MoE experts and BERT's head transform; the key's rules; the
costs, which do not depend on the form."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import archlab
from archlab import RecipeError
from archlab.config.schema import ModelConfig
from archlab.costs import activation_memory, param_counts, training_flops_per_token
from archlab.nn.ffn import GeluConfig, build_ffn, ffn_class
from archlab.nn.heads import HeadTransform

ROOT = Path(__file__).resolve().parents[2]


def _exact(h):
    return 0.5 * h * (1 + torch.erf(h / 2 ** 0.5))


def _tanh(h):
    return 0.5 * h * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (h + 0.044715 * h ** 3)))


def _cfg(approximate: str) -> ModelConfig:
    return ModelConfig(d_model=8, n_heads=2, ffn=GeluConfig(approximate=approximate))


@pytest.mark.parametrize("approximate,formula", [("none", _exact), ("tanh", _tanh)])
def test_gelu_mlp_computes_the_form_it_is_given(approximate, formula):
    mlp = build_ffn(_cfg(approximate), hidden=32)
    x = torch.randn(4, 8, dtype=torch.float64)
    mlp.double()
    h = mlp.up(x)
    torch.testing.assert_close(mlp(x), mlp.down(formula(h)))
    torch.testing.assert_close(mlp.activate(h), formula(h))  # the instance's activate is the config's form


def test_the_two_forms_differ_and_tanh_stays_the_default():
    assert GeluConfig().approximate == "tanh"
    h = torch.linspace(-4, 4, 101, dtype=torch.float64)
    assert float((_exact(h) - _tanh(h)).abs().max()) > 1e-4  # the test above tells them apart
    torch.testing.assert_close(ffn_class(_cfg("tanh")).activation(_cfg("tanh").ffn)(h), _tanh(h))


def test_head_transform_and_moe_experts_apply_the_exact_form():
    cfg = _cfg("none")
    head = HeadTransform(cfg).double()
    x = torch.randn(3, 8, dtype=torch.float64)
    torch.testing.assert_close(head(x), head.norm(_exact(head.dense(x))))
    moe = archlab.load_recipe(ROOT / "recipes/mixtral/tiny.yaml",
                              ["model.ffn.type=gelu", "model.ffn.approximate=none"]).model
    from archlab.nn.moe.layer import MoELayer

    layer = MoELayer(moe)
    h = torch.randn(5, 7)
    torch.testing.assert_close(layer.experts.act(h), _exact(h))


def test_costs_do_not_depend_on_the_form():
    """FLOPs count matmuls only; both forms keep the same tensors (the input) for backward."""
    tanh, exact = _cfg("tanh"), _cfg("none")
    assert param_counts(tanh) == param_counts(exact)
    assert training_flops_per_token(tanh, 16) == training_flops_per_token(exact, 16)
    assert activation_memory(tanh, 2, 16).total == activation_memory(exact, 2, 16).total


@pytest.mark.parametrize("overrides,message", [
    (["model.ffn.approximate=erf"], "model.ffn.approximate='erf': must be one of tanh, none"),
    (["model.ffn.type=relu", "model.ffn.approximate=none"],
     r"model.ffn.approximate='none': not a key of ffn.type relu \(its keys: type, hidden, bias, dropout\); "
     "approximate is read by ffn.type gelu"),
    (["model.ffn.approximate=none"], r"model.ffn.approximate='none': not a key of ffn.type swiglu \(its keys: .*\); "
                                     "approximate is read by ffn.type gelu"),
])
def test_the_key_is_refused_where_it_does_nothing_or_names_no_form(overrides, message):
    recipe = ROOT / ("recipes/bert/tiny.yaml" if "model.ffn.type=relu" in overrides or "erf" in overrides[0]
                     else "recipes/llama/tiny.yaml")
    with pytest.raises(RecipeError, match=message):
        archlab.load_recipe(recipe, overrides)


def test_a_bert_recipe_takes_the_exact_form():
    cfg = archlab.load_recipe(ROOT / "recipes/bert/tiny.yaml", ["model.ffn.approximate=none"])
    assert cfg.model.ffn.approximate == "none"
    assert archlab.load_recipe(ROOT / "recipes/bert/tiny.yaml").model.ffn.approximate == "tanh"
