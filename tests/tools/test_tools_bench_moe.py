"""tools.bench_moe runs end to end on tiny shapes (a smoke test: no timing is asserted) and refuses
bad input with a clear message."""

import subprocess
import sys

import pytest


def _run(root, *args):
    return subprocess.run([sys.executable, "-m", "tools.bench_moe", *args], cwd=root, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow
def test_bench_moe_runs_every_path_on_tiny_shapes(root):
    r = _run(root, "--rounds", "1", "--steps", "1", "--batch", "1", "--seq-len", "16", "--d-model", "64",
             "--routing", "uniform")
    assert r.returncode == 0, r.stderr[-2000:]
    for label in ("mixtral-layer", "deepseek-layer", "mixtral-tiny-step", "HF MixtralSparseMoeBlock",
                  "DeepSpeed MoE", "MixtralForCausalLM", "GEMM peak", "learned/uniform"):
        assert label in r.stdout, r.stdout
    routing = r.stdout.split("archlab routing:")[1].splitlines()
    for case in ("mixtral-layer", "deepseek-layer", "mixtral-tiny-step"):
        (row,) = [line for line in routing if line.startswith(case)]
        if case != "deepseek-layer":  # 16 x 6 slots over 64 experts cannot be exactly equal
            assert row.endswith("/ 0.00"), row


def test_bench_moe_rejects_unknown_case_and_bad_rounds(root):
    r = _run(root, "--cases", "nope", "--rounds", "1")
    assert r.returncode == 2 and "unknown MoE case" in r.stderr and "Traceback" not in r.stderr
    r = _run(root, "--rounds", "0")
    assert r.returncode == 2 and "--rounds" in r.stderr
