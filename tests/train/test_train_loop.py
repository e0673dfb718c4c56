"""The training loop in one process: run folder, resume exactness, signals, non-finite numbers."""

import json
import math
import signal
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import archlab
from archlab import checkpoints
from archlab.config import RecipeError
from archlab.data import DataError, prepare_data
from archlab.train import NonFiniteError, Trainer, train
from archlab.train import checkpoint as ckpt
from archlab.train.dist import DistInfo, process_group_timeout
from archlab.train.loop import count_shard_share


def _signal_after(monkeypatch, step: int, sig=signal.SIGINT):
    """Deliver a real signal to this process right after optimizer step ``step`` is computed."""
    original = Trainer.train_step

    def train_step(self):
        out = original(self)
        if self.step + 1 == step:
            signal.raise_signal(sig)
        return out

    monkeypatch.setattr(Trainer, "train_step", train_step)


def _nan_loss_at(monkeypatch, step: int):
    original = Trainer._forward_loss

    def forward_loss(self, x, micro=0):
        loss = original(self, x, micro)
        if self.step + 1 == step:
            loss.main = loss.main * float("nan")
            loss.total = loss.main + loss.aux
        return loss

    monkeypatch.setattr(Trainer, "_forward_loss", forward_loss)


class _NanGrad(torch.autograd.Function):
    """Identity forward (finite loss), NaN gradient backward."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * float("nan")


def _nan_grad_at(monkeypatch, step: int):
    original = Trainer._forward_loss

    def forward_loss(self, x, micro=0):
        loss = original(self, x, micro)
        if self.step + 1 == step:
            loss.main = _NanGrad.apply(loss.main)
            loss.total = loss.main + loss.aux
        return loss

    monkeypatch.setattr(Trainer, "_forward_loss", forward_loss)


def _all_checkpoint_weights_finite(run_dir) -> bool:
    return all(torch.isfinite(t).all() for c in ckpt.checkpoints(run_dir)
               for t in load_file(c / ckpt.WEIGHTS).values())


def test_run_folder_contents(tiny_cfg, rows):
    summary = train(tiny_cfg("model.position.type=learned", "model.max_seq_len=32"))
    run = Path(summary["run_dir"])
    assert summary["status"] == "completed" and summary["step"] == 8
    for name in ("run.json", "recipe.yaml", "env.json", "tokenizer.json", "metrics.jsonl", "summary.json", "loss.png"):
        assert (run / name).is_file(), name
    env = json.loads((run / "env.json").read_text())
    for key in ("archlab_version", "git_commit", "versions", "device", "world_size", "peak_flops", "flops_per_token"):
        assert key in env, key
    assert env["world_size"] == 1
    assert env["versions"]["torch"].split("+")[0] == torch.__version__.split("+")[0]
    train_rows = rows(run)
    assert [r["step"] for r in train_rows] == list(range(1, 9))
    r = train_rows[-1]
    for key in ("tokens", "loss", "lr", "grad_norm", "tokens_per_s", "flops_per_token", "mfu", "elapsed_s"):
        assert key in r and math.isfinite(r[key]), key
    assert r["tokens"] == 8 * 4 * 32
    assert r["mfu"] == pytest.approx(r["tokens_per_s"] * r["flops_per_token"] / env["peak_flops"])
    val = rows(run, "val")
    assert [v["step"] for v in val if not v.get("final")] == [4]
    final = {v["context_multiplier"]: v for v in val if v.get("final")}
    assert "loss" in final[1] and "learned positions" in final[2]["skipped"]  # no extrapolation past the table
    assert [c.name for c in ckpt.checkpoints(run)] == ["step_00000004", "step_00000008"]  # keep_last=2
    assert json.loads((run / "summary.json").read_text())["final_val_loss"]["32"] == final[1]["loss"]


def test_rope_evaluates_longer_contexts(tiny_cfg, rows):
    summary = train(tiny_cfg("train.max_steps=2", "train.eval_context_multipliers=[1,2,4]", "train.ckpt_every=100"))
    final = [v for v in rows(summary["run_dir"], "val") if v.get("final")]
    assert [v["context_len"] for v in final] == [32, 64, 128] and all("loss" in v for v in final)


def test_resume_after_signal_is_exact(tiny_cfg, rows, monkeypatch):
    """An interrupted-and-resumed run repeats the uninterrupted one exactly: data order, dropout
    RNG, lr schedule and AdamW state all restored (dropout and accumulation on to make it count)."""
    common = ("model.dropout=0.1", "train.grad_accum=2", "train.ckpt_every=100")
    full = train(tiny_cfg(*common, "train.run_name=full"))
    found = signal.getsignal(signal.SIGINT)  # default_int_handler, or SIG_IGN in a background shell
    with monkeypatch.context() as m:
        _signal_after(m, 3)
        part = train(tiny_cfg(*common, "train.run_name=part"))
    assert part["status"] == "interrupted" and part["step"] == 3
    assert ckpt.latest(part["run_dir"]).name == "step_00000003"
    assert signal.getsignal(signal.SIGINT) is found  # the handler found before the run restored
    resumed = train(tiny_cfg(*common, "train.run_name=part", "train.resume=auto"))
    assert resumed["status"] == "completed" and resumed["step"] == 8
    a, b = rows(full["run_dir"]), rows(resumed["run_dir"])
    assert [r["step"] for r in b] == list(range(1, 9))  # rows after the checkpoint are not duplicated
    for x, y in zip(a, b):
        assert (x["loss"], x["grad_norm"], x["lr"], x["tokens"]) == (y["loss"], y["grad_norm"], y["lr"], y["tokens"])
    full_w = load_file(ckpt.latest(full["run_dir"]) / ckpt.WEIGHTS)
    res_w = load_file(ckpt.latest(resumed["run_dir"]) / ckpt.WEIGHTS)
    assert all(torch.equal(full_w[k], res_w[k]) for k in full_w)


def test_sigterm_also_stops_cleanly(tiny_cfg, monkeypatch):
    _signal_after(monkeypatch, 3, signal.SIGTERM)
    summary = train(tiny_cfg())
    assert summary["status"] == "interrupted" and summary["step"] == 3
    assert ckpt.verify(ckpt.latest(summary["run_dir"]))["step"] == 3


@pytest.mark.parametrize("inject", [_nan_loss_at, _nan_grad_at])
def test_nonfinite_stops_and_keeps_last_good_checkpoint(tiny_cfg, monkeypatch, inject):
    inject(monkeypatch, 6)
    cfg = tiny_cfg()
    with pytest.raises(NonFiniteError, match="step 6") as info:
        train(cfg)
    run = Path(cfg.train.out_dir) / "run"
    assert "step_00000004" in str(info.value)
    assert [c.name for c in ckpt.checkpoints(run)] == ["step_00000004"]
    assert _all_checkpoint_weights_finite(run)
    assert json.loads((run / "summary.json").read_text())["status"] == "nonfinite"


def test_nonfinite_skip_drops_the_batch(tiny_cfg, rows, monkeypatch):
    _nan_loss_at(monkeypatch, 3)
    summary = train(tiny_cfg("train.on_nonfinite=skip"))
    assert summary["status"] == "completed"
    skips = rows(summary["run_dir"], "skip")
    assert [s["step"] for s in skips] == [3]
    assert 3 not in [r["step"] for r in rows(summary["run_dir"])]
    assert _all_checkpoint_weights_finite(summary["run_dir"])


def test_resume_auto_falls_back_past_a_corrupt_checkpoint(tiny_cfg, capsys):
    first = train(tiny_cfg("train.max_steps=8"))
    newest = ckpt.latest(first["run_dir"])
    assert newest.name == "step_00000008"
    w = newest / ckpt.WEIGHTS
    w.write_bytes(w.read_bytes()[:100])  # truncated
    capsys.readouterr()
    with pytest.raises(ckpt.CheckpointError, match="step_00000008/model.safetensors"):
        train(tiny_cfg("train.max_steps=8", f"train.resume={newest}"))
    resumed = train(tiny_cfg("train.max_steps=8", "train.resume=auto"))
    err = capsys.readouterr().err
    assert "step_00000008/model.safetensors" in err and "falling back" in err
    assert "resuming from" in err and "step_00000004" in err
    assert resumed["status"] == "completed" and resumed["step"] == 8


def test_crafted_pickle_in_checkpoint_is_refused(tiny_cfg, tmp_path):
    first = train(tiny_cfg("train.max_steps=4", "train.eval_context_multipliers=[1]"))
    c = ckpt.latest(first["run_dir"])
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            import os
            return (os.system, (f"touch {marker}",))

    torch.save({"state": Evil(), "param_groups": []}, c / ckpt.OPTIMIZER)
    # the attacker also rewrites the manifest, so only the safe loader stands in the way
    files = {n: {"bytes": (c / n).stat().st_size, "sha256": checkpoints._sha256(c / n)}
             for n in checkpoints._files_under(c)}
    checkpoints.write_json_atomic(c / ckpt.MANIFEST, {"step": 4, "files": files})
    with pytest.raises(ckpt.CheckpointError, match="optimizer.pt"):
        train(tiny_cfg("train.max_steps=6", "train.resume=auto", "train.resume_allow_changes=true"))
    assert not marker.exists()


def test_bad_inputs(tiny_cfg, tmp_path):
    train(tiny_cfg("train.max_steps=2", "train.ckpt_every=100"))
    with pytest.raises(RecipeError, match="already holds a run"):
        train(tiny_cfg("train.max_steps=2"))
    (tmp_path / "plain").mkdir()
    with pytest.raises(ckpt.CheckpointError, match="not an archlab run folder"):
        train(tiny_cfg(f"train.resume={tmp_path / 'plain'}"))
    with pytest.raises(RecipeError, match="no such checkpoint"):
        train(tiny_cfg(f"train.resume={tmp_path / 'nothing'}"))


def test_deepspeed_config_must_agree_with_recipe(tiny_cfg):
    from types import SimpleNamespace

    from archlab.train.parallel import fill_deepspeed_config

    def acc(conf):
        return SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=SimpleNamespace(deepspeed_config=conf)))

    t = tiny_cfg("train.grad_accum=3", "train.grad_clip=0.5").train
    conf = fill_deepspeed_config(acc({"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 2}}),
                                 t, world_size=2)
    assert (conf["train_micro_batch_size_per_gpu"], conf["gradient_accumulation_steps"], conf["train_batch_size"],
            conf["gradient_clipping"]) == (4, 3, 24, 0.5)
    with pytest.raises(RecipeError, match="train_micro_batch_size_per_gpu=8 contradicts the recipe"):
        fill_deepspeed_config(acc({"train_micro_batch_size_per_gpu": 8}), t, 1)
    with pytest.raises(RecipeError, match="optimizer"):
        fill_deepspeed_config(acc({"optimizer": {"type": "Adam"}}), t, 1)


def test_zero3_config_filled_and_refusals(tiny_cfg):
    """ZeRO-3: "auto" bucket sizes and persistence threshold from model.d_model; MoE (expert
    parallelism included) and train.compile refused at stage 3 only; stage 4 refused."""
    from types import SimpleNamespace

    from archlab.train.parallel import check_zero_stage, fill_deepspeed_config

    def acc(conf):
        return SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=SimpleNamespace(deepspeed_config=conf)))

    cfg = tiny_cfg()
    zero = {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
            "stage3_param_persistence_threshold": "auto", "stage3_max_live_parameters": 7}
    conf = fill_deepspeed_config(acc({"zero_optimization": zero}), cfg.train, 2, d_model=32)
    assert conf["zero_optimization"] == {"stage": 3, "reduce_bucket_size": 1024, "stage3_prefetch_bucket_size": 921,
                                         "stage3_param_persistence_threshold": 320, "stage3_max_live_parameters": 7}
    with pytest.raises(RecipeError, match="stage=4"):
        fill_deepspeed_config(acc({"zero_optimization": {"stage": 4}}), cfg.train, 1)
    check_zero_stage(3, cfg)  # dense: trained at stage 3
    moe = tiny_cfg(recipe="mixtral/tiny")
    check_zero_stage(2, moe)
    with pytest.raises(RecipeError, match=r"^model\.moe under DeepSpeed ZeRO stage 3: .*zero2\.yaml"):
        check_zero_stage(3, moe)
    with pytest.raises(RecipeError, match=r"^model\.moe \(with model\.moe\.ep_size=2\) under DeepSpeed ZeRO stage 3"):
        check_zero_stage(3, tiny_cfg("model.moe.ep_size=2", recipe="mixtral/tiny"))
    with pytest.raises(RecipeError, match="train.compile=true under DeepSpeed ZeRO stage 3"):
        check_zero_stage(3, tiny_cfg("train.compile=true"))


def test_cli_prints_one_line_and_exits_2(tmp_path, root, capsys):
    from archlab.train.__main__ import main

    assert main([str(tmp_path / "missing.yaml")]) == 2
    err = capsys.readouterr().err
    assert "recipe file not found" in err and len(err.strip().splitlines()) == 1
    assert main([str(root / "recipes/llama/tiny.yaml"), "train.lr=-1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: train.lr=-1") and len(err.strip().splitlines()) == 1


def test_cooldown_branch_continues_its_stable_trunk_exactly(tiny_cfg, rows, monkeypatch):
    """WSD cooldown branches: a constant-lr trunk to step 8 with a checkpoint at step 4
    (train.ckpt_steps, spared by keep_last=1), and a branch from that checkpoint decaying over 2
    steps, interrupted at step 5 and resumed, repeat exactly one uninterrupted run with the branch's
    schedule: same losses, lrs, grad norms, tokens and final weights (dropout and accumulation on)."""
    common = ("model.dropout=0.1", "train.grad_accum=2", "train.ckpt_every=100", "train.keep_last=1",
              "train.eval_context_multipliers=[1]")
    cooldown = ("train.schedule=wsd", "train.max_steps=6", "train.decay_steps=2", "train.decay_shape=sqrt")
    full = train(tiny_cfg(*common, *cooldown, "train.run_name=full"))
    trunk = train(tiny_cfg(*common, "train.schedule=constant", "train.ckpt_steps=[4]", "train.run_name=trunk"))
    assert trunk["role"] == "stable" and full["role"] == "full" and full["branch_from"] is None
    assert [c.name for c in ckpt.checkpoints(trunk["run_dir"])] == ["step_00000004", "step_00000008"]
    source = Path(trunk["run_dir"]) / "checkpoints" / "step_00000004"
    branch_cfg = (*common, *cooldown, f"train.branch_from={source}", "train.run_name=branch")
    with monkeypatch.context() as m:
        _signal_after(m, 5)
        part = train(tiny_cfg(*branch_cfg))
    assert part["status"] == "interrupted" and part["step"] == 5
    branch = train(tiny_cfg(*branch_cfg, "train.resume=auto"))
    assert branch["status"] == "completed" and branch["step"] == 6
    a, b = rows(full["run_dir"]), rows(branch["run_dir"])
    assert [r["step"] for r in b] == list(range(1, 7))  # the trunk's rows up to step 4, then the branch's
    for x, y in zip(a, b):
        assert (x["loss"], x["grad_norm"], x["lr"], x["tokens"]) == (y["loss"], y["grad_norm"], y["lr"], y["tokens"])
    assert b[-1]["lr"] < b[-2]["lr"] == b[-3]["lr"]  # decaying after the branch step
    full_w = load_file(ckpt.latest(full["run_dir"]) / ckpt.WEIGHTS)
    branch_w = load_file(ckpt.latest(branch["run_dir"]) / ckpt.WEIGHTS)
    assert all(torch.equal(full_w[k], branch_w[k]) for k in full_w)
    assert branch["final_val_loss"] == full["final_val_loss"]
    assert [v["step"] for v in rows(branch["run_dir"], "val")] == [4, 6]  # not the trunk's end-of-run rows
    # D counts the trunk's tokens: the branch stands for a 6-step run
    assert branch["tokens"] == full["tokens"] == 6 * 2 * 4 * 32
    assert (branch["role"], branch["branch_from"], branch["branch_step"]) == ("cooldown", str(source), 4)
    env = json.loads((Path(branch["run_dir"]) / "env.json").read_text())
    assert (env["branch_from"], env["branch_step"]) == (str(source), 4)
    assert [c.name for c in ckpt.checkpoints(trunk["run_dir"])][0] == "step_00000004"  # the trunk is untouched


def test_branch_refusals_and_warnings(tiny_cfg, capsys):
    from archlab.train.run_folder import resolve_run

    common = ("train.max_steps=4", "train.ckpt_every=100", "train.eval_context_multipliers=[1]")
    trunk = train(tiny_cfg(*common, "train.schedule=constant", "train.run_name=trunk"))
    source = ckpt.latest(trunk["run_dir"])
    ok = ("train.schedule=wsd", "train.max_steps=6", "train.decay_steps=2", f"train.branch_from={source}")
    run, found, notes = resolve_run(tiny_cfg(*ok, "train.run_name=b"))
    assert (run.name, found, notes) == ("b", source, [])
    with pytest.raises(RecipeError, match=r"model recipe differs from this run's \(model.n_layers: checkpoint 2, "
                                          r"branch 1\)"):
        train(tiny_cfg(*ok, "model.n_layers=1", "train.run_name=b"))
    with pytest.raises(RecipeError, match="train.resume=.* contradicts train.branch_from"):
        tiny_cfg(*ok, f"train.resume={source}")
    with pytest.raises(RecipeError, match="resume=auto needs train.run_name"):
        resolve_run(tiny_cfg(*ok, "train.resume=auto", "train.run_name=null"))
    with pytest.raises(ckpt.CheckpointError, match="train.branch_from=.*not a checkpoint folder of an archlab run"):
        resolve_run(tiny_cfg(*ok[:3], f"train.branch_from={trunk['run_dir']}", "train.run_name=b"))
    with pytest.raises(ckpt.CheckpointError, match="train.branch_from=.*step_00000002.*no such checkpoint folder"):
        resolve_run(tiny_cfg(*ok[:3], f"train.branch_from={source.with_name('step_00000002')}", "train.run_name=b"))
    with pytest.raises(RecipeError, match="already holds a run"):
        resolve_run(tiny_cfg(*ok, "train.run_name=trunk"))
    with pytest.raises(RecipeError, match="was started as a run of its own"):
        resolve_run(tiny_cfg(*ok, "train.run_name=trunk", "train.resume=auto"))
    _, _, notes = resolve_run(tiny_cfg(*ok, "train.run_name=b", "train.seed=1", "train.lr=1e-2"))
    assert "train.seed: checkpoint 0, branch 1" in notes[0] and "data stream" in notes[0]
    assert "learning rate differs from the checkpoint's run at step 0" in notes[1]


def _folder_bytes(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


def test_resume_with_changed_train_settings_is_refused_listing_each(tiny_cfg, rows, capsys):
    """Issue 37: a resume with train.max_steps changed (200 -> 80) was accepted silently and changed the
    cosine schedule mid-run. Now each differing train setting is listed (old -> new) and nothing in the
    run folder is touched; train.resume_allow_changes=true continues and the run records what changed."""
    first = train(tiny_cfg("train.max_steps=8"))
    run = Path(first["run_dir"])
    before = _folder_bytes(run)
    with pytest.raises(RecipeError) as err:
        train(tiny_cfg("train.max_steps=12", "train.lr=0.002", "train.micro_batch_size=2", "train.resume=auto"))
    msg = str(err.value)
    assert msg.startswith("train.resume='auto': this run's train settings differ") and "\n" not in msg
    for part in ("train.max_steps 8 -> 12", "train.lr 0.003 -> 0.002", "global batch", "4 -> 2",
                 "train.resume_allow_changes=true", str(run / "checkpoints" / "step_00000008")):
        assert part in msg, (part, msg)
    assert "train.micro_batch_size" not in msg.split("(")[1].split(";")[0]  # named as the global batch
    assert _folder_bytes(run) == before  # the refusal loses nothing already written

    # where it logs and how often it evaluates may change, and so may the split of the same global batch
    capsys.readouterr()
    again = train(tiny_cfg("train.max_steps=8", "train.eval_every=2", "train.micro_batch_size=2",
                           "train.grad_accum=2", "train.resume=auto"))
    assert again["status"] == "completed" and again["resume_changes"] == []
    assert not (run / "resume_changes.jsonl").exists()

    resumed = train(tiny_cfg("train.max_steps=12", "train.lr=0.002", "train.resume=auto",
                             "train.resume_allow_changes=true"))
    assert resumed["status"] == "completed" and resumed["step"] == 12
    assert "continuing with changed train settings: train.lr 0.003 -> 0.002; train.max_steps 8 -> 12" \
        in capsys.readouterr().err
    changes = [{"key": "train.lr", "checkpoint": 0.003, "run": 0.002},
               {"key": "train.max_steps", "checkpoint": 8, "run": 12}]
    record = [json.loads(line) for line in (run / "resume_changes.jsonl").read_text().splitlines()]
    assert [(r["step"], r["changes"]) for r in record] == [(8, changes)]
    assert record[0]["checkpoint"].endswith("step_00000008")
    assert [(r["step"], r["changes"]) for r in resumed["resume_changes"]] == [(8, changes)]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resume_changes"] == resumed["resume_changes"]
    assert json.loads((run / "env.json").read_text())["resume_changes"] == changes
    assert [r["step"] for r in rows(run)] == list(range(1, 13))


def test_resume_allow_changes_only_where_a_run_resumes(tiny_cfg):
    with pytest.raises(RecipeError, match=r"^train\.resume_allow_changes=True: only used when train\.resume is auto "
                                          r"or a checkpoint .*; this recipe has train\.resume=none$"):
        tiny_cfg("train.resume_allow_changes=true", "train.resume=none")


def test_dist_timeout_s_is_the_process_group_timeout(tiny_cfg):
    """train.dist_timeout_s: seconds as a timedelta for the process group (null: torch's default);
    zero or negative refused by name with what it is for."""
    assert process_group_timeout(tiny_cfg().train) is None
    assert process_group_timeout(tiny_cfg("train.dist_timeout_s=7200").train) == timedelta(hours=2)
    with pytest.raises(RecipeError, match=r"^train\.dist_timeout_s=0\.0: must be a positive number of seconds"):
        process_group_timeout(tiny_cfg("train.dist_timeout_s=0").train)


def test_ranks_count_their_share_of_the_token_shards_before_rank_0_prepares(tmp_path, root):
    """data.source=tokens under 2 processes: each rank counts every other shard into the id-count
    cache, so rank 0's preparation (while the others wait) counts none afresh; one process counts
    nothing beforehand; an unreadable shard is left to the preparation, which names it."""
    rng = np.random.default_rng(0)
    for i, n in enumerate((700, 90, 900, 300)):
        header = np.zeros(256, dtype=np.int32)
        header[:3] = 20240520, 1, n
        name = f"fw_val_{i:06d}.bin" if i == 3 else f"fw_train_{i:06d}.bin"
        (tmp_path / name).write_bytes(header.tobytes() + rng.integers(0, 500, n).astype(np.uint16).tobytes())
    cfg = archlab.load_recipe(root / "recipes/llama/tiny.yaml", [
        "data.source=tokens", f"data.cache_dir={tmp_path / 'cache'}", "model.vocab_size=512", "train.seq_len=16",
        f"data.train_shards={tmp_path}/fw_train_*.bin", f"data.val_shards={tmp_path}/fw_val_*.bin"])
    assert count_shard_share(cfg, DistInfo(0, 1)) == 0 and not (tmp_path / "cache").exists()
    assert [count_shard_share(cfg, DistInfo(r, 2)) for r in (0, 1)] == [2, 2]
    assert count_shard_share(cfg, DistInfo(1, 2)) == 0  # cached
    assert prepare_data(cfg).meta["id_counts"]["counted_now"] == 0
    shard = tmp_path / "fw_train_000001.bin"
    shard.write_bytes(shard.read_bytes()[:-20])  # truncated: refused by its header's count
    assert count_shard_share(cfg, DistInfo(1, 2)) == 0
    with pytest.raises(DataError, match="fw_train_000001.bin: the header says 90 tokens"):
        prepare_data(cfg)


def test_several_processes_stop_on_the_flag_their_step_reduced(tiny_cfg, monkeypatch):
    """Under several processes the stop flag travels in the step's own all-reduce (no collective of
    its own): a signal that arrives after it (here: after train_step) stops the run after the next
    step, on every rank alike. One process reads its flag after each step (step 3: the tests above)."""
    _signal_after(monkeypatch, 3)
    trainer = Trainer(tiny_cfg())
    trainer.info = DistInfo(0, 2)  # rank 0 of 2 in one process: the reduction is the identity
    try:
        summary = trainer.run()
    finally:
        trainer.close()
    assert summary["status"] == "interrupted" and summary["step"] == 4
    assert ckpt.verify(ckpt.latest(summary["run_dir"]))["step"] == 4  # rank 0 hashed its share, finish the rest
