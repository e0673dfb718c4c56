"""``python -m tools.bench``: bad options exit 2 with a message; ``--suite moe`` runs the MoE suite
with this run's options (forced uniform routing too)."""

import torch

from tools import bench


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
