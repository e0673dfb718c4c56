"""The MoE recipe ladders: they load, build, have the advertised architecture, and match the active
parameters of the dense recipe named by ``compare_with``."""

import pytest
import torch

from archlab import build_model, load_recipe, model_config
from archlab.model.build import num_params
from archlab.nn.loss import lm_loss
from archlab.nn.moe import MoELayer, moe_layers


def recipes(root, family):
    found = sorted((root / "recipes" / family).glob("*.yaml"))
    assert found, f"no recipes in recipes/{family}"
    return found


def active_params(cfg) -> int:
    """Parameters one token uses: the whole model with only K routed experts per MoE layer."""
    m = model_config(cfg)
    n = num_params(m)
    per_layer = MoELayer.active_params(m) - MoELayer.num_params(m)
    return n + per_layer * sum(m.is_moe_layer(i) for i in range(m.n_layers))


def embedding_params(cfg) -> int:
    m = model_config(cfg)
    return m.vocab_size * m.d_model * (1 if m.tie_embeddings else 2)


@pytest.mark.parametrize("family", ["mixtral", "deepseek"])
def test_moe_recipes_match_active_params_of_their_dense_peer(root, family):
    for path in recipes(root, family):
        cfg = load_recipe(path)
        assert cfg.family == family and cfg.compare_with, path
        dense = load_recipe(root / cfg.compare_with)
        assert dense.model.moe is None
        a, b = active_params(cfg), num_params(dense)
        assert abs(a / b - 1) < 0.03, (path.name, a, b)
        a_ne, b_ne = a - embedding_params(cfg), b - embedding_params(dense)
        assert abs(a_ne / b_ne - 1) < 0.03, (path.name, a_ne, b_ne)
        # really sparse: many more total than active (non-embedding) parameters
        assert num_params(cfg) - embedding_params(cfg) > 1.5 * a_ne


def test_moe_mixtral_recipes_architecture(root):
    for path in recipes(root, "mixtral"):
        m = model_config(load_recipe(path))
        e = m.moe
        assert (e.num_experts, e.top_k, e.router.type, e.router.renormalize) == (8, 2, "softmax_topk", True)
        assert (m.ffn.type, m.norm.type, m.position.type) == ("swiglu", "rmsnorm", "rope")
        assert m.kv_heads < m.n_heads and e.n_shared_experts == 0 and e.first_k_dense == 0


def test_moe_deepseek_recipes_architecture(root):
    for path in recipes(root, "deepseek"):
        cfg = load_recipe(path)
        m = model_config(cfg)
        e = m.moe
        dense = model_config(load_recipe(root / cfg.compare_with))
        assert e.router.type == "sigmoid_topk" and e.router.n_groups > 1 and e.router.topk_groups < e.router.n_groups
        assert e.n_shared_experts >= 1 and e.first_k_dense >= 1
        assert e.balance.bias_update_rate > 0 and 0 < e.balance.seq_aux_loss_coeff <= 1e-3
        assert e.expert_hidden * 4 <= dense.ffn_hidden  # fine-grained: many small experts
        assert e.num_experts >= 16


@pytest.mark.parametrize("name", ["mixtral/tiny", "deepseek/tiny"])
def test_moe_tiny_recipes_train_one_step(root, name):
    cfg = load_recipe(root / f"recipes/{name}.yaml")
    model = build_model(cfg)
    assert num_params(cfg) == sum(p.numel() for p in model.parameters())
    ids = torch.randint(0, cfg.model.vocab_size, (2, 32))
    out = model(ids)
    loss = lm_loss(out.logits[:, :-1], ids[:, 1:]) + out.aux_loss
    loss.backward()
    n_moe = sum(model.cfg.is_moe_layer(i) for i in range(model.cfg.n_layers))
    assert out.aux_loss > 0 and len(moe_layers(model)) == n_moe
    assert all(p.grad is not None for n, p in model.named_parameters()), "a parameter got no gradient"


@pytest.mark.parametrize("family", ["mixtral", "deepseek"])
def test_moe_all_recipes_build_on_meta(root, family):
    for path in recipes(root, family):
        cfg = load_recipe(path)
        model = build_model(cfg, device="meta")
        assert sum(p.numel() for p in model.parameters()) == num_params(cfg)
