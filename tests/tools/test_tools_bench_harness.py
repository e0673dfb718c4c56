"""tools.bench_harness: the peers compute the same loss as archlab from the same weights, the
matmul recorder counts what the step multiplies, a compiled runner wraps its model."""

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import archlab
from tools import bench_harness as harness
from tools.bench_dense import CASES
from tools.nanogpt import from_archlab


def _runners(case: str, batch: int = 2, seq_len: int = 32, **kw) -> dict[str, harness.Runner]:
    c = CASES[case]
    case = harness.Case(c.name, c.recipe, c.overrides, batch, seq_len)
    return {r.label: r for r in harness.build_runners(case, **kw)}


def test_the_gpt_peers_compute_archlabs_loss_from_its_weights_with_the_same_matmul_work():
    """gpt-small (d256, 4 layers, vocab 8192) at a small batch: archlab (fused loss), archlab on
    logits, HF GPT-2 and the nanoGPT-style GPT: equal losses and gradients of the shared weights;
    the same matmul FLOPs (archlab's fused loss does its LM-head products in chunks)."""
    runners = _runners("gpt-small")
    assert list(runners) == [harness.ARCHLAB, harness.LOGITS, "GPT2LMHeadModel", harness.NANOGPT]
    losses = {label: r.loss() for label, r in runners.items()}
    for label, loss in losses.items():
        torch.testing.assert_close(loss, losses[harness.ARCHLAB], msg=label)
    ours, nano = runners[harness.ARCHLAB].model, runners[harness.NANOGPT].model
    losses[harness.ARCHLAB].backward()
    losses[harness.NANOGPT].backward()
    torch.testing.assert_close(nano.transformer.h[2].attn.c_attn.weight.grad, ours.blocks[2].attn.wqkv.weight.grad)
    torch.testing.assert_close(nano.lm_head.weight.grad, ours.lm_head.weight.grad)  # tied: embedding + head
    flops = {label: r.record_matmuls().flops for label, r in runners.items()}
    assert len(set(flops.values())) == 1, flops


def test_mixtral_case_is_archlabs_lm_loss_against_hfs_with_both_balancing_losses():
    runners = _runners("mixtral-small", seq_len=16)
    assert list(runners) == [harness.ARCHLAB, harness.LOGITS, "MixtralForCausalLM"]
    ours, hf = runners[harness.ARCHLAB], runners["MixtralForCausalLM"]
    assert ours.model.cfg.moe.expert_hidden == 512 and ours.model.cfg.moe.num_experts == 8
    out = ours.model(ours.inputs, targets=ours.targets)
    hf_out = hf.model(input_ids=hf.inputs, labels=hf.targets, shift_labels=hf.targets)
    assert hf_out.aux_loss is not None and out.aux_loss > 0  # both train their routers
    torch.testing.assert_close(hf_out.loss - hf.model.config.router_aux_loss_coef * hf_out.aux_loss, out.loss)
    torch.testing.assert_close(ours.loss(), out.loss + out.aux_loss)


def test_recorded_matmul_flops_equal_flop_counter_mode_and_replay_takes_time():
    """The recorder's FLOPs (flash SDPA kernels included) equal FlopCounterMode's count of the same
    step with SDPA on its math backend, for a model whose products FlopCounterMode all knows."""
    runner = _runners("llama-small", seq_len=16)[harness.LOGITS]
    recorded = runner.record_matmuls()
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        runner.loss().backward()
    assert recorded.flops == counter.get_total_flops() > 0
    names = {c.func._overloadpacket.__name__ for c in recorded.calls}
    assert {"mm", "_scaled_dot_product_flash_attention_for_cpu",
            "_scaled_dot_product_flash_attention_for_cpu_backward"} <= names
    assert sum(c.count for c in recorded.calls if c.func._overloadpacket.__name__ == "mm") > len(recorded.calls) / 2
    assert recorded.time() > 0


def test_recorder_keeps_private_copies_and_counts_in_place_products():
    a, b = torch.randn(4, 3), torch.randn(3, 5)
    acc = torch.zeros(4, 5)

    def step():
        acc.addmm_(a, b)
        acc.addmm_(a, b)
        torch.mm(a, b)

    recorded = harness.record_matmuls(step)
    calls = {c.func._overloadpacket.__name__: c for c in recorded.calls}
    assert calls["addmm_"].count == 2 and calls["mm"].count == 1
    assert recorded.flops == 3 * 2 * 4 * 3 * 5
    assert calls["addmm_"].args[0] is not acc and calls["addmm_"].args[0].shape == acc.shape
    before = acc.clone()
    recorded.time()
    torch.testing.assert_close(acc, before)  # the replay writes into its own copies


def test_nanogpt_style_gpt_refuses_what_nanogpt_cannot_express():
    cfg = archlab.load_recipe(harness.ROOT / "recipes/llama/tiny.yaml", ["model.n_layers=1"])
    with pytest.raises(ValueError, match="norm.type = layernorm"):
        from_archlab(archlab.build_model(cfg))


def test_compiled_runner_wraps_the_model_and_bad_mode_is_refused():
    case = harness.Case("t", "recipes/dense/tiny.yaml", ("model.n_layers=1",), 2, 8)
    (runner,) = [r for r in harness.build_runners(case, modes=("compiled",)) if r.label == harness.ARCHLAB]
    assert runner.mode == "compiled" and runner.module is not runner.model
    assert runner.module._orig_mod is runner.model
    with pytest.raises(ValueError, match="mode 'fast' unknown"):
        harness.Runner("x", runner.model, harness.archlab_loss, runner.ids_BS, mode="fast")
