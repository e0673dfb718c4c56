"""tools.gpu_check: without CUDA it refuses in one line with status 2; its pure parts (peak lookup,
SDPA op names, memory comparison, the markdown table) and, on CPU, the measuring code itself."""

import os
import subprocess
import sys

import pytest
import torch

from tools import gpu_check


@pytest.mark.parametrize("name, peak, key", [
    ("NVIDIA H100 80GB HBM3", 989e12, "H100"),
    ("NVIDIA H200", 989e12, "H200"),
    ("NVIDIA A100-SXM4-40GB", 312e12, "A100"),
    ("NVIDIA L4", 121e12, "L4"),
    ("NVIDIA L40S", 362e12, "L40S"),
])
def test_gpu_check_peak_from_the_trainers_table_by_device_name(name, peak, key):
    value, source = gpu_check.lookup_peak_flops(name, env={})
    assert value == peak and repr(key) in source


def test_gpu_check_peak_override_then_env_then_table_then_unknown():
    env = {"ARCHLAB_PEAK_FLOPS": "1e12"}
    assert gpu_check.lookup_peak_flops("NVIDIA H100", 5e14, env=env) == (5e14, "--peak-flops")
    assert gpu_check.lookup_peak_flops("NVIDIA H100", env=env) == (1e12, "$ARCHLAB_PEAK_FLOPS")
    value, source = gpu_check.lookup_peak_flops("Some New GPU", env={})
    assert value is None and "--peak-flops" in source
    assert gpu_check.mfu(1000.0, 1e9, None) is None
    assert gpu_check.mfu(1000.0, 1e9, 4e12) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="ARCHLAB_PEAK_FLOPS"):
        gpu_check.lookup_peak_flops("NVIDIA H100", env={"ARCHLAB_PEAK_FLOPS": "fast"})
    with pytest.raises(ValueError, match="positive"):
        gpu_check.lookup_peak_flops("NVIDIA H100", -1.0, env={})


def test_gpu_check_sdpa_kernels_from_profiler_op_names():
    ops = ["aten::mm", "aten::_scaled_dot_product_efficient_attention", "aten::scaled_dot_product_attention",
           "aten::_scaled_dot_product_efficient_attention_backward", "aten::_scaled_dot_product_flash_attention"]
    assert gpu_check.sdpa_kernels(ops) == ["flash", "efficient"]
    assert gpu_check.sdpa_kernels(["aten::_scaled_dot_product_flash_attention_for_cpu_backward"]) == ["flash"]
    assert gpu_check.sdpa_kernels(["aten::_scaled_dot_product_attention_math"]) == ["math"]
    assert gpu_check.sdpa_kernels(["aten::_scaled_dot_product_cudnn_attention"]) == ["cudnn"]
    assert gpu_check.sdpa_kernels(["aten::mm"]) == []


def test_gpu_check_memory_comparison():
    gib = 2.0**30
    check = gpu_check.compare_memory(11 * gib, 10 * gib, tolerance=0.25)
    assert check.ratio == pytest.approx(1.1) and check.within
    assert check.cell() == "11.00 / 10.00 (1.10x, ok)"
    off = gpu_check.compare_memory(14 * gib, 10 * gib, tolerance=0.25)
    assert not off.within and "off by more than 25%" in off.cell()
    assert not gpu_check.compare_memory(7 * gib, 10 * gib, tolerance=0.25).within  # under-predicted counts too
    assert gpu_check.compare_memory(None, 10 * gib, 0.25) is None
    with pytest.raises(ValueError):
        gpu_check.compare_memory(1.0, 0.0, 0.25)


def _row(**kw):
    gib = 2.0**30
    row = {"recipe": "llama-125m", "params": 124.7e6, "batch": 8, "seq_len": 2048, "step_ms": 80.0,
           "tokens_per_s": 204800.0, "mfu": 0.171, "sdpa": ["flash"], "sdpa_alone": {"flash": None, "efficient": "x"},
           "grouped_mm": "-", "states": gpu_check.compare_memory(1.6 * gib, 1.6 * gib, 0.25),
           "peak_logits": gpu_check.compare_memory(12 * gib, 9 * gib, 0.25),
           "peak_fused": gpu_check.compare_memory(8.5 * gib, 8 * gib, 0.25)}
    return {**row, **kw}


def test_gpu_check_table_is_markdown_with_one_row_per_recipe():
    text = gpu_check.format_table([_row(), {"recipe": "mixtral-s", "error": "RuntimeError: boom | bang"}],
                                  "**title**", ["a note"])
    lines = text.splitlines()
    assert lines[0] == "**title**" and lines[-1] == "- a note"
    table = [line for line in lines if line.startswith("|")]
    assert len(table) == 4 and set(table[1]) <= {"|", "-"}
    assert all(line.count("|") == len(gpu_check.COLUMNS) + 1 for line in table)  # the error's "|" is escaped
    cells = [c.strip() for c in table[2].strip("|").split("|")]
    assert cells[:7] == ["llama-125m", "124.7M", "8 x 2048", "80.0", "204,800", "17.1%", "flash"]
    assert cells[7] == "yes / no" and cells[10].endswith("(1.33x, off by more than 25%)")
    assert cells[11] == "8.50 / 8.00 (1.06x, ok)"
    assert "failed: RuntimeError: boom / bang" in table[3]


def test_gpu_check_without_cuda_exits_2_with_one_line(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: tools.gpu_check needs a CUDA GPU") and err.count("\n") == 1


def test_gpu_check_cli_without_a_visible_gpu(root):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    r = subprocess.run([sys.executable, "-m", "tools.gpu_check"], cwd=root, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().count("\n") == 0 and "needs a CUDA GPU" in r.stderr


def test_gpu_check_measures_tiny_recipes_on_cpu(capsys):
    """The same measuring code on CPU (bf16, tiny shapes): a row per recipe with throughput, the
    SDPA kernel, the grouped-expert path; no memory figures off CUDA."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        args = gpu_check.parse_args(["recipes/llama/tiny.yaml", "recipes/mixtral/tiny.yaml", "--device", "cpu",
                                     "--batch", "1", "--seq-len", "16", "--steps", "1", "--warmup", "0",
                                     "--peak-flops", "1e12"])
        rows = []
        assert gpu_check.run(args, log=rows.append) == 0
    finally:
        torch.set_num_threads(threads)
    table = [line for line in rows[0].splitlines() if line.startswith("| ") and "tiny" in line]
    assert [line.split("|")[1].strip() for line in table] == ["llama-tiny", "mixtral-tiny"]
    for line in table:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert float(cells[4].replace(",", "")) > 0 and cells[5].endswith("%")
        assert cells[6] == "flash" and cells[7] == "yes / no"  # CPU: flash kernel; no efficient kernel
        assert cells[9:] == ["n/a", "n/a", "n/a"]
    assert table[0].split("|")[9].strip() == "-"
    assert table[1].split("|")[9].strip().startswith("yes (")  # bf16 experts on grouped_mm
    assert "SDPA restricted to efficient fails" in rows[0]


def test_gpu_check_bad_recipe_exits_2(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert gpu_check.main(["recipes/nope.yaml"]) == 2
    assert "not found" in capsys.readouterr().err
