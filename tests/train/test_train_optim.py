"""AdamW parameter groups and learning-rate schedules."""

import math

import pytest
import torch
from omegaconf import OmegaConf

import archlab
from archlab.config.schema import TrainConfig
from archlab.train.optim import build_optimizer, lr_at, param_groups


def _train_cfg(**kw):
    return OmegaConf.merge(OmegaConf.structured(TrainConfig), kw)


@pytest.mark.parametrize("recipe", ["dense/tiny", "llama/tiny"])
def test_weight_decay_only_on_linear_weights(root, recipe):
    cfg = archlab.load_recipe(root / "recipes" / f"{recipe}.yaml", ["model.n_layers=1", "model.vocab_size=300"])
    model = archlab.build_model(cfg)
    decay, no_decay = param_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    kept = {names[id(p)] for p in no_decay["params"]}
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert "embed.weight" in kept  # embeddings (and a tied LM head) are not decayed
    assert all("norm" not in n and not n.endswith(".bias") for n in decayed)
    assert all(p.ndim >= 2 for p in decay["params"])
    assert any("attn" in n for n in decayed) and any("ffn" in n for n in decayed)
    # every parameter in exactly one group, tied weights once
    assert len(decayed) + len(kept) == len(list(model.parameters()))
    assert sum(p.numel() for p in model.parameters()) == archlab.num_params(cfg)


def test_optimizer_hyperparameters(root):
    cfg = archlab.load_recipe(root / "recipes/llama/tiny.yaml", ["model.n_layers=1", "train.betas=[0.8,0.9]"])
    opt = build_optimizer(archlab.build_model(cfg), cfg.train)
    assert isinstance(opt, torch.optim.AdamW)
    assert opt.defaults["betas"] == (0.8, 0.9) and opt.defaults["lr"] == cfg.train.lr


def test_cosine_schedule():
    t = _train_cfg(lr=1.0, min_lr_ratio=0.1, warmup_steps=10, max_steps=110, schedule="cosine")
    assert lr_at(0, t) == pytest.approx(0.1)  # linear warmup from lr/warmup
    assert lr_at(9, t) == pytest.approx(1.0)
    assert lr_at(10, t) == pytest.approx(1.0)
    assert lr_at(60, t) == pytest.approx(0.1 + 0.9 * 0.5)  # half way: mid-point of the cosine
    assert lr_at(110, t) == pytest.approx(0.1)
    lrs = [lr_at(s, t) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))  # monotone decay after warmup


def test_wsd_schedule():
    t = _train_cfg(lr=2.0, min_lr_ratio=0.0, warmup_steps=5, max_steps=100, schedule="wsd", decay_fraction=0.2)
    assert lr_at(2, t) == pytest.approx(2.0 * 3 / 5)
    assert all(lr_at(s, t) == 2.0 for s in range(5, 80))  # stable phase
    assert lr_at(90, t) == pytest.approx(1.0)  # linear decay over the last 20 steps
    assert lr_at(99, t) == pytest.approx(2.0 * 1 / 20)
    assert lr_at(100, t) == pytest.approx(0.0)


def test_wsd_decay_steps_and_shapes_make_cooldown_branches():
    """A cooldown branch at step 40 of a constant-lr trunk, decaying over 10 steps, is a wsd schedule
    with max_steps=50 and decay_steps=10: equal to the trunk's lr before 40 (warmup included), then
    linear or 1 - sqrt down to lr * min_lr_ratio at step 50. decay_steps overrides decay_fraction."""
    trunk = _train_cfg(lr=1.0, warmup_steps=5, max_steps=100, schedule="constant")
    lrs = {}
    for shape in ("linear", "sqrt"):
        branch = _train_cfg(lr=1.0, min_lr_ratio=0.1, warmup_steps=5, max_steps=50, schedule="wsd",
                            decay_steps=10, decay_fraction=0.5, decay_shape=shape)
        assert [lr_at(s, branch) for s in range(41)] == [lr_at(s, trunk) for s in range(41)]
        lrs[shape] = [lr_at(s, branch) for s in range(40, 51)]
        assert all(a > b for a, b in zip(lrs[shape], lrs[shape][1:]))  # strictly decreasing
        assert lrs[shape][-1] == pytest.approx(0.1)
    assert lrs["linear"][5] == pytest.approx(1.0 - 0.9 * 0.5)
    assert lrs["sqrt"][5] == pytest.approx(1.0 - 0.9 * math.sqrt(0.5))
    assert lrs["sqrt"][1] == pytest.approx(1.0 - 0.9 * math.sqrt(0.1))  # (1 - sqrt): the fast drop comes first
    assert all(s <= lin for s, lin in zip(lrs["sqrt"], lrs["linear"]))
    # without decay_steps, decay_fraction of max_steps as before
    t = _train_cfg(lr=1.0, min_lr_ratio=0.0, warmup_steps=0, max_steps=50, schedule="wsd", decay_fraction=0.2,
                   decay_shape="sqrt")
    assert lr_at(39, t) == 1.0 and lr_at(45, t) == pytest.approx(1.0 - math.sqrt(0.5))


def test_constant_schedule_and_no_warmup():
    t = _train_cfg(lr=0.5, warmup_steps=0, max_steps=10, schedule="constant")
    assert [lr_at(s, t) for s in range(10)] == [0.5] * 10
    t = _train_cfg(lr=0.5, warmup_steps=0, max_steps=10, schedule="cosine", min_lr_ratio=0.0)
    assert lr_at(0, t) == 0.5 and math.isclose(lr_at(10, t), 0.0, abs_tol=1e-12)


def _steps(opt, params, n=6):
    gen = torch.Generator().manual_seed(1)
    for i in range(n):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen) * 10.0 ** (i % 3 - 1)
        opt.step()


def test_adamw_runs_foreach_on_cpu_with_the_loop_numbers(root):
    """The trainer's AdamW (foreach without CUDA, fused with it) repeats the per-tensor loop
    (``foreach=False``, what it ran before) bit for bit on CPU, muP-free groups and weight decay
    included; a state written by the loop loads into it and keeps its kernel."""
    cfg = archlab.load_recipe(root / "recipes/llama/tiny.yaml", ["model.n_layers=1", "model.vocab_size=300"])
    torch.manual_seed(0)
    model = archlab.build_model(cfg)
    twin = archlab.build_model(cfg)
    twin.load_state_dict(model.state_dict())
    opt = build_optimizer(model, cfg.train)
    assert opt.param_groups[0]["foreach"] is True and not opt.param_groups[0]["fused"]
    loop = build_optimizer(twin, cfg.train)
    for g in loop.param_groups:
        g["foreach"] = False
    _steps(opt, list(model.parameters()))
    _steps(loop, list(twin.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), twin.parameters()))
    opt.load_state_dict(loop.state_dict())
    assert all(g["foreach"] is True for g in opt.param_groups)


def test_adamw_is_fused_where_cuda_is(root, monkeypatch):
    """With CUDA the kernel is fused (here on CPU, where torch runs fused AdamW too); a foreach state
    loads into it with its step counters where the fused kernel wants them (fp32)."""
    from archlab.optim.adamw import adamw_kernel

    assert adamw_kernel(cuda=True) == {"fused": True, "foreach": None}
    assert adamw_kernel(cuda=False) == {"fused": None, "foreach": True}
    cfg = archlab.load_recipe(root / "recipes/llama/tiny.yaml", ["model.n_layers=1", "model.vocab_size=300"])
    model = archlab.build_model(cfg)
    foreach = build_optimizer(model, cfg.train)
    _steps(foreach, list(model.parameters()), n=2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    fused = build_optimizer(model, cfg.train)
    fused.load_state_dict(foreach.state_dict())
    assert all(g["fused"] is True and not g["foreach"] for g in fused.param_groups)
    steps = [s["step"] for s in fused.state.values()]
    assert steps and all(s.dtype == torch.float32 and float(s) == 2.0 for s in steps)
    _steps(fused, list(model.parameters()), n=1)
