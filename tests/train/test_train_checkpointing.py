"""``train.activation_checkpointing`` through the trainer: the bytes its real step saves for
backward equal the cost model's prediction in every mode, a short run's losses are the same with
and without checkpointing, and an unknown mode is refused naming the valid ones."""

import pytest
import torch
from torch._dynamo.utils import counters

from archlab.config import RecipeError
from archlab.costs import activation_memory
from archlab.costs.measure import saved_activation_bytes
from archlab.train import Trainer, train

MODES = ("none", "full", "selective")
RUN = ["train.max_steps=6", "train.eval_every=100", "train.ckpt_every=100", "train.eval_context_multipliers=[1]",
       "train.precision=fp32"]
# deepseek: groups, shared experts and the aux-loss-free bias, whose update reads the routing
# counts: a recomputed forward that counted its tokens again would change the run
MOE = {"mixtral/tiny": ["model.moe.num_experts=4", "model.moe.expert_hidden=32"],
       "deepseek/tiny": ["model.moe.num_experts=8", "model.moe.top_k=3", "model.moe.expert_hidden=16",
                         "model.moe.router.n_groups=2", "model.moe.router.topk_groups=1",
                         "model.moe.balance.bias_update_rate=0.01"]}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("recipe", ["dense/tiny", "mixtral/tiny"])
def test_trainer_step_saves_what_the_cost_model_predicts(tiny_cfg, recipe, mode):
    """Saved-tensor hooks around ``Trainer._forward_loss`` (the fused loss, checkpointing as the
    recipe says) on the trainer's first micro batch."""
    cfg = tiny_cfg(*RUN, f"train.activation_checkpointing={mode}", *MOE.get(recipe, []), recipe=recipe)
    trainer = Trainer(cfg)
    try:
        assert trainer.model.checkpointing == mode
        x_BS1 = trainer.batches.get(0, 0).to(trainer.device)
        B, S = x_BS1.shape[0], x_BS1.shape[1] - 1
        measured = saved_activation_bytes(trainer.model, x_BS1, loss_fn=lambda m, x: trainer._forward_loss(x).total)
        predicted = activation_memory(cfg, B, S, dtype="fp32", device="cpu", checkpointing=mode)
        assert predicted.total == measured["total"]
    finally:
        trainer.close()


@pytest.mark.parametrize("recipe", ["dense/tiny", "deepseek/tiny"])
def test_training_losses_are_the_same_with_checkpointing(tiny_cfg, rows, recipe):
    runs = {mode: rows(train(tiny_cfg(*RUN, "model.dropout=0.1", f"train.activation_checkpointing={mode}",
                                      f"train.run_name={mode}", *MOE.get(recipe, []), recipe=recipe))["run_dir"])
            for mode in MODES}
    ref = runs["none"]
    assert len(ref) == 6
    for mode in ("full", "selective"):
        for key in ("loss", "grad_norm", "aux_loss"):
            got = torch.tensor([r[key] for r in runs[mode]], dtype=torch.float64)
            want = torch.tensor([r[key] for r in ref], dtype=torch.float64)
            torch.testing.assert_close(got, want, rtol=1e-6, atol=0.0, msg=lambda m: f"{mode} {key}: {m}")
        if recipe.startswith("deepseek"):  # the routing counts, not only the losses
            assert [r["moe/layer1/tokens_per_expert"] for r in runs[mode]] == \
                [r["moe/layer1/tokens_per_expert"] for r in ref]


@pytest.mark.slow
def test_compiled_selective_checkpointing_follows_eager(tiny_cfg, rows):
    """train.compile with checkpointing: no graph break (the MoE routing statistics, a side effect
    inside the checkpointed region, are recorded once, not replayed in backward), the eager run's
    losses (rtol 1e-4, as tests/train/test_train_compile.py), the same routing counts."""
    args = [*RUN, "train.max_steps=4", *MOE["deepseek/tiny"]]
    eager = rows(train(tiny_cfg(*args, "train.run_name=eager", recipe="deepseek/tiny"))["run_dir"])
    torch._dynamo.reset()
    counters.clear()
    compiled = rows(train(tiny_cfg(*args, "train.run_name=compiled", "train.compile=true",
                                   "train.activation_checkpointing=selective", recipe="deepseek/tiny"))["run_dir"])
    assert not counters["graph_break"], dict(counters["graph_break"])
    for key in ("loss", "aux_loss"):
        torch.testing.assert_close(torch.tensor([r[key] for r in compiled], dtype=torch.float64),
                                   torch.tensor([r[key] for r in eager], dtype=torch.float64), rtol=1e-4, atol=0.0)
    assert all(sum(r["moe/layer1/tokens_per_expert"]) == r["moe/layer1/tokens"] * 3 for r in compiled)


def test_unknown_mode_is_refused_naming_the_valid_ones(tiny_cfg):
    with pytest.raises(RecipeError, match=r"train.activation_checkpointing='partial': must be one of: none, full, "
                                          "selective"):
        tiny_cfg("train.activation_checkpointing=partial")
