"""tools.bench_router_trace: traced and untraced steps interleaved in one process. The timings are
printed, never asserted (the machine is shared); the test checks what was measured."""

import torch

from tools.bench_router_trace import measure, report

TINY = ["model.vocab_size=384", "model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.n_kv_heads=1",
        "model.max_seq_len=64", "train.seq_len=32", "train.micro_batch_size=4", "train.warmup_steps=1",
        "train.eval_batches=1", "train.eval_context_multipliers=[1]", "data.max_bytes=120000",
        "model.moe.num_experts=4", "model.moe.expert_hidden=16"]


def test_bench_router_trace_interleaves_traced_and_untraced_steps(tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the tool's default: a tiny model on a shared CPU
    try:
        r = measure("recipes/mixtral/tiny.yaml", TINY + [f"data.cache_dir={tmp_path / 'cache'}"], pairs=3, warmup=1,
                    out_dir=str(tmp_path / "runs"))
    finally:
        torch.set_num_threads(threads)
    print("\n" + report(r))
    assert len(r["on_s"]) == len(r["off_s"]) == 3
    assert r["traced_steps_written"] == 3 + 1  # the timed and the warm-up pairs' traced steps, nothing else
    assert r["median_ratio"] > 0 and r["sum_ratio"] > 0 and r["trace_host_s_median"] > 0
    assert (r["layers"], r["num_experts"], r["top_k"], r["tokens_per_traced_step"]) == (2, 4, 2, 64)
