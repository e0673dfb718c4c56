"""Objectives: the causal-LM step unchanged, multi-token prediction against DeepSeek-V3's equations,
the cost model exact for both, options refused where they do nothing."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import archlab
from archlab.config.validate import RecipeError
from archlab.costs import training_flops_per_token
from archlab.costs.measure import measured_flops, saved_activation_bytes
from archlab.costs.memory import activation_memory
from archlab.data import TokenBatches
from archlab.hf import to_hf_model
from archlab.model import build_model
from archlab.nn.loss import lm_loss
from archlab.objectives import OBJECTIVES, objective_for
from archlab.optim import param_roles

SMALL = ["model.d_model=32", "model.n_heads=2", "model.vocab_size=300"]


def recipe(name: str, depth: int = 0, *more: str):
    mtp = [f"model.mtp_depth={depth}", "train.objective=mtp"] if depth else []
    return archlab.load_recipe(f"recipes/{name}.yaml", [*SMALL, *mtp, *more])


def window(cfg, B: int = 2, S: int = 16, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.model.vocab_size, (B, S + objective_for(cfg).window_ahead), generator=g)


def test_registry_and_windows():
    assert OBJECTIVES.names() == ["bound", "causal_lm", "classify", "mlm", "mtp", "span_corruption", "span_qa",
                                 "tag"]
    assert objective_for(recipe("llama/tiny")).window_ahead == 1
    assert objective_for(recipe("deepseek/tiny", 2)).window_ahead == 3
    tokens = torch.arange(1000).numpy()
    one = TokenBatches(tokens, 16, 2, 1, seed=3)
    three = TokenBatches(tokens, 16, 2, 1, seed=3, ahead=3)
    assert one.get(0).shape == (2, 17) and three.get(0).shape == (2, 19)
    assert (three.get(0)[:, 1:] - three.get(0)[:, :-1] == 1).all()  # contiguous windows of the array


def test_causal_lm_is_the_shifted_next_token_loss():
    cfg = recipe("deepseek/tiny")
    torch.manual_seed(0)
    model = build_model(cfg)
    x = window(cfg)
    loss = objective_for(cfg).loss(model, x)
    out = model(x[:, :-1], targets=x[:, 1:])  # the step as written before objectives existed
    assert torch.equal(loss.main, out.loss.float()) and torch.equal(loss.aux, out.aux_loss.float())
    assert torch.equal(loss.total, loss.main + loss.aux) and loss.parts == {}
    total, count = objective_for(cfg).eval_sums(model, x)
    assert count == x[:, 1:].numel()
    torch.testing.assert_close(total, lm_loss(model(x[:, :-1]).logits, x[:, 1:], reduction="sum"))


@pytest.mark.parametrize("name,more", [("deepseek/tiny", []), ("bert/tiny", []), ("t5/tiny", [])])
def test_the_logits_reference_equals_the_fused_loss(name, more):
    """Each objective's unfused reference (cross-entropy on the logits, the same masks or spans) equals its
    fused training loss: the cost model measures either path of the same computation."""
    cfg = recipe(name, 0, *more)
    torch.manual_seed(0)
    model = build_model(cfg)
    x = window(cfg)
    objective = objective_for(cfg)
    torch.testing.assert_close(objective.logits_loss(model, x, step=3), objective.loss(model, x, step=3).total)


def test_mtp_has_no_logits_reference():
    cfg = recipe("deepseek/tiny", 1)
    with pytest.raises(ValueError, match="train.objective=mtp: its loss is fused only"):
        objective_for(cfg).logits_loss(build_model(cfg), window(cfg))


@pytest.mark.parametrize("depth", [1, 2])
def test_mtp_losses_follow_the_deepseek_v3_equations(depth):
    cfg = recipe("llama/tiny", depth)
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    S = 16
    x = window(cfg, S=S)
    loss = objective_for(cfg).loss(model, x)
    # the main loss is the causal LM's: the MTP modules change nothing upstream
    assert torch.equal(loss.main, model(x[:, :S], targets=x[:, 1:S + 1]).loss.float())
    # by hand: h^0 = the residual stream after the last block; module k: norms, concat, projection, block
    ctx = model.positions.context(torch.arange(S), torch.arange(S))
    h = model.embed(x[:, :S])
    for block in model.blocks:
        h, _ = block(h, ctx)
    expected = []
    for k, mod in enumerate(model.mtp, start=1):
        emb = model.embed(x[:, k:S + k])
        h, _ = mod.block(mod.proj(torch.cat([mod.hidden_norm(h), mod.embed_norm(emb)], -1)), ctx)
        logits = model.lm_head(mod.out_norm(h))  # the shared head
        expected.append(F.cross_entropy(logits.flatten(0, 1), x[:, k + 1:S + k + 1].flatten()))
    torch.testing.assert_close(loss.parts["mtp_loss"], torch.stack(expected).mean())
    torch.testing.assert_close(loss.total, loss.main + 0.3 * loss.parts["mtp_loss"] + loss.aux)


@pytest.mark.parametrize("name", ["deepseek/tiny", "llama/tiny", "vanilla/tiny"])
@pytest.mark.parametrize("depth", [1, 2])
@pytest.mark.parametrize("mode", ["none", "full", "selective"])
def test_mtp_cost_model_equals_the_measured_step(name, depth, mode):
    cfg = recipe(name, depth)
    torch.manual_seed(0)
    model = build_model(cfg)
    model.checkpointing = mode
    B, S = 2, 16
    x = window(cfg, B, S)
    if mode == "none":
        assert measured_flops(model, x)["total"] == training_flops_per_token(cfg, S) * B * S
    model.zero_grad()
    assert saved_activation_bytes(model, x)["total"] == activation_memory(
        cfg, B, S, dtype="fp32", device="cpu", checkpointing=mode).total


def test_mtp_modules_are_counted_apart_and_trained_as_hidden_matrices():
    cfg = recipe("deepseek/tiny", 1)
    model = build_model(cfg)
    counts = archlab.costs.param_counts(cfg)
    assert counts.total == archlab.num_params(archlab.model_config(cfg))  # what export keeps
    assert counts.mtp == sum(p.numel() for p in model.mtp.parameters()) > 0
    assert counts.total + counts.mtp == sum(p.numel() for p in model.parameters())
    roles = {name: role for name, _, role in param_roles(model)}
    assert roles["mtp.0.proj.weight"] == "hidden" and roles["mtp.0.hidden_norm.weight"] == "vector"
    assert any(r == "router" for n, r in roles.items() if n.startswith("mtp.0.block.ffn"))


def test_mtp_modules_are_dropped_at_export_with_equal_logits():
    cfg = archlab.model_config(archlab.load_recipe("recipes/deepseek/v3-tiny.yaml",
                                                   ["model.n_layers=2", "model.mtp_depth=1",
                                                    "train.objective=mtp"]))
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    hf = to_hf_model(model)
    ids = torch.randint(0, cfg.vocab_size, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids).logits)
    assert sum(p.numel() for p in hf.parameters()) == archlab.num_params(cfg)


@pytest.mark.parametrize("overrides, message", [
    (["model.mtp_depth=1"], r"model.mtp_depth=1: multi-token-prediction modules are trained only by "
                            r"train.objective=mtp"),
    (["train.objective=mtp"], r"train.objective='mtp': needs multi-token-prediction modules"),
    (["train.objective.weight=0.1"], r"train.objective.weight=0.1: not a key of objective.type causal_lm \(its keys: "
                                     r"type\); weight is read by objective.type mtp"),
    (["model.mtp_depth=1", "train.objective=mtp", "train.objective.weight=0"],
     r"train.objective.weight=0.0: must be positive"),
    (["model.mtp_depth=-1"], r"model.mtp_depth=-1: must be >= 0"),
    (["train.objective=mlm"], r"train.objective='mlm': masked-token prediction needs model.type=encoder"),
    (["train.objective=ctc"], r"train.objective='ctc': must be one of: bound, causal_lm, classify, mlm, mtp"),
])
def test_bad_objective_settings_are_refused_by_name(overrides, message):
    with pytest.raises(RecipeError, match=message):
        archlab.load_recipe("recipes/deepseek/tiny.yaml", overrides)


def test_a_targets_window_of_the_wrong_length_is_refused():
    cfg = recipe("llama/tiny", 2)
    model = build_model(cfg)
    x = window(cfg, S=8)
    with pytest.raises(ValueError, match=r"with 2 MTP modules, targets are \(B, S or S \+ 2\)"):
        model(x[:, :8], targets=x[:, 1:-1])


def test_mtp_modules_follow_mup_like_the_blocks():
    """Under muP the modules' matrices are hidden matrices: init sigma / sqrt(m), lr / m, as the blocks'."""
    from archlab.nn.mup import hidden_matrices

    cfg = recipe("llama/tiny", 1, "model.parametrization=mup", "model.mup_base_width=16", "model.d_model=64")
    torch.manual_seed(0)
    model = build_model(cfg)
    hidden = hidden_matrices(model)
    assert id(model.mtp[0].proj.weight) in hidden and id(model.blocks[0].attn.wqkv.weight) in hidden
    stds = [float(model.mtp[0].proj.weight.std()), float(model.blocks[0].attn.wqkv.weight.std())]
    for std in stds:  # m = 64 / 16 = 4: 0.02 / 2
        assert abs(std - 0.01) < 0.001
