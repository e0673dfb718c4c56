"""Sparse upcycling (archlab/train/upcycle.py): copy gives the dense model's logits at step 0; Drop-Upcycling
re-initialises exactly its share of each expert's hidden units; bad inputs are refused by name."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

import archlab
from archlab.config import RecipeError
from archlab.model.build import build_model
from archlab.train import Trainer, train
from archlab.train.upcycle import dense_model_node, upcycle

SMALL = ["model.vocab_size=300", "model.d_model=32", "model.n_layers=3", "model.n_heads=2", "model.n_kv_heads=1",
         "model.max_seq_len=64", "model.ffn.hidden=64"]


def models(root, *moe_overrides: str, method: str = "copy", drop_ratio: float = 0.5):
    """(dense llama-tiny, its MoE upcycled from it) at a small width; experts of the dense width."""
    torch.manual_seed(0)
    dense_cfg = archlab.load_recipe(root / "recipes/llama/tiny.yaml", SMALL)
    dense = build_model(dense_cfg).eval()
    moe_cfg = archlab.load_recipe(root / "recipes/mixtral/tiny-upcycled.yaml",
                                  [*SMALL, "model.moe.expert_hidden=64", *moe_overrides])
    moe = build_model(moe_cfg).eval()
    upcycle(moe, dense.state_dict(), moe_cfg.model, {}, method, drop_ratio)
    return dense, moe


def max_logit_diff(a, b) -> float:
    ids_BS = torch.randint(0, 300, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return float((a(ids_BS).logits - b(ids_BS).logits).abs().max())


def test_copy_upcycled_moe_has_the_dense_logits_at_step_0(root):
    dense, moe = models(root)
    assert max_logit_diff(dense, moe) < 1e-5
    # every expert equal, the router not a copy of anything: a fresh N(0, init_std) draw
    w_up = moe.blocks[0].ffn.experts.w_up
    assert torch.equal(w_up[0], w_up[7]) and torch.equal(w_up[0], dense.blocks[0].ffn.gate_up.weight.t())
    assert moe.blocks[0].ffn.router.gate.weight.std() > 0


def test_copy_keeps_the_dense_layers_of_an_interleaved_moe(root):
    dense, moe = models(root, "model.moe.first_k_dense=1", "model.moe.every=2")
    assert not hasattr(moe.blocks[0].ffn, "experts") and hasattr(moe.blocks[1].ffn, "experts")
    assert max_logit_diff(dense, moe) < 1e-5


def test_drop_upcycling_reinitialises_its_share_of_each_experts_hidden_units(root):
    dense, moe = models(root, method="drop", drop_ratio=0.25)
    F = 64
    down_FD = dense.blocks[1].ffn.down.weight.t()
    experts = moe.blocks[1].ffn.experts
    dropped = []
    for e in range(experts.num_experts):
        changed_F = (experts.w_down[e] != down_FD).any(dim=1)
        assert int(changed_F.sum()) == 16  # round(0.25 * 64) rows re-drawn, the other 48 the dense ones
        up_changed = (experts.w_up[e] != dense.blocks[1].ffn.gate_up.weight.t()).any(dim=0)
        # the same hidden units in the gate and the up halves as in down
        assert torch.equal(up_changed[:F], changed_F) and torch.equal(up_changed[F:], changed_F)
        dropped.append(changed_F)
    assert any(not torch.equal(dropped[0], d) for d in dropped[1:])  # a set drawn per expert
    # the stated deviation: the logits differ from the dense model's, by the re-initialised units only
    assert max_logit_diff(dense, moe) > 1e-3
    _, moe_none = models(root, method="drop", drop_ratio=1e-9)
    assert max_logit_diff(dense, moe_none) < 1e-5  # round(r * F) = 0 units: no deviation


def test_drop_draws_from_the_dense_matrix_statistics(root):
    dense, moe = models(root, method="drop", drop_ratio=1.0)
    ref = dense.blocks[2].ffn.down.weight
    new = moe.blocks[2].ffn.experts.w_down
    assert abs(float(new.detach().std()) - float(ref.detach().std())) < 0.1 * float(ref.detach().std())
    assert not torch.equal(new[0], ref.t())


def test_expert_width_other_than_the_dense_ffn_is_refused(root):
    with pytest.raises(RecipeError, match="model.moe.expert_hidden=32.*dense run's FFN width 64"):
        models(root, "model.moe.expert_hidden=32")


def write_run(folder, recipe, overrides):
    folder.mkdir(parents=True)
    (folder / "recipe.yaml").write_text(OmegaConf.to_yaml(archlab.load_recipe(recipe, overrides)))
    return folder


@pytest.mark.parametrize("dense_overrides, moe_overrides, match", [
    (["model.moe.num_experts=4", "model.moe.expert_hidden=64"], [], "this one is an MoE"),
    (["model.d_model=48"], [], "model.d_model: 48 there, 32 here"),
    ([], ["model.moe.n_shared_experts=1"], "model.moe.n_shared_experts=1"),
])
def test_a_run_that_cannot_be_upcycled_is_refused_by_name(root, tmp_path, dense_overrides, moe_overrides, match):
    ckpt = write_run(tmp_path / "run", root / "recipes/llama/tiny.yaml", [*SMALL, *dense_overrides])
    moe_cfg = archlab.load_recipe(root / "recipes/mixtral/tiny-upcycled.yaml",
                                  [*SMALL, "model.moe.expert_hidden=64", *moe_overrides])
    with pytest.raises(RecipeError, match=match):
        dense_model_node(ckpt, moe_cfg.model)


def test_upcycle_needs_init_from_and_an_moe_recipe(root):
    with pytest.raises(RecipeError, match="train.upcycle=.*set train.init_from"):
        archlab.load_recipe(root / "recipes/mixtral/tiny-upcycled.yaml", ["train.upcycle.method=copy"])
    with pytest.raises(RecipeError, match="train.upcycle=.*needs model.moe"):
        archlab.load_recipe(root / "recipes/llama/tiny.yaml", ["train.init_from=x", "train.upcycle.method=copy"])


def test_the_trainer_starts_an_upcycled_run_from_a_dense_run(tiny_cfg, tmp_path):
    dense_cfg = tiny_cfg("train.max_steps=4", "train.run_name=dense")
    train(dense_cfg)
    dense_run = tmp_path / "runs" / "dense"
    moe_cfg = tiny_cfg(f"train.init_from={dense_run}", "train.upcycle.method=copy", "model.moe.expert_hidden=96",
                       "train.run_name=moe", recipe="mixtral/tiny-upcycled")
    trainer = Trainer(moe_cfg)
    continued = Trainer(tiny_cfg(f"train.init_from={dense_run}", "train.run_name=cont"))
    ids_BS = torch.randint(0, 300, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = (trainer.model(ids_BS).logits - continued.model(ids_BS).logits).abs().max()
    assert float(diff) < 1e-4
