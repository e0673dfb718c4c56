"""Checkpoints: atomic folders, manifest verification, fallback, safe loading."""

import json
import os

import pytest
import torch

import archlab
from archlab import checkpoints
from archlab.io import write_json_atomic
from archlab.train import checkpoint as ckpt
from archlab.train.checkpoint import CheckpointError


def _save(run, step, model, keep_last=3, cfg=None):
    tmp = ckpt.begin(run, step)
    ckpt.save_model_weights(model, tmp / ckpt.WEIGHTS)
    write_json_atomic(tmp / ckpt.STATE, {"step": step, "tokens": step * 10})
    if cfg is not None:
        ckpt.save_recipe(cfg, tmp / ckpt.RECIPE)
    return ckpt.finish(run, step, keep_last)


@pytest.fixture
def run_with_model(tmp_path, root):
    cfg = archlab.load_recipe(root / "recipes/dense/tiny.yaml",  # tied embeddings
                              ["model.n_layers=1", "model.d_model=32", "model.vocab_size=300", "model.n_heads=2"])
    run = tmp_path / "run"
    run.mkdir()
    (run / ckpt.RUN_MARKER).write_text("{}")
    return run, archlab.build_model(cfg), cfg


def test_save_is_atomic_and_prunes(run_with_model):
    run, model, cfg = run_with_model
    for step in (1, 2, 3, 4):
        _save(run, step, model, keep_last=2, cfg=cfg)
    assert [p.name for p in ckpt.checkpoints(run)] == ["step_00000003", "step_00000004"]
    assert not list((run / ckpt.CKPT_DIR).glob("*.tmp"))
    # a crash mid-save leaves only a .tmp folder, which nothing reads
    half = ckpt.begin(run, 5)
    (half / ckpt.WEIGHTS).write_bytes(b"partial")
    assert ckpt.latest(run).name == "step_00000004"
    manifest = ckpt.verify(ckpt.latest(run))
    assert set(manifest["files"]) == {ckpt.WEIGHTS, ckpt.STATE, ckpt.RECIPE}


def test_prune_spares_the_checkpoints_at_keep_steps(run_with_model):
    """train.ckpt_steps (WSD branch points) are never pruned and do not count toward keep_last."""
    run, model, _ = run_with_model
    for step in (2, 4, 6, 8, 10):
        tmp = ckpt.begin(run, step)
        ckpt.save_model_weights(model, tmp / ckpt.WEIGHTS)
        ckpt.finish(run, step, keep_last=1, keep_steps=[2, 6])
    assert [p.name for p in ckpt.checkpoints(run)] == ["step_00000002", "step_00000006", "step_00000010"]
    ckpt.prune(run, keep_last=1)  # without the exemption only the newest stays
    assert [p.name for p in ckpt.checkpoints(run)] == ["step_00000010"]


def test_weights_roundtrip_with_tied_embeddings(run_with_model):
    run, model, cfg = run_with_model
    path = _save(run, 7, model, cfg=cfg)
    loaded, cfg2 = ckpt.load_model(run)
    assert cfg2.model == cfg.model
    assert loaded.lm_head.weight is loaded.embed.weight  # tying survives
    for (n, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=n)
    loaded2, _ = ckpt.load_model(path)  # a checkpoint folder works too
    assert torch.equal(loaded2.embed.weight, model.embed.weight)


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_corrupt_checkpoint_named_and_skipped(run_with_model, damage):
    run, model, cfg = run_with_model
    good = _save(run, 1, model, cfg=cfg)
    bad = _save(run, 2, model, cfg=cfg)
    f = bad / ckpt.WEIGHTS
    data = f.read_bytes()
    if damage == "truncate":
        f.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        f.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    else:
        f.unlink()
    with pytest.raises(CheckpointError, match="model.safetensors"):
        ckpt.verify(bad)
    with pytest.raises(CheckpointError, match="model.safetensors"):
        ckpt.load_model(bad)
    found, problems = ckpt.latest_valid(run)
    assert found == good and len(problems) == 1 and "step_00000002" in problems[0]
    assert ckpt.latest(run) == good


def test_wrong_kind_of_folder(tmp_path):
    (tmp_path / "notarun").mkdir()
    with pytest.raises(CheckpointError, match="not an archlab run folder"):
        ckpt.load_model(tmp_path / "notarun")
    with pytest.raises(CheckpointError, match="no such run folder"):
        ckpt.load_model(tmp_path / "missing")


class _RunsCode:
    """Unpickling this object runs code (what a malicious checkpoint would do)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_pickled_code_is_never_executed(tmp_path):
    marker = tmp_path / "pwned"
    evil = tmp_path / "optimizer.pt"
    torch.save({"state": {}, "param_groups": [], "x": _RunsCode(marker)}, evil)
    with pytest.raises(CheckpointError, match="optimizer.pt"):
        ckpt.load_optimizer_state(tmp_path)
    assert not marker.exists()
    # control: an unrestricted torch.load would have run it
    torch.load(evil, weights_only=False)
    assert marker.exists()


def test_rng_roundtrip(tmp_path):
    import random

    torch.manual_seed(3)
    random.seed(4)
    ckpt.save_rng(tmp_path, rank=0)
    expected = (torch.rand(3), random.random())
    torch.manual_seed(99)
    random.seed(99)
    assert ckpt.load_rng(tmp_path, 0)
    assert torch.equal(torch.rand(3), expected[0]) and random.random() == expected[1]
    assert not ckpt.load_rng(tmp_path, 1)  # no file for that rank


def test_manifest_lists_sizes_and_hashes(run_with_model):
    run, model, cfg = run_with_model
    path = _save(run, 3, model, cfg=cfg)
    manifest = json.loads((path / ckpt.MANIFEST).read_text())
    assert manifest["step"] == 3
    assert manifest["files"][ckpt.WEIGHTS]["bytes"] == (path / ckpt.WEIGHTS).stat().st_size
    assert len(manifest["files"][ckpt.WEIGHTS]["sha256"]) == 64


def test_metrics_log_without_trackers(tmp_path):
    """metrics.jsonl is the record; without trackers (the default) nothing else is written."""
    from archlab.train.run_folder import MetricsLog, read_jsonl

    log = MetricsLog(tmp_path)
    log.write({"kind": "train", "step": 1, "loss": 2.5})
    log.close()
    log.close()  # idempotent
    assert read_jsonl(tmp_path / "metrics.jsonl") == [{"kind": "train", "step": 1, "loss": 2.5}]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]


def test_ranks_hash_disjoint_shares_that_make_the_manifest(run_with_model):
    """Each of W ranks hashes a share of the files (largest first, to the least loaded rank): the
    shares are disjoint, cover every file, and give the manifest one process writes; finish trusts
    them (an entry it is handed is written as is) and hashes what it is not handed."""
    run, model, cfg = run_with_model
    tmp = ckpt.begin(run, 5)
    ckpt.save_model_weights(model, tmp / ckpt.WEIGHTS)
    for r, size in enumerate((3000, 1000, 900, 10)):
        (tmp / f"rng_rank{r}.pt").write_bytes(bytes([r]) * size)
    (tmp / "zero").mkdir()
    (tmp / "zero" / "part.pt").write_bytes(b"z" * 2500)
    shares = [ckpt.hash_share(tmp, r, 2) for r in range(2)]
    assert not shares[0].keys() & shares[1].keys()
    assert shares[0].keys() | shares[1].keys() == set(checkpoints._files_under(tmp))
    assert ckpt.WEIGHTS in shares[0] and "rng_rank0.pt" in shares[1]  # the two largest on different ranks
    merged = {**shares[0], **shares[1]}
    handed = {**merged, "zero/part.pt": {"bytes": 2500, "sha256": "0" * 64}}
    del handed["rng_rank3.pt"]
    final = ckpt.finish(run, 5, keep_last=3, hashes=handed)
    files = json.loads((final / ckpt.MANIFEST).read_text())["files"]
    assert files["zero/part.pt"]["sha256"] == "0" * 64  # taken as handed
    assert files["rng_rank3.pt"] == checkpoints._entry(final / "rng_rank3.pt")  # hashed by finish
    assert {k: v for k, v in files.items() if k != "zero/part.pt"} == {
        k: v for k, v in ckpt.hash_share(final, 0, 1).items() if k != "zero/part.pt"}  # one process: same entries
    with pytest.raises(CheckpointError, match="part.pt: corrupt"):
        ckpt.verify(final)
