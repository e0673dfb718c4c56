"""``python -m tools.bench`` runs end to end on a toy shape (its timings are not asserted), its
peers compute the same loss as archlab from the same weights, the matmul recorder counts what
the step multiplies; also its MoE suite with forced uniform routing."""

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import archlab
from tools import bench
from tools.nanogpt import from_archlab


def _runners(case: str, batch: int = 2, seq_len: int = 32, **kw) -> dict[str, bench.Runner]:
    c = bench.CASES[case]
    return {r.label: r for r in bench.build_runners(bench.Case(c.name, c.recipe, c.overrides, batch, seq_len), **kw)}


def test_bench_reports_ratios_ceiling_and_peak_fractions():
    case = bench.Case("t", "recipes/llama/tiny.yaml", ("model.n_layers=1", "model.vocab_size=300"), batch=2, seq_len=16)
    rows = bench.run([case], rounds=2, steps=1, log=lambda _: None)
    assert [r["runner"] for r in rows] == [bench.ARCHLAB, bench.LOGITS, "LlamaForCausalLM"]
    for r in rows:
        assert r["mode"] == "eager" and r["step_ms"] > 0 and r["matmul_ms"] > 0 and r["ceiling_ratio"] > 0
        assert 0 < r["peak_fraction"] and r["useful_flops"] == r["flops_per_step"] > 0  # dense: equal work
        lo, hi = r["archlab_speedup_range"]
        assert lo <= r["archlab_speedup"] <= hi
    assert rows[0]["archlab_speedup"] == 1.0  # archlab against itself
    lines = bench.format_table(rows).splitlines()
    assert lines[2].startswith("t ") and "ceiling ratio" in lines[0]


def test_the_gpt_peers_compute_archlabs_loss_from_its_weights_with_the_same_matmul_work():
    """gpt-small (d256, 4 layers, vocab 8192) at a small batch: archlab (fused loss), archlab on
    logits, HF GPT-2 and the nanoGPT-style GPT: equal losses and gradients of the shared weights;
    the same matmul FLOPs (archlab's fused loss does its LM-head products in chunks)."""
    runners = _runners("gpt-small")
    assert list(runners) == [bench.ARCHLAB, bench.LOGITS, "GPT2LMHeadModel", bench.NANOGPT]
    losses = {label: r.loss() for label, r in runners.items()}
    for label, loss in losses.items():
        torch.testing.assert_close(loss, losses[bench.ARCHLAB], msg=label)
    ours, nano = runners[bench.ARCHLAB].model, runners[bench.NANOGPT].model
    losses[bench.ARCHLAB].backward()
    losses[bench.NANOGPT].backward()
    torch.testing.assert_close(nano.transformer.h[2].attn.c_attn.weight.grad, ours.blocks[2].attn.wqkv.weight.grad)
    torch.testing.assert_close(nano.lm_head.weight.grad, ours.lm_head.weight.grad)  # tied: embedding + head
    flops = {label: r.record_matmuls().flops for label, r in runners.items()}
    assert len(set(flops.values())) == 1, flops


def test_mixtral_case_is_archlabs_lm_loss_against_hfs_with_both_balancing_losses():
    runners = _runners("mixtral-small", seq_len=16)
    assert list(runners) == [bench.ARCHLAB, bench.LOGITS, "MixtralForCausalLM"]
    ours, hf = runners[bench.ARCHLAB], runners["MixtralForCausalLM"]
    assert ours.model.cfg.moe.expert_hidden == 512 and ours.model.cfg.moe.num_experts == 8
    out = ours.model(ours.inputs, targets=ours.targets)
    hf_out = hf.model(input_ids=hf.inputs, labels=hf.targets, shift_labels=hf.targets)
    assert hf_out.aux_loss is not None and out.aux_loss > 0  # both train their routers
    torch.testing.assert_close(hf_out.loss - hf.model.config.router_aux_loss_coef * hf_out.aux_loss, out.loss)
    torch.testing.assert_close(ours.loss(), out.loss + out.aux_loss)


def test_recorded_matmul_flops_equal_flop_counter_mode_and_replay_takes_time():
    """The recorder's FLOPs (flash SDPA kernels included) equal FlopCounterMode's count of the same
    step with SDPA on its math backend, for a model whose products FlopCounterMode all knows."""
    runner = _runners("llama-small", seq_len=16)[bench.LOGITS]
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

    recorded = bench.record_matmuls(step)
    calls = {c.func._overloadpacket.__name__: c for c in recorded.calls}
    assert calls["addmm_"].count == 2 and calls["mm"].count == 1
    assert recorded.flops == 3 * 2 * 4 * 3 * 5
    assert calls["addmm_"].args[0] is not acc and calls["addmm_"].args[0].shape == acc.shape
    before = acc.clone()
    recorded.time()
    torch.testing.assert_close(acc, before)  # the replay writes into its own copies


def test_nanogpt_style_gpt_refuses_what_nanogpt_cannot_express():
    cfg = archlab.load_recipe(bench.ROOT / "recipes/llama/tiny.yaml", ["model.n_layers=1"])
    with pytest.raises(ValueError, match="norm.type = layernorm"):
        from_archlab(archlab.build_model(cfg))


def test_compiled_runner_wraps_the_model_and_bad_mode_is_refused():
    (runner,) = [r for r in bench.build_runners(bench.Case("t", "recipes/dense/tiny.yaml", ("model.n_layers=1",), 2, 8),
                                                 modes=("compiled",)) if r.label == bench.ARCHLAB]
    assert runner.mode == "compiled" and runner.module is not runner.model
    assert runner.module._orig_mod is runner.model
    with pytest.raises(ValueError, match="mode 'fast' unknown"):
        bench.Runner("x", runner.model, bench.archlab_loss, runner.ids_BS, mode="fast")


def test_unknown_case_exits_2(capsys):
    assert bench.main(["--cases", "nope"]) == 2
    assert "unknown case" in capsys.readouterr().err


def test_bench_moe_suite_with_uniform_routing_prints_learned_and_uniform_step_times(capsys):
    threads = torch.get_num_threads()
    try:
        status = bench.main(["--suite", "moe", "--routing", "uniform", "--moe-cases", "mixtral-tiny-step",
                             "--rounds", "1", "--steps", "1", "--batch", "1", "--seq-len", "16", "--threads", "1"])
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert status == 0, out
    lines = out.splitlines()
    table = lines[next(i for i, line in enumerate(lines) if line.startswith("archlab routing:")):]
    assert "learned ms" in table[1] and "uniform ms" in table[1]
    (row,) = [line for line in table if line.startswith("mixtral-tiny-step")]
    learned_ms, uniform_ms, ratio = row.split()[1:4]
    assert float(learned_ms) > 0 and float(uniform_ms) > 0 and float(ratio.rstrip("x")) > 0
    assert row.endswith("/ 0.00")  # forced: 16 tokens x top-2 over 8 experts, 4 slots each
    assert "MixtralForCausalLM" in out  # the learned-routing comparisons run in the same rounds


def test_bench_routing_options_reach_the_moe_suite_and_need_it(capsys):
    args = bench.parse_args(["--suite", "moe", "--routing", "uniform", "--moe-cases", "mixtral-layer", "--batch", "2"])
    assert bench.moe_argv(args) == ["--rounds", "5", "--threads", "2", "--routing", "uniform", "--batch", "2",
                                    "--cases", "mixtral-layer"]
    assert bench.main(["--suite", "dense", "--routing", "uniform"]) == 2
    assert "--suite moe" in capsys.readouterr().err
