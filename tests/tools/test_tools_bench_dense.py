"""tools.bench_dense runs end to end on a toy shape (its timings are not asserted): one row per
model with its ratios, ceiling and fraction of peak, and its table."""

from tools import bench_dense
from tools.bench_harness import ARCHLAB, LOGITS, Case


def test_bench_reports_ratios_ceiling_and_peak_fractions():
    case = Case("t", "recipes/llama/tiny.yaml", ("model.n_layers=1", "model.vocab_size=300"), batch=2, seq_len=16)
    rows = bench_dense.run([case], rounds=2, steps=1, log=lambda _: None)
    assert [r["runner"] for r in rows] == [ARCHLAB, LOGITS, "LlamaForCausalLM"]
    for r in rows:
        assert r["mode"] == "eager" and r["step_ms"] > 0 and r["matmul_ms"] > 0 and r["ceiling_ratio"] > 0
        assert 0 < r["peak_fraction"] and r["useful_flops"] == r["flops_per_step"] > 0  # dense: equal work
        lo, hi = r["archlab_speedup_range"]
        assert lo <= r["archlab_speedup"] <= hi
    assert rows[0]["archlab_speedup"] == 1.0  # archlab against itself
    lines = bench_dense.format_table(rows).splitlines()
    assert lines[2].startswith("t ") and "ceiling ratio" in lines[0]
