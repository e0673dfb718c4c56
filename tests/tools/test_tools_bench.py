"""``python -m tools.bench`` runs end to end on a toy shape (its timings are not asserted)."""

import torch

from tools import bench


def test_bench_reports_ratios_and_peak_fractions():
    case = bench.Case("t", "recipes/llama/tiny.yaml", ("model.n_layers=1", "model.vocab_size=300"), batch=2, seq_len=16)
    (row,) = bench.run([case], rounds=1, steps=1, log=lambda _: None)
    assert row["hf_class"] == "LlamaForCausalLM" and row["tokens_per_step"] == 32
    for tag in ("archlab", "fused", "hf"):
        assert row[f"{tag}_ratio"] > 0 and row[f"{tag}_peak_fraction"] > 0
    assert row["hf_ratio"] == 1.0
    assert bench.format_table([row]).splitlines()[2].startswith("t ")


def test_the_three_runners_compute_the_same_loss_and_matmul_work():
    """Same architecture, weights and batch: equal losses; archlab and HF do equal matmul work."""
    runners = bench.build_runners(bench.Case("t", "recipes/dense/tiny.yaml", ("model.n_layers=1",), 2, 16))
    losses = [r.loss() for r in runners]
    torch.testing.assert_close(losses[1], losses[0])
    torch.testing.assert_close(losses[2], losses[0])
    assert runners[0].flops_per_step() == runners[2].flops_per_step() > 0


def test_unknown_case_exits_2(capsys):
    assert bench.main(["--cases", "nope"]) == 2
    assert "unknown case" in capsys.readouterr().err
