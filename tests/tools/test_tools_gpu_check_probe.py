"""tools.gpu_check.probe: the trainer's own run with one step profiled (op names to the run folder), and
no checkpoint when asked."""

import json
from types import SimpleNamespace

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from tools.gpu_check import ROOT, probe


def test_probe_profile_names_counts_cpu_ops():
    a = torch.randn(8, 8)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.mm(a, a)
        torch.mm(a, a)
    ops, kernels = probe.profile_names(prof)
    assert ops["aten::mm"] == 2 and kernels == {}


def test_probe_profiles_only_its_step_and_stops_when_the_run_ends_inside_it(tmp_path):
    trainer = SimpleNamespace(step=0, device=torch.device("cpu"), run_dir=tmp_path,
                              info=SimpleNamespace(rank=0, world_size=1, is_main=True))
    cb = probe.KernelProbe(step=2)
    cb.before_step(trainer)
    assert cb.prof is None  # step 1 is not profiled
    cb.after_step(trainer, {})
    trainer.step = 1
    cb.before_step(trainer)
    assert cb.prof is not None
    cb.on_end(trainer, "failed")  # stopped inside the step: the profiler is closed, nothing written
    assert cb.prof is None and cb.result is None and not (tmp_path / probe.PROBE).exists()


@pytest.mark.slow
def test_probe_runs_the_trainer_and_records_the_profiled_step(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    status = probe.main([str(ROOT / "recipes/mixtral/tiny.yaml"),
                         "data.tokenizer=byte", f"data.cache_dir={tmp_path / 'cache'}", f"train.out_dir={tmp_path}",
                         "train.run_name=probe", "train.max_steps=3", "train.log_every=1", "train.micro_batch_size=2",
                         "train.seq_len=32", "train.eval_batches=1", "train.eval_context_multipliers=[1]",
                         "--probe-step", "2", "--no-checkpoint"])
    assert status == 0
    run = tmp_path / "probe"
    record = json.loads((run / probe.PROBE).read_text())
    assert record["step"] == 2 and record["world_size"] == 1 and record["kernels"] == {}
    assert record["ops"]["aten::_grouped_mm"] > 0  # the experts of the trainer's model, one thread: grouped_mm
    assert any(op.startswith("aten::_scaled_dot_product_flash_attention") for op in record["ops"])
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["step"] == 3 and summary["last_checkpoint"] is None
    assert not (run / "checkpoints").exists()
    assert "completed" in capsys.readouterr().err


def test_probe_bad_recipe_exits_2(tmp_path, capsys):
    assert probe.main([str(tmp_path / "nope.yaml")]) == 2
    assert capsys.readouterr().err.startswith("error: ")
