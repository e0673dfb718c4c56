"""``python -m tools.bench`` runs end to end on a toy shape (its timings are not asserted)."""

from tools import bench


def test_bench_reports_ratios_and_peak_fractions():
    case = bench.Case("t", "recipes/llama/tiny.yaml", ("model.n_layers=1", "model.vocab_size=300"), batch=2, seq_len=16)
    (row,) = bench.run([case], rounds=1, steps=1, log=lambda _: None)
    assert row["hf_class"] == "LlamaForCausalLM" and row["tokens_per_step"] == 32
    assert row["ratio_median"] > 0 and row["archlab_peak_fraction"] > 0 and row["hf_peak_fraction"] > 0
    assert bench.format_table([row]).splitlines()[2].startswith("t ")


def test_flop_count_equals_both_models():
    """Same architecture, same shapes: archlab and HF do the same matmul work per step."""
    ours, theirs = bench.build_pair(bench.Case("t", "recipes/dense/tiny.yaml", ("model.n_layers=1",), 2, 16))
    assert ours.flops_per_step() == theirs.flops_per_step() > 0


def test_unknown_case_exits_2(capsys):
    assert bench.main(["--cases", "nope"]) == 2
    assert "unknown case" in capsys.readouterr().err
