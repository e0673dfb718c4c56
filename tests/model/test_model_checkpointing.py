"""Activation checkpointing of the decoder's blocks (``none | full | selective``): the same loss
and gradients as without (fp32), routing statistics recorded once per forward, the matmuls a
mode runs again in backward, inference untouched, unknown modes refused."""

from __future__ import annotations

import pytest
import torch

import archlab
from archlab.config import model_config
from archlab.costs import forward_flops
from archlab.costs.measure import measured_flops, training_loss
from archlab.model.decoder import Decoder

MODES = ("none", "full", "selective")
# dropout everywhere (RNG replayed by the recomputation), jitter, ALiBi's math attention (bmm kept),
# MoE: capacity dropping, groups + aux-free bias + shared experts
CASES = {
    "dense/tiny": ["model.dropout=0.1", "model.ffn.dropout=0.1"],
    "dense/tiny-alibi": ["model.attention.dropout=0.1"],
    "llama/tiny": ["model.attention.qk_norm=true"],
    "mixtral/tiny": ["model.moe.router.jitter=0.1", "model.moe.capacity_factor=1.0"],
    "deepseek/tiny": ["model.moe.balance.bias_update_rate=0.01"],
    "deepseek/v3-tiny": ["model.attention.dropout=0.1"],  # MLA, its math attention with dropout
}


def _build(name: str, overrides=()):
    cfg = archlab.load_recipe(f"recipes/{name}.yaml", ["model.n_layers=2", *CASES.get(name, []), *overrides])
    torch.manual_seed(0)
    return cfg, archlab.build_model(cfg).train()


def _loss_and_grads(model, x_BS1, mode: str):
    model.checkpointing = mode
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)  # the same dropout masks and jitter in every mode
    loss = training_loss(model, x_BS1)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("name", list(CASES))
def test_checkpointing_gives_the_same_loss_and_gradients(name):
    cfg, model = _build(name)
    x = torch.randint(0, cfg.model.vocab_size, (2, 33))
    ref_loss, ref_grads = _loss_and_grads(model, x, "none")
    for mode in ("full", "selective"):
        loss, grads = _loss_and_grads(model, x, mode)
        torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=0.0)
        for n, g in grads.items():
            torch.testing.assert_close(g, ref_grads[n], rtol=1e-6, atol=1e-8, msg=lambda m: f"{mode} {n}: {m}")


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_routing_statistics_are_recorded_once_per_forward(mode):
    """backward runs the blocks' forward again: that one must not count its tokens a second time."""
    cfg, model = _build("deepseek/tiny")
    x = torch.randint(0, cfg.model.vocab_size, (2, 33))
    windows = {}
    for m in ("none", mode):
        _loss_and_grads(model, x, m)
        layers = [b.ffn for b in model.blocks if b.is_moe]
        windows[m] = [(layer.stats.window.clone(), layer.stats.take_step_counts()) for layer in layers]
        for layer in layers:
            layer.stats.window.zero_()
    assert windows[mode][0][0][cfg.model.moe.num_experts] == 2 * 32  # tokens of one forward (after the E counts)
    for (w, c), (w_ref, c_ref) in zip(windows[mode], windows["none"]):
        torch.testing.assert_close(w, w_ref)
        torch.testing.assert_close(c, c_ref)
    assert all(layer.record_stats for layer in model.modules() if hasattr(layer, "record_stats"))


@pytest.mark.parametrize("name", ["dense/tiny", "mixtral/tiny"])
def test_selective_runs_no_matmul_twice_and_full_runs_the_blocks_again(name):
    """Counted by FlopCounterMode over forward + backward. Full recomputation stops once the last
    tensor backward needs is back (torch's early stop): a dense block's FFN down projection, whose
    output nothing saves, is not run again; an MoE block's experts are (the gate-weighted sum keeps
    their outputs)."""
    # dropless: with a capacity the experts' FLOPs depend on how many slots the routing drops
    # (tests/costs/test_costs_flops.py counts those); the formula below is the dropless one
    cfg, model = _build(name, ["model.dropout=0.0", "model.ffn.dropout=0.0", "model.moe.capacity_factor=null"]
                        if name.startswith("mixtral") else ["model.dropout=0.0", "model.ffn.dropout=0.0"])
    B, S = 1, 16
    x = torch.randint(0, cfg.model.vocab_size, (B, S + 1))
    flops = {}
    for mode in MODES:
        model.checkpointing = mode
        torch.manual_seed(1)  # the same router jitter, so the same routing (dropped slots cost no FLOPs)
        flops[mode] = measured_flops(model, x)["total"]
    fwd = forward_flops(cfg, S)
    blocks = (fwd.total - fwd.lm_head) * B * S  # one more forward of every block
    assert flops["selective"] == flops["none"]
    m = cfg.model
    down = 0 if m.moe is not None else 2 * m.d_model * model_config(m).ffn_hidden
    assert flops["full"] == pytest.approx(flops["none"] + blocks - down * m.n_layers * B * S, rel=1e-9)


def test_inference_and_the_kv_cache_are_untouched():
    cfg, model = _build("llama/tiny")
    model.eval()
    ids = torch.randint(0, cfg.model.vocab_size, (2, 12))
    ref = model(ids).logits
    model.checkpointing = "full"
    torch.testing.assert_close(model(ids).logits, ref, rtol=0, atol=0)
    cache = model.new_kv_cache()  # a cache never goes through the checkpointed path (grad mode or not)
    first = model(ids[:, :8], kv_cache=cache).logits
    rest = model(ids[:, 8:], kv_cache=cache).logits
    torch.testing.assert_close(torch.cat([first, rest], dim=1), ref, rtol=1e-5, atol=1e-5)


def test_unknown_mode_is_refused_naming_the_valid_ones():
    cfg, model = _build("dense/tiny")
    with pytest.raises(ValueError, match="'partial': must be one of none, full, selective"):
        model.checkpointing = "partial"
    assert model.checkpointing == "none"
    with pytest.raises(ValueError, match="none, full, selective"):
        Decoder(archlab.model_config(cfg), checkpointing="every")
