"""muP (archlab.nn.mup): standard parametrisation at m = 1, the per-layer init / forward / lr
rules at m != 1, the optimizer groups, and the coordinate check of Tensor Programs V.

Shape legend: B batch, S sequence, V vocabulary, D model dim.
"""

import dataclasses
import math

import pytest
import torch
from omegaconf import OmegaConf

import archlab
from archlab.config.schema import (
    AttentionConfig,
    FFNConfig,
    ModelConfig,
    MoEConfig,
    NormConfig,
    PositionConfig,
    TrainConfig,
)
from archlab.costs import training_flops_per_token
from archlab.nn import mup
from archlab.nn.loss import lm_loss
from archlab.train.optim import build_optimizer, param_groups, set_lr

V = 101


def gpt(**kw) -> ModelConfig:
    """GPT-style: LayerNorm, learned positions, GELU, biases, tied embeddings."""
    base = dict(vocab_size=V, max_seq_len=32, d_model=32, n_layers=2, n_heads=4,
                norm=NormConfig(type="layernorm"), position=PositionConfig(type="learned"), ffn=FFNConfig(type="gelu"))
    return ModelConfig(**{**base, **kw})


def llama(**kw) -> ModelConfig:
    """LLaMA-style: RMSNorm, RoPE, SwiGLU, GQA, no biases, untied."""
    base = dict(vocab_size=V, max_seq_len=32, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                norm=NormConfig(type="rmsnorm"), position=PositionConfig(type="rope"),
                attention=AttentionConfig(bias=False), ffn=FFNConfig(type="swiglu", bias=False), tie_embeddings=False)
    return ModelConfig(**{**base, **kw})


def mixtral(**kw) -> ModelConfig:
    """LLaMA block with routed experts (+ a shared expert) in every layer."""
    return llama(moe=MoEConfig(num_experts=4, top_k=2, expert_hidden=32, n_shared_experts=1), **kw)


def as_mup(c: ModelConfig, base_width: int) -> ModelConfig:
    return dataclasses.replace(c, parametrization="mup", mup_base_width=base_width)


def built(c: ModelConfig, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return archlab.build_model(c)


def train_cfg(**kw):
    return OmegaConf.merge(OmegaConf.structured(TrainConfig), kw)


FAMILIES = {"gpt-tied": gpt, "llama-untied": llama, "mixtral": mixtral}


# ----------------------------------------------------------------------------- m = 1


@pytest.mark.parametrize("family", list(FAMILIES))
def test_mup_at_base_width_is_standard_parametrisation(family):
    """m = 1 (no zero-init readout, nothing else different): same init draws, same logits bit for
    bit, and the same two AdamW steps."""
    std_cfg = FAMILIES[family]()
    std, mu = built(std_cfg), built(as_mup(std_cfg, std_cfg.d_model))
    assert mup.width_mult(mu.cfg) == 1.0 and mu.readout_mult == 1.0
    assert mu.blocks[0].attn.scale == std.blocks[0].attn.scale == 1.0 / math.sqrt(std_cfg.d_head)
    for (name, a), b in zip(std.state_dict().items(), mu.state_dict().values()):
        assert torch.equal(a, b), name
    ids = torch.randint(0, V, (2, 16))
    assert torch.equal(std(ids).logits, mu(ids).logits)
    t = train_cfg(lr=3e-3, weight_decay=0.1)
    opts = [build_optimizer(m, t) for m in (std, mu)]
    for _ in range(2):
        for model, opt in zip((std, mu), opts):
            set_lr(opt, 3e-3)
            out = model(ids[:, :-1], targets=ids[:, 1:])
            (out.loss + out.aux_loss).backward()
            opt.step()
            opt.zero_grad()
    for (name, a), b in zip(std.named_parameters(), mu.parameters()):
        assert torch.equal(a, b), name


def test_base_width_null_means_m_equals_one():
    c = dataclasses.replace(llama(), parametrization="mup")
    assert mup.width_mult(c) == 1.0 and mup.width_mult(as_mup(llama(), 8)) == 4.0
    assert mup.width_mult(dataclasses.replace(llama(), mup_base_width=8)) == 1.0  # ignored under standard


# ----------------------------------------------------------------------------- m != 1


@pytest.mark.parametrize("family", list(FAMILIES))
def test_init_and_forward_at_width_multiplier_4(family):
    """Same init draws as standard, then hidden matrices / 2 (= 1/sqrt(m)), router gates / 4,
    everything vector-like (embeddings, norms, biases, the LM head) unchanged; the forward is a
    standard one with attention scale 1/(sqrt(Dh) * 2) and logits / 4."""
    std_cfg = FAMILIES[family]()
    mu_cfg = as_mup(std_cfg, std_cfg.d_model // 4)
    std, mu = built(std_cfg), built(mu_cfg)
    gates = {n for n, _ in mu.named_parameters() if n.endswith("router.gate.weight")}
    assert bool(gates) == (family == "mixtral")
    for (name, a), b in zip(std.named_parameters(), mu.parameters()):
        if name in gates:
            factor = 1 / 4
        elif name.startswith("blocks.") and a.ndim >= 2:
            factor = 1 / 2
        else:
            factor = 1.0
        torch.testing.assert_close(b, a * factor, rtol=0, atol=0, msg=name)
    scale = 1.0 / math.sqrt(std_cfg.d_head) / 2
    assert mu.readout_mult == 0.25 and all(blk.attn.scale == pytest.approx(scale) for blk in mu.blocks)

    explicit = built(dataclasses.replace(std_cfg, attention=dataclasses.replace(std_cfg.attention, scale=scale)))
    explicit.load_state_dict(mu.state_dict())
    ids = torch.randint(0, V, (2, 16))
    torch.testing.assert_close(mu(ids).logits, explicit(ids).logits / 4)
    loss = mu(ids[:, :-1], targets=ids[:, 1:]).loss  # the fused loss sees the same scaled logits
    ref = lm_loss(mu(ids[:, :-1]).logits, ids[:, 1:])
    torch.testing.assert_close(loss, ref)


def test_explicit_attention_scale_wins_under_mup():
    c = as_mup(gpt(attention=AttentionConfig(scale=0.5)), 8)
    assert built(c).blocks[0].attn.scale == 0.5


@pytest.mark.parametrize("family", list(FAMILIES))
def test_parameter_count_and_flops_do_not_change(family):
    std_cfg = FAMILIES[family]()
    mu_cfg = as_mup(std_cfg, 8)
    n = archlab.num_params(std_cfg)
    assert archlab.num_params(mu_cfg) == n == sum(p.numel() for p in built(mu_cfg).parameters())
    assert training_flops_per_token(mu_cfg, 16) == training_flops_per_token(std_cfg, 16)


# ----------------------------------------------------------------------------- optimizer groups


@pytest.mark.parametrize("family", list(FAMILIES))
def test_optimizer_groups_carry_the_lr_scales_and_set_lr_keeps_them(family):
    """Hidden block matrices (attention, FFN, routed/shared experts, router gate): lr 1/m, weight
    decay * m; an untied LM head: lr 1, decayed; embeddings, norms, biases: lr 1, no decay."""
    mu_cfg = as_mup(FAMILIES[family](), 8)  # m = 4
    model = built(mu_cfg)
    names = {id(p): n for n, p in model.named_parameters()}
    groups = {g["name"]: g for g in param_groups(model, 0.1)}
    assert sorted(groups) == (["decay", "no_decay"] if mu_cfg.tie_embeddings else ["decay", "no_decay", "readout"])
    hidden = {names[id(p)] for p in groups["decay"]["params"]}
    assert hidden == {n for n, p in model.named_parameters() if n.startswith("blocks.") and p.ndim >= 2}
    if family == "mixtral":
        assert any(n.endswith("experts.w_up") for n in hidden) and any(n.endswith("router.gate.weight") for n in hidden)
        assert any(".shared." in n for n in hidden)
    assert groups["decay"]["lr_scale"] == 0.25 and groups["decay"]["weight_decay"] == pytest.approx(0.4)
    assert groups["no_decay"]["lr_scale"] == 1.0 and groups["no_decay"]["weight_decay"] == 0.0
    assert "embed.weight" in {names[id(p)] for p in groups["no_decay"]["params"]}
    if not mu_cfg.tie_embeddings:
        assert [names[id(p)] for p in groups["readout"]["params"]] == ["lm_head.weight"]
        assert groups["readout"]["lr_scale"] == 1.0 and groups["readout"]["weight_decay"] == 0.1
    assert sum(len(g["params"]) for g in groups.values()) == len(list(model.parameters()))

    opt = build_optimizer(model, train_cfg(lr=2e-3, weight_decay=0.1))
    assert {g["name"]: g["lr"] for g in opt.param_groups}["decay"] == pytest.approx(5e-4)  # before any set_lr
    for lr in (1e-3, 4e-3):
        set_lr(opt, lr)
        for g in opt.param_groups:
            assert g["lr"] == pytest.approx(lr * (0.25 if g["name"] == "decay" else 1.0)), g["name"]


def test_standard_groups_have_unit_lr_scale():
    opt = build_optimizer(built(llama()), train_cfg(lr=2e-3, weight_decay=0.1))
    assert [(g["name"], g["lr_scale"], g["weight_decay"]) for g in opt.param_groups] == [
        ("decay", 1.0, 0.1), ("no_decay", 1.0, 0.0)]
    set_lr(opt, 1e-3)
    assert all(g["lr"] == 1e-3 for g in opt.param_groups)


def test_lr_scales_survive_an_optimizer_state_roundtrip():
    """A checkpoint's optimizer state replaces the groups' hyper-parameters on load; the lr scales
    come from the model's parametrisation all the same (also from a state saved without them)."""
    model = built(as_mup(llama(), 8))
    t = train_cfg(lr=1e-3)
    opt = build_optimizer(model, t)
    model(torch.randint(0, V, (1, 8)), targets=torch.randint(0, V, (1, 8))).loss.backward()
    opt.step()
    state = opt.state_dict()
    legacy = {**state, "param_groups": [{k: v for k, v in g.items() if k != "lr_scale"} for g in state["param_groups"]]}
    for saved in (state, legacy):
        fresh = build_optimizer(model, t)
        fresh.load_state_dict(saved)
        set_lr(fresh, 1e-3)
        assert [g["lr"] for g in fresh.param_groups] == pytest.approx([2.5e-4, 1e-3, 1e-3])
        assert len(fresh.state) == len(list(model.parameters()))


def test_expert_parallel_groups_inherit_the_lr_scale():
    from archlab.nn.moe import moe_layers
    from archlab.parallel.expert import shard_experts

    model = built(as_mup(mixtral(), 8))
    for layer in moe_layers(model):
        assert shard_experts(layer, 0, 2) == 2
    experts = {id(p) for ly in moe_layers(model) for p in (ly.experts.w_up, ly.experts.w_down)}
    opt = build_optimizer(model, train_cfg(lr=1e-3, weight_decay=0.1), expert_groups=True)
    by_name = {g["name"]: g for g in opt.param_groups}
    assert sorted(by_name) == ["decay", "ep_size_2", "no_decay", "readout"]
    moe = by_name["ep_size_2"]
    assert moe["moe"] is True and {id(p) for p in moe["params"]} == experts
    assert moe["lr_scale"] == 0.25 and moe["weight_decay"] == pytest.approx(0.4)
    set_lr(opt, 2e-3)
    assert moe["lr"] == pytest.approx(5e-4) and by_name["readout"]["lr"] == 2e-3


# ----------------------------------------------------------------------------- coordinate check

WIDTHS = (64, 128, 256, 512)


def coord_check(parametrization: str, steps: int = 5, lr: float = 3e-3) -> dict[int, dict[str, float]]:
    """Tensor Programs V's coordinate check: per width (n_heads fixed, so the head dim grows with
    it), a few AdamW steps at one lr on one fixed batch, then the mean |coordinate| of each block's
    output and of the logits. Base width 64 for muP; standard uses archlab's fixed init std."""
    data = torch.randint(0, V, (8, 17), generator=torch.Generator().manual_seed(1))
    x, y = data[:, :-1], data[:, 1:]
    out = {}
    for d in WIDTHS:
        c = llama(d_model=d, n_kv_heads=None, tie_embeddings=True)
        model = built(as_mup(c, WIDTHS[0]) if parametrization == "mup" else c)
        opt = build_optimizer(model, train_cfg(lr=lr, weight_decay=0.0))
        set_lr(opt, lr)
        for _ in range(steps):
            model(x, targets=y).loss.backward()
            opt.step()
            opt.zero_grad()
        l1 = {}
        hooks = [blk.register_forward_hook(lambda mod, args, o, i=i: l1.__setitem__(f"block{i}", o[0].abs().mean()))
                 for i, blk in enumerate(model.blocks)]
        with torch.no_grad():
            l1["logits"] = model(x).logits.abs().mean()
        for h in hooks:
            h.remove()
        out[d] = {k: float(v) for k, v in l1.items()}
    return out


def spread(table: dict[int, dict[str, float]], key: str) -> float:
    values = [row[key] for row in table.values()]
    return max(values) / min(values)


def test_coordinate_check_mup_is_flat_across_widths_and_standard_is_not():
    """Measured, mean |logit| at widths 64/128/256/512: standard 0.237 / 0.365 / 0.595 / 0.878
    (max/min 3.7), muP 0.237 / 0.232 / 0.209 / 0.202 (1.18); last block's output: standard 0.039 /
    0.072 / 0.218 / 0.753 (19.3), muP 0.039 / 0.039 / 0.040 / 0.039 (1.02). Seeds 1-3: muP logits
    within 1.13-1.21, standard 3.9-4.0."""
    std, mu = coord_check("standard"), coord_check("mup")
    assert std[WIDTHS[0]] == mu[WIDTHS[0]]  # m = 1 at the base width
    assert spread(mu, "logits") < 1.5
    assert spread(std, "logits") > 2.5 and std[WIDTHS[-1]]["logits"] > 2 * std[WIDTHS[0]]["logits"]
    for block in ("block0", "block1"):
        assert spread(mu, block) < 1.5
        assert spread(std, block) > 5.0


# ----------------------------------------------------------------------------- invalid configs


@pytest.mark.parametrize("kw,expected", [
    (dict(parametrization="maximal"), ["model.parametrization='maximal'", "must be one of: standard, mup"]),
    (dict(parametrization="mup", mup_base_width=0), ["model.mup_base_width=0", "positive"]),
    (dict(parametrization="mup", mup_base_width=-64), ["model.mup_base_width=-64", "positive"]),
])
def test_invalid_mup_configs_are_refused(kw, expected):
    with pytest.raises(archlab.RecipeError) as err:
        archlab.build_model(dataclasses.replace(llama(), **kw))
    for part in expected:
        assert part in str(err.value), str(err.value)
