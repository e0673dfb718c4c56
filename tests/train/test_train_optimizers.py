"""Optimizers (``train.optimizer``, ``archlab.optim``): Muon is torch.optim.Muon on the hidden
matrices (each routed expert a matrix of its own) and torch.optim.AdamW on the rest; its update is
orthogonalised; its groups, muP scales and state bytes are as stated; a Muon run resumes exactly; a
checkpoint of one optimizer is not resumed by another. Schedules are classes of one registry."""

import math
import signal

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file
from torch import nn
from torch.optim._muon import _adjust_lr

import archlab
from archlab.config.schema import TrainConfig
from archlab.costs import model_state_memory, param_counts
from archlab.optim import (
    OPTIMIZERS,
    SCHEDULES,
    AdamWOptimizer,
    MuonOptimizer,
    MuonWithAdamW,
    param_roles,
    schedule_class,
)
from archlab.train import CheckpointError, Trainer, train
from archlab.train import checkpoint as ckpt
from archlab.train.optim import build_optimizer, lr_at

SMALL = ["model.vocab_size=300", "model.max_seq_len=32", "model.d_model=32", "model.n_layers=2", "model.n_heads=4",
         "train.seq_len=32"]
MOE = ["model.moe.num_experts=4", "model.moe.expert_hidden=16"]


def _recipe(root, recipe: str, *overrides: str):
    return archlab.load_recipe(root / "recipes" / f"{recipe}.yaml", [*SMALL, *overrides])


def _muon_kwargs(group: dict) -> dict:
    return {k: group[k] for k in ("lr", "weight_decay", "momentum", "nesterov", "ns_steps", "adjust_lr_fn")}


# ----------------------------------------------------------------------------- torch's Muon, each expert a matrix


@pytest.mark.parametrize("adjust", ["match_rms_adamw", "original"])
def test_muon_is_torch_muon_per_matrix_and_per_expert_and_adamw_for_the_rest(root, adjust):
    """Two steps of archlab's muon on a small Mixtral equal, bitwise: torch.optim.Muon on every 2-D
    hidden matrix, torch.optim.Muon on each expert's (out, in) matrix w[e].mT of the stacked (E, in, out)
    expert weights, and torch.optim.AdamW on the AdamW groups."""
    cfg = _recipe(root, "mixtral/tiny", *MOE, "train.optimizer=muon", f"train.muon.adjust_lr_fn={adjust}",
                  "train.muon.adamw_lr_ratio=0.5", "train.lr=0.01")
    torch.manual_seed(0)
    model = archlab.build_model(cfg)
    opt = build_optimizer(model, cfg.train)
    assert isinstance(opt, MuonWithAdamW)
    muon_group = next(g for g in opt.param_groups if g["muon"])
    kw = _muon_kwargs(muon_group)
    assert kw["adjust_lr_fn"] == adjust and kw["momentum"] == 0.95 and kw["nesterov"] and kw["ns_steps"] == 5
    # the references: one standalone tensor per matrix
    matrices, experts = {}, {}
    for p in muon_group["params"]:
        if p.ndim == 2:
            matrices[p] = nn.Parameter(p.detach().clone())
        else:
            assert p.ndim == 3
            experts[p] = [nn.Parameter(p.detach()[e].mT.clone()) for e in range(p.shape[0])]
    assert matrices and experts
    ref_muon = torch.optim.Muon([*matrices.values(), *(q for qs in experts.values() for q in qs)], **kw)
    adamw_groups = [g for g in opt.param_groups if not g["muon"]]
    assert {g["name"] for g in adamw_groups} == {"decay", "no_decay"}
    twins = {p: nn.Parameter(p.detach().clone()) for g in adamw_groups for p in g["params"]}
    ref_adamw = torch.optim.AdamW([{"params": [twins[p] for p in g["params"]], "lr": g["lr"],
                                    "weight_decay": g["weight_decay"]} for g in adamw_groups],
                                  betas=(0.9, 0.95), eps=1e-8, foreach=False)
    assert [g["lr"] for g in adamw_groups] == [0.005, 0.005]  # train.lr * adamw_lr_ratio
    gen = torch.Generator().manual_seed(1)
    for _ in range(2):
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=gen)
            if p in matrices:
                matrices[p].grad = p.grad.clone()
            elif p in experts:
                for e, q in enumerate(experts[p]):
                    q.grad = p.grad[e].mT.clone()
            else:
                twins[p].grad = p.grad.clone()
        opt.step()
        ref_muon.step()
        ref_adamw.step()
    assert all(torch.equal(p, q) for p, q in matrices.items())
    assert all(torch.equal(p[e].mT, q) for p, qs in experts.items() for e, q in enumerate(qs))
    assert all(torch.equal(p, q) for p, q in twins.items())
    # the momentum buffer of an expert stack is one (E, in, out) tensor, as its weight
    stack = next(iter(experts))
    assert opt.state[stack]["momentum_buffer"].shape == stack.shape


def test_muon_update_is_orthogonalised():
    """One step from zero momentum, no weight decay: the update divided by lr times torch's shape
    adjustment is Newton-Schulz's orthogonalisation of the gradient: singular values in the band
    torch's quintic NS5 gives (measured 0.68-1.14 for a Gaussian gradient; all 1 would be U V^T),
    aligned with the polar factor U V^T; each expert of a stack on its own."""
    torch.manual_seed(0)
    w2 = nn.Parameter(torch.randn(64, 32))
    w3 = nn.Parameter(torch.randn(3, 32, 96))  # (E, in, out)
    before = [w2.detach().clone(), w3.detach().clone()]
    opt = MuonWithAdamW([{"params": [w2, w3], "muon": True, "weight_decay": 0.0}], lr=0.5, betas=(0.9, 0.95),
                        eps=1e-8, momentum=0.95, nesterov=True, ns_steps=5, adjust_lr_fn="match_rms_adamw")
    g2, g3 = torch.randn(64, 32) * torch.linspace(0.1, 3, 32), torch.randn(3, 32, 96) * torch.linspace(0.1, 3, 96)
    w2.grad, w3.grad = g2.clone(), g3.clone()
    opt.step()

    def check(update: torch.Tensor, grad: torch.Tensor) -> None:
        o = update / (0.5 * _adjust_lr(1.0, "match_rms_adamw", update.shape))
        sv = torch.linalg.svdvals(o)
        assert 0.6 < sv.min() and sv.max() < 1.2, sv
        u, _, vh = torch.linalg.svd(grad, full_matrices=False)
        polar = u @ vh
        assert (o * polar).sum() / (o.norm() * polar.norm()) > 0.95
        assert torch.linalg.svdvals(grad).max() / torch.linalg.svdvals(grad).min() > 3  # the gradient was not

    check(before[0] - w2.detach(), g2)
    for e in range(3):  # (out, in) = (96, 32): orthogonalised per expert
        check((before[1][e] - w3.detach()[e]).mT, g3[e].mT)
    # the stack as one (E*in, out) matrix is not orthogonal: the experts were not orthogonalised together
    whole = torch.linalg.svdvals((before[1] - w3.detach()).reshape(-1, 96) / (0.5 * 0.2 * math.sqrt(96)))
    assert whole.max() > 1.4


# ----------------------------------------------------------------------------- groups, muP, state bytes


@pytest.mark.parametrize("recipe, overrides", [
    ("llama/tiny", []),  # untied head, RMSNorm, no biases
    ("dense/tiny", []),  # tied embeddings, learned positions, LayerNorm, biases
    ("mixtral/tiny", MOE),  # routed experts (E, in, out), a softmax router
    ("deepseek/tiny", []),  # shared experts, a sigmoid router, a dense first layer
])
def test_muon_groups_as_stated(root, recipe, overrides):
    """muon: every matrix of the blocks but the routers' gates (attention, FFN, shared experts, routed
    experts whole as (E, in, out) stacks); AdamW: embeddings, an untied head, norms, biases, routers
    (decay: routers and the head; no_decay: the rest). Every trainable parameter exactly once."""
    cfg = _recipe(root, recipe, *overrides, "train.optimizer=muon")
    model = archlab.build_model(cfg)
    groups = {g["name"]: g for g in build_optimizer(model, cfg.train).param_groups}
    names = {id(p): n for n, p in model.named_parameters()}
    muon = {names[id(p)] for p in groups["muon"]["params"]}
    decay = {names[id(p)] for p in groups.get("decay", {"params": []})["params"]}
    no_decay = {names[id(p)] for p in groups["no_decay"]["params"]}
    assert len(muon) + len(decay) + len(no_decay) == len(names) and not (muon & decay or muon & no_decay)
    params = dict(model.named_parameters())
    assert all(n.startswith("blocks.") and params[n].ndim >= 2 and "router" not in n for n in muon)
    assert any("attn" in n for n in muon) and any("ffn" in n or "experts" in n for n in muon)
    expected_decay = {n for n in params if "router" in n and params[n].ndim == 2}
    if not cfg.model.tie_embeddings:
        expected_decay.add("lm_head.weight")
    assert decay == expected_decay
    tables = {f"{m}.weight" for m, mod in model.named_modules() if isinstance(mod, nn.Embedding)}
    assert {n for n in no_decay if params[n].ndim >= 2} == tables  # token (and learned position) tables
    assert groups["muon"]["weight_decay"] == 0.1 and groups["no_decay"]["weight_decay"] == 0.0
    if cfg.model.moe is not None:
        stacks = [n for n in muon if params[n].ndim == 3]
        assert stacks and all("experts" in n for n in stacks)
        assert expected_decay  # the routers stay on AdamW
    if recipe.startswith("deepseek"):
        assert any("shared" in n for n in muon)


@pytest.mark.parametrize("adjust, hidden", [("match_rms_adamw", (0.5, 2.0)), ("original", (1.0, 1.0))])
def test_muon_under_mup(root, adjust, hidden):
    """muP at m = 4: Muon's hidden matrices lr / sqrt(m) and weight decay * sqrt(m) under
    match_rms_adamw (its scale grows as sqrt(width)), the base lr under original; the AdamW groups as
    Adam's muP: routers lr/m, the untied head (readout) lr, vectors lr; times adamw_lr_ratio."""
    cfg = _recipe(root, "mixtral/tiny", *MOE, "model.parametrization=mup", "model.mup_base_width=8",
                  "train.optimizer=muon", f"train.muon.adjust_lr_fn={adjust}", "train.muon.adamw_lr_ratio=0.5")
    groups = {g["name"]: g for g in build_optimizer(archlab.build_model(cfg), cfg.train).param_groups}
    assert (groups["muon"]["lr_scale"], groups["muon"]["weight_decay"] / 0.1) == pytest.approx(hidden)
    assert (groups["decay"]["lr_scale"], groups["decay"]["weight_decay"]) == pytest.approx((0.25 * 0.5, 0.4))
    assert (groups["readout"]["lr_scale"], groups["readout"]["weight_decay"]) == pytest.approx((0.5, 0.1))
    assert groups["no_decay"]["lr_scale"] == 0.5
    spec = MuonOptimizer(cfg.train)
    assert spec.mup_scale("hidden", 1.0) == (1.0, 1.0) and spec.mup_scale("router", 4.0) == (0.25, 4.0)
    assert AdamWOptimizer(cfg.train).mup_scale("hidden", 4.0) == (0.25, 4.0)


@pytest.mark.parametrize("recipe, overrides", [("llama/tiny", []), ("mixtral/tiny", MOE), ("dense/tiny", [])])
def test_state_bytes_in_the_cost_model_are_the_optimizers(root, recipe, overrides):
    """archlab.costs asks the optimizer class: the fp32 state tensors after a step are what
    ``model_state_memory(..., 'fp32').optimizer`` predicts (Muon: 4 bytes per hidden-matrix parameter,
    8 for the rest; AdamW: 8), and a recipe's train.optimizer is the default."""
    for name in ("adamw", "muon"):
        cfg = _recipe(root, recipe, *overrides, f"train.optimizer={name}")
        model = archlab.build_model(cfg)
        opt = build_optimizer(model, cfg.train)
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        opt.step()
        held = sum(t.nbytes for s in opt.state.values() for t in s.values() if torch.is_tensor(t) and t.ndim)
        assert model_state_memory(cfg, "fp32").optimizer == held
        assert model_state_memory(archlab.model_config(cfg), "fp32", optimizer=name).optimizer == held
        n = param_counts(cfg).total
        bf16 = model_state_memory(cfg, "bf16", optimizer=name)
        assert bf16.optimizer == held + 4 * n  # + the fp32 master copy
    hidden = sum(p.numel() for _, p, role in param_roles(model) if role == "hidden")
    assert held == 4 * hidden + 8 * (n - hidden)
    assert OPTIMIZERS.get("adamw").state_bytes_per_param("hidden") == 8
    # sharded: experts over ep, then the states over the expert-data-parallel ranks
    if recipe == "mixtral/tiny":
        s1 = model_state_memory(cfg, "fp32", zero_stage=1, dp=4, ep=2)
        experts = param_counts(cfg).routed_experts
        assert s1.optimizer == pytest.approx((held - 4 * experts) / 4 + 4 * experts / 2 / 2)


# ----------------------------------------------------------------------------- training: exact resume, refusals


def test_muon_run_resumes_exactly(tiny_cfg, rows, monkeypatch):
    """A Muon MoE run interrupted after step 3 and resumed repeats the uninterrupted run bitwise: the
    momentum buffers (expert stacks included) and AdamW moments are in optimizer.pt."""
    common = ("train.optimizer=muon", "train.ckpt_every=100", "train.grad_accum=2", *MOE)
    full = train(tiny_cfg(*common, "train.run_name=full", recipe="mixtral/tiny"))
    original = Trainer.train_step

    def train_step(self):  # a real SIGINT right after step 3 is computed
        out = original(self)
        if self.step + 1 == 3:
            signal.raise_signal(signal.SIGINT)
        return out

    with monkeypatch.context() as m:
        m.setattr(Trainer, "train_step", train_step)
        part = train(tiny_cfg(*common, "train.run_name=part", recipe="mixtral/tiny"))
    assert part["status"] == "interrupted" and part["step"] == 3
    saved = torch.load(ckpt.latest(part["run_dir"]) / ckpt.OPTIMIZER, weights_only=True)
    assert [(g["name"], g["muon"]) for g in saved["param_groups"]] == [
        ("muon", True), ("decay", False), ("no_decay", False)]
    assert ckpt.load_state(ckpt.latest(part["run_dir"]))["optimizer"] == "muon"
    resumed = train(tiny_cfg(*common, "train.run_name=part", "train.resume=auto", recipe="mixtral/tiny"))
    assert resumed["status"] == "completed" and resumed["step"] == 8
    a, b = rows(full["run_dir"]), rows(resumed["run_dir"])
    assert [(r["loss"], r["grad_norm"], r["lr"]) for r in a] == [(r["loss"], r["grad_norm"], r["lr"]) for r in b]
    full_w = load_file(ckpt.latest(full["run_dir"]) / ckpt.WEIGHTS)
    res_w = load_file(ckpt.latest(resumed["run_dir"]) / ckpt.WEIGHTS)
    assert all(torch.equal(full_w[k], res_w[k]) for k in full_w)


def test_another_optimizers_checkpoint_is_refused(tiny_cfg):
    train(tiny_cfg("train.max_steps=2", "train.ckpt_every=2"))
    with pytest.raises(CheckpointError, match=r"written with train\.optimizer=adamw, this run uses "
                                              r"train\.optimizer=muon: resume with train\.optimizer=adamw"):
        # allowed to change train settings, the resume is still refused: adamw's state is no muon state
        train(tiny_cfg("train.max_steps=4", "train.resume=auto", "train.optimizer=muon",
                       "train.resume_allow_changes=true"))


def test_refusals_name_the_launch():
    assert MuonOptimizer.refusal("plain") is None and AdamWOptimizer.refusal("zero", 3) is None
    why = MuonOptimizer.refusal("zero", 3)
    assert why.startswith("train.optimizer=muon under DeepSpeed ZeRO stage 3: ") and "PR #8438" in why
    assert MuonOptimizer.refusal("expert-zero").startswith("train.optimizer=muon under DeepSpeed ZeRO-1/2 with expert")


# ----------------------------------------------------------------------------- schedules


def test_schedules_are_classes_of_one_registry():
    assert SCHEDULES.names() == ["constant", "cosine", "wsd"] and OPTIMIZERS.names() == ["adamw", "muon"]
    t = OmegaConf.structured(TrainConfig(schedule="wsd", lr=1.0, warmup_steps=2, max_steps=10, decay_steps=4,
                                         decay_shape="sqrt", min_lr_ratio=0.0))
    assert schedule_class(t).options == {"min_lr_ratio", "decay_fraction", "decay_steps", "decay_shape"}
    assert [lr_at(s, t) for s in range(2, 7)] == [1.0] * 5
    assert lr_at(8, t) == pytest.approx(1.0 - math.sqrt(0.5))
    assert not SCHEDULES.get("constant").decays and SCHEDULES.get("cosine").decays
    with pytest.raises(ValueError, match="train.schedule='step': must be one of constant, cosine, wsd"):
        lr_at(50, OmegaConf.structured(TrainConfig(schedule="step")))
