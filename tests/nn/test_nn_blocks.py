"""Norms and feed-forward blocks against their formulas; registries reject unknown names."""

import pytest
import torch
import torch.nn.functional as F

from archlab.config.schema import FFNConfig, ModelConfig, NormConfig
from archlab.nn.ffn import FFNS, build_ffn, ffn_class
from archlab.nn.norms import NORMS, LayerNorm, LayerNormConfig, RMSNormConfig, build_norm, norm_params


def _norm_cfg(**norm) -> ModelConfig:
    return ModelConfig(norm=LayerNormConfig(**norm))  # the type chooses the dataclass


def _ffn_cfg(kind: str, d_model: int, bias: bool) -> ModelConfig:
    return ModelConfig(d_model=d_model, n_heads=2, ffn=FFNConfig(type=kind, bias=bias))


def test_layernorm_formula_and_bias_switch():
    norm = build_norm(_norm_cfg(type="layernorm", eps=1e-5), dim=16)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5), norm.bias.uniform_(-1, 1)
    x = torch.randn(3, 5, 16)
    mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
    torch.testing.assert_close(norm(x), (x - mean) / torch.sqrt(var + 1e-5) * norm.weight + norm.bias)
    no_bias = build_norm(_norm_cfg(type="layernorm", bias=False), dim=16)
    assert no_bias.bias is None and norm_params(_norm_cfg(type="layernorm", bias=False), dim=16) == 16


def test_rmsnorm_formula():
    norm = build_norm(_norm_cfg(type="rmsnorm", eps=1e-6), dim=16)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(3, 5, 16)
    torch.testing.assert_close(norm(x), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight)


@pytest.mark.parametrize("config", [LayerNormConfig(bias=True), LayerNormConfig(bias=False), RMSNormConfig()],
                         ids=["layernorm-bias", "layernorm", "rmsnorm"])
def test_norm_param_count(config):
    """A norm receives its own config and its width; the model config's call form builds the same."""
    assert norm_params(config, dim=24) == sum(p.numel() for p in build_norm(config, dim=24).parameters())
    via_model = build_norm(ModelConfig(norm=config), dim=24)
    assert type(via_model) is type(build_norm(config, dim=24)) and norm_params(ModelConfig(norm=config), dim=24) \
        == norm_params(config, dim=24)


def test_the_norm_type_chooses_its_dataclass():
    """norm.type chooses the node's dataclass: bias exists only for layernorm."""
    assert isinstance(ModelConfig(norm=NormConfig(type="rmsnorm")).norm, RMSNormConfig)
    assert isinstance(ModelConfig().norm, LayerNormConfig)
    assert isinstance(LayerNorm(LayerNormConfig(), dim=4), LayerNorm)
    with pytest.raises(Exception, match=r"model.norm.bias=False: not a key of norm.type rmsnorm .*bias is read by "
                                        r"norm.type layernorm"):
        ModelConfig(norm=LayerNormConfig(type="rmsnorm", bias=False))


def test_gelu_mlp_is_tanh_gelu():
    mlp = build_ffn(_ffn_cfg("gelu", 8, True), hidden=32)
    x = torch.randn(4, 8)
    h = mlp.up(x)
    tanh_gelu = 0.5 * h * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (h + 0.044715 * h**3)))
    torch.testing.assert_close(mlp(x), mlp.down(tanh_gelu))


def test_swiglu_is_gated():
    ffn = build_ffn(_ffn_cfg("swiglu", 8, False), hidden=24)
    gate_w, up_w = ffn.gate_up.weight.chunk(2)  # [gate; up] rows
    x = torch.randn(4, 8)
    torch.testing.assert_close(ffn(x), ffn.down(F.silu(x @ gate_w.T) * (x @ up_w.T)))


@pytest.mark.parametrize("kind", ["gelu", "relu", "swiglu"])
@pytest.mark.parametrize("bias", [True, False])
def test_ffn_param_count_and_bias_switch(kind, bias):
    cfg = _ffn_cfg(kind, 12, bias)
    ffn = build_ffn(cfg, hidden=40)
    assert ffn_class(cfg).num_params(cfg.ffn, d_model=12, hidden=40) == sum(p.numel() for p in ffn.parameters())
    expert = build_ffn(cfg, hidden=40, expert=True)  # an MoE expert: never a bias
    assert all(m.bias is None for m in expert.modules() if isinstance(m, torch.nn.Linear))
    n_expert = ffn_class(cfg).num_params(cfg.ffn, d_model=12, hidden=40, expert=True)
    assert n_expert == sum(p.numel() for p in expert.parameters())
    assert all((m.bias is not None) == bias for m in ffn.modules() if isinstance(m, torch.nn.Linear))


def test_registry_names_valid_types_on_unknown():
    with pytest.raises(KeyError, match="unknown ffn type 'geglu'; valid: gelu, relu, swiglu"):
        FFNS.get("geglu")
    with pytest.raises(KeyError, match="valid: layernorm, rmsnorm"):
        NORMS.get("batchnorm")
    with pytest.raises(ValueError, match="registered twice"):
        NORMS.register("rmsnorm")(object)
