"""tools.gpu_check: without CUDA it refuses in one line with status 2 (unless --dry-run); its pure parts
(peak override, kernel names, grouped-GEMM cell, timed rows, memory plan, the report, the trainer's
command) and the CPU dry run, which really runs the trainer per recipe and reads its run folders."""

import json
import os
import subprocess
import sys
import time

import pytest
import torch

import archlab
from archlab.costs.plan import Launch, memory_plan
from tools import gpu_check

GIB = 2.0**30


def test_gpu_check_peak_override_cli_then_env_then_the_trainers_table():
    env = {"ARCHLAB_PEAK_FLOPS": "1e12"}
    assert gpu_check.peak_override(5e14, env) == 5e14
    assert gpu_check.peak_override(None, env) == 1e12
    assert gpu_check.peak_override(None, {}) is None  # the trainer's per-device table decides
    with pytest.raises(ValueError, match="ARCHLAB_PEAK_FLOPS"):
        gpu_check.peak_override(None, {"ARCHLAB_PEAK_FLOPS": "fast"})
    with pytest.raises(ValueError, match="positive"):
        gpu_check.peak_override(-1.0, {})


def test_gpu_check_sdpa_kernels_from_profiler_op_names():
    ops = ["aten::mm", "aten::_scaled_dot_product_efficient_attention", "aten::scaled_dot_product_attention",
           "aten::_scaled_dot_product_efficient_attention_backward", "aten::_scaled_dot_product_flash_attention"]
    assert gpu_check.sdpa_kernels(ops) == ["flash", "efficient"]
    assert gpu_check.sdpa_kernels(["aten::_scaled_dot_product_flash_attention_for_cpu_backward"]) == ["flash"]
    assert gpu_check.sdpa_kernels(["aten::_scaled_dot_product_attention_math"]) == ["math"]
    assert gpu_check.sdpa_kernels(["aten::_scaled_dot_product_cudnn_attention"]) == ["cudnn"]
    assert gpu_check.sdpa_kernels(["aten::mm"]) == []


def test_gpu_check_attention_kernels_from_cuda_kernel_names():
    names = ["void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128>>(Flash_fwd_params)",
             "fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel)",
             "cudnn_generated_fort_native_sdpa_sm90_knob_7", "sm90_xmma_gemm_bf16bf16_bf16f32"]
    assert gpu_check.cuda_attention_kernels(names) == ["flash", "efficient", "cudnn"]
    assert gpu_check.cuda_attention_kernels(["ampere_bf16_s16816gemm", "cudnn::gemm"]) == []


def test_gpu_check_grouped_gemm_cell():
    assert gpu_check.grouped_gemm(False, {"aten::_grouped_mm": 3}, {}) == "-"
    assert gpu_check.grouped_gemm(True, {"aten::_grouped_mm": 24, "aten::bmm": 2}, {}) == "yes (24 calls)"
    assert gpu_check.grouped_gemm(True, {"archlab::grouped_mm": 6}, {}) == "yes (6 calls)"
    assert gpu_check.grouped_gemm(True, {"archlab::grouped_mm": 6, "aten::_grouped_mm": 6}, {}) == "yes (6 calls)"
    cuda = gpu_check.grouped_gemm(True, {"aten::_grouped_mm": 4}, {"cutlass_grouped_gemm_sm90": 4, "gemm": 9})
    assert cuda == "yes (4 calls, 4 grouped kernels)"
    assert gpu_check.grouped_gemm(True, {"aten::bmm": 12}, {"gemm": 3}) == "no: padded bmm (12 calls)"


def test_gpu_check_throughput_over_the_timed_rows_only():
    rows = [{"kind": "train", "step": s, "tokens_per_s": t} for s, t in [(5, 1.0), (10, 100.0), (15, 300.0), (16, 9.0)]]
    rows.append({"kind": "val", "step": 15, "loss": 1.0})
    timed = gpu_check.timed_rows(rows, warmup=5, steps=10)
    assert [r["step"] for r in timed] == [10, 15]  # not the warmup row, nor the profiled step's
    assert gpu_check.throughput(timed, 5) == pytest.approx(150.0)  # 2 windows of equal tokens: 1 / mean(1 / t)
    with pytest.raises(ValueError, match="multiple of --log-every"):
        gpu_check.throughput([], 5)


def test_gpu_check_memory_plan_is_the_cost_models_plan_of_the_runs_launch():
    cfg = archlab.load_recipe(gpu_check.ROOT / "recipes/mixtral/tiny.yaml")
    one = gpu_check.planned_memory(cfg, 4, 64, mixed=True, device="cuda")
    assert one.regime == "autocast"
    assert one.peak == memory_plan(cfg, Launch(), precision="bf16", batch=4, seq_len=64, device="cuda").peak
    assert gpu_check.planned_memory(cfg, 4, 64, mixed=False, device="cpu").regime == "fp32"
    ep2 = gpu_check.planned_memory(cfg, 4, 64, mixed=True, device="cuda", ep=2)
    assert ep2.regime == "deepspeed bf16"  # the expert-parallel launch: DeepSpeed's bf16 engine
    ep1 = gpu_check.planned_memory(cfg, 4, 64, mixed=True, device="cuda", ep=1)
    assert ep1.regime == "deepspeed bf16" and ep2.weights < ep1.weights  # each rank holds half of the experts
    assert gpu_check.memory_cell(None, GIB) == "n/a / 1.00"
    assert gpu_check.memory_cell(1.5 * GIB, GIB) == "1.50 / 1.00 (1.50x)"


def _row(**kw):
    row = {"recipe": "dense-125m", "mode": "eager", "params": 125.3e6, "active": 125.3e6, "batch": 8, "seq_len": 2048,
           "timed_steps": 20, "max_steps": 26, "tokens_per_s": 204800.0, "mfu": 0.171, "peak_mem": 12 * GIB,
           "plan_mem": 10 * GIB, "sdpa": "flash (kernels: flash)", "grouped": "-"}
    return {**row, **kw}


def test_gpu_check_report_tables():
    rows = [_row(), _row(mode="compiled", tokens_per_s=250000.0),
            {"recipe": "mixtral-320m", "mode": "eager", "error": "exit 1: RuntimeError: boom | bang"}]
    text = gpu_check.format_report("**title**", rows, [], "1 GPU visible", ["a note"])
    lines = text.splitlines()
    assert lines[0] == "**title**" and "- a note" in lines
    assert lines[-1] == "**Expert-parallel scaling**: skipped: 1 GPU visible"
    table = [line for line in lines if line.startswith("|")]
    assert len(table) == 5 and set(table[1]) <= {"|", "-"}
    assert all(line.count("|") == len(gpu_check.COLUMNS) + 1 for line in table)  # the error's "|" is escaped
    cells = [c.strip() for c in table[2].strip("|").split("|")]
    assert cells == ["dense-125m", "eager", "125.3M / 125.3M", "8 x 2048", "20 of 26", "204,800", "17.1%",
                     "12.00 / 10.00 (1.20x)", "flash (kernels: flash)", "-"]
    assert "failed: exit 1: RuntimeError: boom / bang" in table[4]

    ep = [_row(recipe="deepseek-320m", ep=1, tokens_per_s=100000.0, grouped="yes (4 calls)", backend="zero0",
               ops={}),
          _row(recipe="deepseek-320m", ep=2, tokens_per_s=180000.0, grouped="yes (4 calls)", backend="expert-zero0",
               ops={gpu_check.ALL_TO_ALL_OP: 44}),
          {"recipe": "deepseek-320m", "mode": "eager", "ep": 4, "error": "skipped: over the --time-budget-s"}]
    text = gpu_check.format_report("**title**", rows, ep, None)
    ep_table = [line for line in text.split("**Expert-parallel scaling**")[1].splitlines() if line.startswith("|")]
    assert len(ep_table) == 5 and all(line.count("|") == len(gpu_check.EP_COLUMNS) + 1 for line in ep_table)
    assert [c.strip() for c in ep_table[3].strip("|").split("|")][1:8] == ["2", "expert-zero0", "8 x 2048", "180,000",
                                                                           "90,000", "0.90", "44"]


def test_gpu_check_the_trainers_command_and_overrides(tmp_path):
    plan = gpu_check.Plan(tmp_path, 8, 2048, warmup=5, steps=20, log_every=5, peak=989e12, device="cuda",
                          timeout_s=60)
    case = gpu_check.CASES[1]
    over = plan.overrides(case, "mixtral-320m-compiled", compiled=True)
    assert over[:len(case.overrides)] == list(case.overrides)
    for item in ["train.compile=true", "train.max_steps=26", "train.log_every=5", "train.micro_batch_size=8",
                 "train.seq_len=2048", f"train.out_dir={tmp_path}", "train.run_name=mixtral-320m-compiled",
                 "train.peak_flops=989000000000000.0", "data.tokenizer=byte"]:
        assert item in over
    cfg = archlab.load_recipe(gpu_check.ROOT / case.recipe, over)  # a valid recipe, ~320M parameters
    assert 125e6 < archlab.costs.param_counts(archlab.model_config(cfg)).total < 350e6
    one = gpu_check.trainer_command(case, over)
    assert one[1:4] == ["-m", "tools.gpu_check.probe", case.recipe] and one[-1] == "--no-checkpoint"
    four = gpu_check.trainer_command(case, [*over, "model.moe.ep_size=4"], processes=4)
    assert gpu_check.trainer_command(case, over, processes=1)[1:6] == ["-m", "accelerate.commands.launch",
                                                                       "--config_file", gpu_check.EP_LAUNCH,
                                                                       "--num_processes"]
    assert four[1:7] == ["-m", "accelerate.commands.launch", "--config_file", gpu_check.EP_LAUNCH,
                         "--num_processes", "4"]
    assert four[7:9] == ["-m", "tools.gpu_check.probe"] and "model.moe.ep_size=4" in four


def test_gpu_check_run_command_status_output_and_timeout():
    status, out = gpu_check.run_command([sys.executable, "-c", "import sys; print('hi'); sys.exit(3)"], 60)
    assert (status, out) == (3, "hi\n")
    # past the limit the whole process group goes, the child's own child included
    script = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); " \
             "print('started', flush=True); time.sleep(60)"
    t0 = time.perf_counter()
    status, out = gpu_check.run_command([sys.executable, "-c", script], 3)
    assert status is None and out == "started\n" and time.perf_counter() - t0 < 30


def test_gpu_check_cases_are_a_dense_a_mixtral_and_a_fine_grained_moe_of_125m_to_350m():
    kinds = []
    for case in gpu_check.CASES:
        cfg = archlab.load_recipe(gpu_check.ROOT / case.recipe, list(case.overrides))
        assert 125e6 <= archlab.costs.param_counts(archlab.model_config(cfg)).total <= 350e6, case.label
        kinds.append(None if cfg.model.moe is None else (cfg.model.moe.num_experts, cfg.model.moe.top_k))
    assert kinds == [None, (8, 2), (64, 6)] and gpu_check.CASES[gpu_check.EP_CASE].label.startswith("deepseek")


def test_gpu_check_args_and_ep_skip_reasons():
    dry = gpu_check.parse_args(["--dry-run"])
    assert (dry.warmup, dry.steps, dry.log_every, dry.modes) == (1, 2, 1, ["eager", "compiled"])
    gpu = gpu_check.parse_args([])
    assert (gpu.warmup, gpu.steps, gpu.log_every, gpu.ep_sizes) == (5, 20, 5, [1, 2, 4, 8])
    with pytest.raises(ValueError, match="--only dense-1b: no such case"):
        gpu_check.parse_args(["--only", "dense-125m", "dense-1b"])
    with pytest.raises(ValueError, match="multiples of --log-every"):
        gpu_check.parse_args(["--steps", "12", "--log-every", "5"])
    assert dry.ep_sizes == [] and "dry run" in gpu_check.ep_skip_reason(True, 0, dry.ep_sizes)
    assert gpu_check.ep_skip_reason(True, 0, [1, 2]) is None  # the dry run over gloo, when asked
    assert gpu_check.ep_skip_reason(False, 1, [1, 2]) == "1 GPU visible; ep 2/4/8 needs as many GPUs"
    assert gpu_check.ep_skip_reason(False, 8, [1, 2, 4, 8]) is None


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


@pytest.mark.slow
def test_gpu_check_dry_run_trains_each_tiny_recipe_through_the_trainer(tmp_path, monkeypatch):
    """The dry run's eager half: a row per tiny recipe, each from a real trainer run whose folder holds
    the requested steps, the profiled step's ops, and no checkpoint; n/a where CUDA-only."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    args = gpu_check.parse_args(["--dry-run", "--modes", "eager", "--runs-dir", str(tmp_path), "--peak-flops", "1e12"])
    status, report, rows = gpu_check.run(args, log=lambda m: None)
    assert status == 0, report
    table = [line for line in report.splitlines() if line.startswith("| ") and "tiny" in line]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in table]
    assert [c[:2] for c in cells] == [["dense-tiny", "eager"], ["mixtral-tiny", "eager"], ["deepseek-tiny", "eager"]]
    for c in cells:
        assert c[3] == "4 x 64" and c[4] == "2 of 4" and float(c[5].replace(",", "")) > 0
        assert c[6].endswith("%") and c[7].startswith("n/a / ") and c[8] == "flash"  # CPU: SDPA's flash kernel
    assert cells[0][9] == "-" and cells[1][9].startswith("yes (") and cells[2][9].startswith("yes (")
    assert report.splitlines()[-1].startswith("**Expert-parallel scaling**: skipped: CPU dry run")
    for row in rows:
        run = tmp_path / os.listdir(tmp_path)[0] / f"{row['recipe']}-eager"
        assert row["run"] == str(run)
        steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()
                 if json.loads(line).get("kind") == "train"]
        assert steps == [1, 2, 3, 4]  # warmup 1 + 2 timed + the profiled step, a row each
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["last_checkpoint"] is None
        probe = json.loads((run / gpu_check.PROBE).read_text())
        assert probe["step"] == 4 and probe["ops"].get("aten::mm", 0) + probe["ops"].get("aten::addmm", 0) > 0
        assert not (run / "checkpoints").exists()
        assert json.loads((run / "env.json").read_text())["peak_flops"] == 1e12


@pytest.mark.slow
def test_gpu_check_dry_run_expert_parallel_scaling_over_gloo(tmp_path, monkeypatch):
    """--ep-sizes in the dry run: the DeepSeek-style tiny recipe launched by accelerate in 2 processes
    (DeepSpeed stage 0, model.moe.ep_size=2): the expert-parallel backend ran and exchanged tokens."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    args = gpu_check.parse_args(["--dry-run", "--modes", "eager", "--only", "none", "--ep-sizes", "2",
                                 "--runs-dir", str(tmp_path)])
    status, report, rows = gpu_check.run(args, log=lambda m: None)
    assert status == 0, report
    (row,) = rows
    assert row["ep"] == 2 and row["world_size"] == 2 and row["backend"] == "expert-zero0"
    assert row["ops"][gpu_check.ALL_TO_ALL_OP] > 0 and row["grouped"].startswith("yes (")
    table = [line for line in report.split("**Expert-parallel scaling**")[1].splitlines() if line.startswith("| ")]
    assert [c.strip() for c in table[1].strip("|").split("|")][:3] == ["deepseek-tiny", "2", "expert-zero0"]
    assert json.loads((tmp_path / os.listdir(tmp_path)[0] / "deepseek-tiny-ep2" / "env.json").read_text())[
        "world_size"] == 2
