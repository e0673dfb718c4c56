"""The trainer through the objective registry: a checkpoint written before the registry existed resumes
bit-identically; multi-token prediction trains, logs its loss apart and resumes exactly; masked LM and span
corruption train, report their own validation metrics and resume exactly."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from archlab.train import train

FIXTURE = Path(__file__).parent / "fixtures" / "checkpoint_v1"
# the run that wrote the fixture: llama-tiny shrunk, byte tokens of 200 kB of the standard library, fp32
FIXTURE_RUN = [
    "model.d_model=32", "model.n_layers=1", "model.n_heads=2", "model.n_kv_heads=1", "model.vocab_size=260",
    "data.tokenizer=byte", "data.max_bytes=200000", "train.seq_len=32", "train.micro_batch_size=2",
    "train.max_steps=6", "train.warmup_steps=2", "train.ckpt_steps=[3]", "train.ckpt_every=100",
    "train.eval_every=100", "train.log_every=1", "train.eval_batches=2", "train.eval_context_multipliers=[1]",
    "train.precision=fp32",
]


def test_a_checkpoint_written_before_the_objective_registry_resumes_bit_identically(tmp_path, data_cache, root, rows):
    import archlab

    run = tmp_path / "runs" / "r"  # the run folder as it was: its marker and the checkpoint at step 3
    shutil.copytree(FIXTURE / "step_00000003", run / "checkpoints" / "step_00000003")
    shutil.copy(FIXTURE / "run.json", run / "run.json")
    cfg = archlab.load_recipe(root / "recipes/llama/tiny.yaml", [
        *FIXTURE_RUN, f"data.cache_dir={data_cache}", f"train.out_dir={tmp_path / 'runs'}", "train.run_name=r",
        "train.resume=auto"])
    summary = train(cfg)
    assert summary["status"] == "completed" and summary["step"] == 6
    expected = json.loads((FIXTURE / "expected.json").read_text())["rows"]
    got = rows(summary["run_dir"]) + [r for r in rows(summary["run_dir"], "val") if r.get("final")]
    assert [(r["kind"], r["step"]) for r in got] == [(r["kind"], r["step"]) for r in expected]
    for mine, theirs in zip(got, expected):  # equal to the last bit: loss, gradient norm, lr
        assert {k: mine[k] for k in theirs} == theirs


def test_mtp_trains_logs_its_loss_apart_and_resumes_exactly(tiny_cfg, rows):
    mtp = ("model.mtp_depth=1", "train.objective=mtp", "train.ckpt_every=100", "train.ckpt_steps=[4]",
           "train.eval_context_multipliers=[1]")
    full = train(tiny_cfg(*mtp, "train.run_name=full", recipe="deepseek/tiny"))
    train_rows = rows(full["run_dir"])
    assert all(r["mtp_loss"] > 0 and r["loss"] > 0 for r in train_rows)
    # the reported loss is the main model's next-token loss: it falls, and the MTP modules' one with it
    assert train_rows[-1]["loss"] < train_rows[0]["loss"] and train_rows[-1]["mtp_loss"] < train_rows[0]["mtp_loss"]
    assert "mtp_loss" not in rows(full["run_dir"], "val")[-1]  # validation: the main model only
    # a new run from the full run's checkpoint at step 4 repeats its steps 5..8 exactly
    resumed = train(tiny_cfg(*mtp, "train.run_name=again",
                             f"train.resume={full['run_dir']}/checkpoints/step_00000004", recipe="deepseek/tiny"))
    again = [r for r in rows(resumed["run_dir"]) if r["step"] > 4]
    assert [r["step"] for r in again] == [5, 6, 7, 8]
    for a, b in zip(train_rows[4:], again):
        assert (a["step"], a["loss"], a["mtp_loss"], a["grad_norm"]) == (b["step"], b["loss"], b["mtp_loss"],
                                                                         b["grad_norm"])


def test_mlm_trains_an_encoder_reports_masked_metrics_and_resumes_exactly(tiny_cfg, rows):
    mlm = ("train.ckpt_every=100", "train.ckpt_steps=[4]", "train.eval_context_multipliers=[1]",
           "model.n_heads=2")
    full = train(tiny_cfg(*mlm, "train.run_name=full", recipe="bert/tiny"))
    assert full["status"] == "completed"
    train_rows = rows(full["run_dir"])
    assert train_rows[-1]["loss"] < train_rows[0]["loss"]  # the masked-token loss falls
    val = rows(full["run_dir"], "val")
    assert val and all(r["metric"] == "mlm" and "loss" not in r for r in val)
    assert all(0.0 <= r["mlm_accuracy"] <= 1.0 and r["mlm_loss"] > 0 and 0 < r["eval_tokens"] for r in val)
    assert full["final_val_loss"] == {} and set(full["final_val_mlm_loss"]) == {"32"}
    # a new run from the checkpoint at step 4 repeats steps 5..8 exactly (the same masks drawn)
    resumed = train(tiny_cfg(*mlm, "train.run_name=again",
                             f"train.resume={full['run_dir']}/checkpoints/step_00000004", recipe="bert/tiny"))
    again = [r for r in rows(resumed["run_dir"]) if r["step"] > 4]
    assert [r["step"] for r in again] == [5, 6, 7, 8]
    for a, b in zip(train_rows[4:], again):
        assert (a["step"], a["loss"], a["grad_norm"]) == (b["step"], b["loss"], b["grad_norm"])
    final = [r for r in rows(resumed["run_dir"], "val") if r.get("final")]
    assert final[0]["mlm_loss"] == [r for r in val if r.get("final")][0]["mlm_loss"]


def test_span_corruption_trains_an_encoder_decoder_reports_span_metrics_and_resumes_exactly(tiny_cfg, rows):
    t5 = ("train.ckpt_every=100", "train.ckpt_steps=[4]", "train.eval_context_multipliers=[1]", "model.n_heads=2")
    full = train(tiny_cfg(*t5, "train.run_name=full", recipe="t5/tiny"))
    assert full["status"] == "completed"
    train_rows = rows(full["run_dir"])
    assert train_rows[-1]["loss"] < train_rows[0]["loss"]  # the span loss falls
    val = rows(full["run_dir"], "val")
    assert val and all(r["metric"] == "span_corruption" and "loss" not in r for r in val)
    assert all(0.0 <= r["span_accuracy"] <= 1.0 and r["span_loss"] > 0 for r in val)
    assert full["final_val_loss"] == {} and set(full["final_val_span_loss"]) == {"32"}
    # a new run from the checkpoint at step 4 repeats steps 5..8 exactly (the same spans drawn)
    resumed = train(tiny_cfg(*t5, "train.run_name=again",
                             f"train.resume={full['run_dir']}/checkpoints/step_00000004", recipe="t5/tiny"))
    again = [r for r in rows(resumed["run_dir"]) if r["step"] > 4]
    assert [r["step"] for r in again] == [5, 6, 7, 8]
    for a, b in zip(train_rows[4:], again):
        assert (a["step"], a["loss"], a["grad_norm"]) == (b["step"], b["loss"], b["grad_norm"])
