"""The training backends' interface: which backend each launch gets, what each refuses and why,
the checkpoint checks each makes before resuming, and a plain-backend state that round-trips."""

from types import SimpleNamespace

import pytest
import torch
from accelerate.utils import DistributedType

import archlab
from archlab.config import RecipeError
from archlab.train import checkpoint as ckpt
from archlab.train.backends import (
    BACKENDS,
    ExpertZero0Backend,
    ExpertZeroBackend,
    Launch,
    PlainBackend,
    ZeroBackend,
    backend_class,
    select_backend,
)
from archlab.train.backends.expert import rank_optimizer_state
from archlab.train.dist import DistInfo, dist_info
from archlab.train.parallel import make_accelerator

MOE = ("model.moe.num_experts=4", "model.moe.expert_hidden=32")


def _accelerator(kind: DistributedType, stage=None):
    """A stand-in for the accelerate state the selector reads: the distributed type and, under
    DeepSpeed, the DeepSpeed config's ZeRO stage."""
    conf = {"zero_optimization": {"stage": stage}} if stage is not None else {}
    return SimpleNamespace(distributed_type=kind, state=SimpleNamespace(deepspeed_plugin=SimpleNamespace(
        deepspeed_config=conf)))


# (distributed type, ZeRO stage, world size, overrides, recipe) -> the backend's name
LAUNCHES = [
    (DistributedType.NO, None, 1, (), "llama/tiny", "plain"),
    (DistributedType.MULTI_CPU, None, 2, (), "llama/tiny", "plain"),
    (DistributedType.MULTI_GPU, None, 2, MOE, "mixtral/tiny", "plain"),
    (DistributedType.DEEPSPEED, 0, 2, (), "llama/tiny", "zero"),
    (DistributedType.DEEPSPEED, 2, 2, MOE, "mixtral/tiny", "zero"),  # experts whole on every rank
    (DistributedType.DEEPSPEED, 3, 2, (), "llama/tiny", "zero"),
    (DistributedType.DEEPSPEED, 0, 2, (*MOE, "model.moe.ep_size=2"), "mixtral/tiny", "expert-zero0"),
    (DistributedType.DEEPSPEED, 1, 2, (*MOE, "model.moe.ep_size=2"), "mixtral/tiny", "expert-zero"),
    (DistributedType.DEEPSPEED, 2, 4, (*MOE, "model.moe.ep_size=2"), "mixtral/tiny", "expert-zero"),
]


@pytest.mark.parametrize("kind, stage, world, overrides, recipe, name", LAUNCHES)
def test_selector_picks_the_backend_of_each_launch(tiny_cfg, kind, stage, world, overrides, recipe, name):
    cfg = tiny_cfg(*overrides, recipe=recipe)
    backend = select_backend(_accelerator(kind, stage), DistInfo(0, world), cfg)
    assert backend.name == name
    assert backend.launch.deepspeed == (kind == DistributedType.DEEPSPEED)
    assert backend.launch.zero_stage == (stage or 0) and backend.launch.world_size == world
    assert backend.checkpoint_fields() == {"deepspeed": backend.launch.deepspeed, "zero_stage": stage or 0,
                                           "ep_size": 2 if "model.moe.ep_size=2" in overrides else 1,
                                           "optimizer": "adamw"}


def test_every_launch_has_exactly_one_backend():
    seen = set()
    for deepspeed in (False, True):
        for stage in ((0, 1, 2, 3) if deepspeed else (0,)):
            for ep in (1, 2, 4):
                launch = Launch(deepspeed=deepspeed, zero_stage=stage, ep_size=ep, world_size=4)
                assert sum(b.handles(launch) for b in BACKENDS) == 1, launch
                seen.add(backend_class(launch))
    assert seen == set(BACKENDS)


@pytest.mark.parametrize("kind, stage, world, overrides, recipe, expected", [
    (DistributedType.NO, None, 1, (*MOE, "model.moe.ep_size=2"), "mixtral/tiny",
     r"^model\.moe\.ep_size=2: expert parallelism runs under DeepSpeed; .*recipes/launch/zero0\.yaml"),
    (DistributedType.DEEPSPEED, 3, 2, MOE, "mixtral/tiny",
     r"^model\.moe under DeepSpeed ZeRO stage 3: .*recipes/launch/zero2\.yaml"),
    (DistributedType.DEEPSPEED, 3, 2, (*MOE, "model.moe.ep_size=2"), "mixtral/tiny",
     r"^model\.moe \(with model\.moe\.ep_size=2\) under DeepSpeed ZeRO stage 3: .*zero2\.yaml"),
    (DistributedType.DEEPSPEED, 3, 2, ("train.compile=true",), "llama/tiny",
     r"^train\.compile=true under DeepSpeed ZeRO stage 3: .*train\.compile=false"),
    (DistributedType.DEEPSPEED, 2, 2, ("train.on_nonfinite=skip",), "llama/tiny",
     r"^train\.on_nonfinite='skip' is not supported under DeepSpeed .*train\.on_nonfinite=stop"),
    (DistributedType.DEEPSPEED, 0, 2, ("train.on_nonfinite=skip", *MOE, "model.moe.ep_size=2"), "mixtral/tiny",
     r"^train\.on_nonfinite='skip' is not supported under DeepSpeed"),
    (DistributedType.DEEPSPEED, 0, 3, (*MOE, "model.moe.ep_size=2"), "mixtral/tiny",
     r"^model\.moe\.ep_size=2 must divide the number of processes \(3\)"),
    (DistributedType.DEEPSPEED, 4, 2, (), "llama/tiny",
     r"^DeepSpeed zero_optimization\.stage=4: ZeRO stages are 0, 1, 2 and 3"),
    # Muon (torch.optim.Muon) trains under one process and DDP only; every DeepSpeed launch is refused by name
    *[(DistributedType.DEEPSPEED, stage, 2, ("train.optimizer=muon",), "llama/tiny",
       rf"^train\.optimizer=muon under DeepSpeed ZeRO stage {stage}: DeepSpeed 0\.19 runs Muon only as its own "
       r"MuonWithAuxAdam .*PR #8438.*--multi_gpu.*muon trains under: one process or DDP$") for stage in (0, 1, 2, 3)],
    (DistributedType.DEEPSPEED, 0, 2, ("train.optimizer=muon", *MOE, "model.moe.ep_size=2"), "mixtral/tiny",
     r"^train\.optimizer=muon under DeepSpeed ZeRO-0 with expert parallelism: .*model\.moe\.ep_size=1 with DDP"),
    (DistributedType.DEEPSPEED, 2, 2, ("train.optimizer=muon", *MOE, "model.moe.ep_size=2"), "mixtral/tiny",
     r"^train\.optimizer=muon under DeepSpeed ZeRO-1/2 with expert parallelism: "),
])
def test_refusals_name_the_key_and_the_fix(tiny_cfg, kind, stage, world, overrides, recipe, expected):
    cfg = tiny_cfg(*overrides, recipe=recipe)
    with pytest.raises(RecipeError, match=expected):
        select_backend(_accelerator(kind, stage), DistInfo(0, world), cfg)


def test_refusal_is_asked_of_the_backend_class(tiny_cfg):
    """``refusal`` answers without building anything: None where the backend trains the recipe."""
    dense, moe = tiny_cfg(), tiny_cfg(*MOE, recipe="mixtral/tiny")
    assert ZeroBackend.refusal(Launch(deepspeed=True, zero_stage=3, world_size=2), dense) is None
    assert ZeroBackend.refusal(Launch(deepspeed=True, zero_stage=2, world_size=2), moe) is None
    assert "ZeRO stage 3" in ZeroBackend.refusal(Launch(deepspeed=True, zero_stage=3, world_size=2), moe)
    ep2 = Launch(deepspeed=True, zero_stage=1, ep_size=2, world_size=2)
    assert ExpertZeroBackend.refusal(ep2, moe) is None
    assert PlainBackend.refusal(Launch(world_size=2), moe) is None


def test_muon_trains_under_one_process_and_ddp(tiny_cfg):
    cfg = tiny_cfg("train.optimizer=muon", *MOE, recipe="mixtral/tiny")
    for kind, world in ((DistributedType.NO, 1), (DistributedType.MULTI_CPU, 2), (DistributedType.MULTI_GPU, 2)):
        backend = select_backend(_accelerator(kind), DistInfo(0, world), cfg)
        assert backend.name == "plain" and backend.checkpoint_fields()["optimizer"] == "muon"


def test_several_processes_without_data_parallelism_are_refused(tiny_cfg):
    with pytest.raises(RuntimeError, match="holds 2 processes but accelerate set up no data parallelism"):
        select_backend(_accelerator(DistributedType.NO), DistInfo(0, 2), tiny_cfg())


def _backend(cls, tiny_cfg, launch, rank=0):
    return cls(_accelerator(DistributedType.DEEPSPEED, launch.zero_stage), DistInfo(rank, launch.world_size),
               tiny_cfg(), launch)


def test_resume_checks_name_the_file_and_the_launch(tiny_cfg, tmp_path):
    plain = PlainBackend(_accelerator(DistributedType.NO), DistInfo(0, 1), tiny_cfg(), Launch())
    with pytest.raises(ckpt.CheckpointError, match=r"optimizer\.pt: missing .*same launcher"):
        plain.check_resume(tmp_path, {"ep_size": 1})
    # another ep_size: not an error, the optimizer restarts (the warning says so)
    warning = plain.check_resume(tmp_path, {"ep_size": 2})
    assert "model.moe.ep_size=2, this run uses 1" in warning and "restarts from zero" in warning

    zero2 = _backend(ZeroBackend, tiny_cfg, Launch(deepspeed=True, zero_stage=2, world_size=2))
    with pytest.raises(ckpt.CheckpointError, match="written at DeepSpeed ZeRO stage 3, this launch uses stage 2"):
        zero2.check_resume(tmp_path, {"deepspeed": True, "zero_stage": 3})
    with pytest.raises(ckpt.CheckpointError, match=r"zero: missing \(the checkpoint was not written under DeepSpeed"):
        zero2.check_resume(tmp_path, {"deepspeed": False, "zero_stage": 0})
    (tmp_path / "zero").mkdir()
    assert zero2.check_resume(tmp_path, {"deepspeed": True, "zero_stage": 1}) is None  # stages 0-2 mix

    ep = _backend(ExpertZero0Backend, tiny_cfg, Launch(deepspeed=True, ep_size=2, world_size=2), rank=1)
    with pytest.raises(ckpt.CheckpointError, match=r"optimizer_rank1\.pt: missing .*same number of processes"):
        ep.check_resume(tmp_path, {"ep_size": 2})


def test_expert_optimizer_files_of_the_other_zero_kind_are_refused(tmp_path):
    torch.save({"base_optimizer_state": [], "zero_stage": 1}, tmp_path / ckpt.rank_optimizer_name(0))
    torch.save({"state": {}, "param_groups": []}, tmp_path / ckpt.rank_optimizer_name(1))
    assert "base_optimizer_state" in rank_optimizer_state(tmp_path, 0, zero=True)
    with pytest.raises(ckpt.CheckpointError, match="written at DeepSpeed ZeRO stage 1-2, this launch uses 0"):
        rank_optimizer_state(tmp_path, 0, zero=False)
    with pytest.raises(ckpt.CheckpointError, match="written at DeepSpeed ZeRO stage 0, this launch uses 1-2"):
        rank_optimizer_state(tmp_path, 1, zero=True)


def _plain(cfg, restore_from=None):
    """A model and its plain backend, prepared (one process)."""
    accelerator = make_accelerator(cfg.train)
    backend = select_backend(accelerator, dist_info(accelerator), cfg)
    torch.manual_seed(0)
    model = archlab.build_model(cfg)
    if restore_from is not None:
        ckpt.load_weights_into(model, restore_from)
    optimizer = backend.build_optimizer(model, restore_from)
    backend.prepare(model, model, optimizer, restore_from)
    return model, backend


def _one_step(backend, x_BS1) -> float:
    out = backend.model_t(x_BS1[:, :-1], targets=x_BS1[:, 1:])
    assert backend.backward(out.loss + out.aux_loss)
    norm = backend.clip_grad_norm()
    backend.step()
    return float(norm)


def test_plain_backend_steps_clips_and_round_trips_its_state(tiny_cfg, tmp_path):
    cfg = tiny_cfg("train.grad_clip=0.01", "model.dropout=0.0")
    model, backend = _plain(cfg)
    assert backend.name == "plain" and backend.model_t is not None
    x_BS1 = torch.randint(0, cfg.model.vocab_size, (2, 17), generator=torch.Generator().manual_seed(1))
    # the norm is the global gradient norm before clipping; the update used the clipped gradient
    out = backend.model_t(x_BS1[:, :-1], targets=x_BS1[:, 1:])
    backend.backward(out.loss + out.aux_loss)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    expected = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))
    norm = backend.clip_grad_norm()
    norm = float(norm)  # a tensor on the device: the trainer reads it with the step's other numbers
    assert norm == pytest.approx(expected, rel=1e-5) and norm > 0.01
    clipped = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    assert float(clipped) == pytest.approx(0.01, rel=1e-3)
    backend.step()
    assert all(p.grad is None for p in model.parameters())  # cleared after the update
    _one_step(backend, x_BS1)

    assert backend.save(tmp_path, model) is model  # rank 0 writes the model's own weights
    assert (tmp_path / ckpt.OPTIMIZER).is_file()
    ckpt.save_model_weights(model, tmp_path / ckpt.WEIGHTS)

    restored_model, restored = _plain(cfg, restore_from=tmp_path)
    assert restored.check_resume(tmp_path, restored.checkpoint_fields()) is None
    saved, loaded = backend.optimizer.state_dict(), restored.optimizer.state_dict()
    assert [g["lr_scale"] for g in loaded["param_groups"]] == [g["lr_scale"] for g in saved["param_groups"]]
    assert saved["state"].keys() == loaded["state"].keys() and saved["state"]
    for i, s in saved["state"].items():
        assert all(torch.equal(s[k], loaded["state"][i][k]) for k in s)
    # the next step repeats exactly
    assert _one_step(restored, x_BS1) == _one_step(backend, x_BS1)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), restored_model.parameters()))
    backend.close()
    assert backend.model_t is None and backend.optimizer_t is None


def test_a_checkpoint_of_another_world_size_resumes_where_the_backend_can(tiny_cfg, tmp_path):
    """DDP's optimizer.pt is the whole AdamW state: 2 processes' checkpoint resumes in 1 (and back).
    DeepSpeed keeps one optimizer file per process (ZeRO partitions, expert-parallel ranks' experts):
    refused, naming both sizes and the launch that wrote it."""
    (tmp_path / ckpt.OPTIMIZER).write_bytes(b"")
    (tmp_path / "zero").mkdir()
    plain = PlainBackend(_accelerator(DistributedType.NO), DistInfo(0, 1), tiny_cfg(), Launch())
    assert plain.check_resume(tmp_path, {"world_size": 2, "ep_size": 1}) is None
    zero2 = _backend(ZeroBackend, tiny_cfg, Launch(deepspeed=True, zero_stage=2, world_size=1))
    zero2.info = DistInfo(0, 1)
    assert zero2.check_resume(tmp_path, {"world_size": 1, "deepspeed": True, "zero_stage": 2}) is None
    with pytest.raises(ckpt.CheckpointError, match=r"checkpoint was written by 2 processes \(DeepSpeed ZeRO-2\), "
                                                   r"this run has 1: DeepSpeed keeps one optimizer file per process "
                                                   r".*resume with 2 processes \(accelerate launch --num_processes 2"):
        zero2.check_resume(tmp_path, {"world_size": 2, "deepspeed": True, "zero_stage": 2})
    moe = tiny_cfg(*MOE, "model.moe.ep_size=2", recipe="mixtral/tiny")
    ep = ExpertZeroBackend(_accelerator(DistributedType.DEEPSPEED, 2), DistInfo(1, 2), moe,
                           Launch(deepspeed=True, zero_stage=2, ep_size=2, world_size=2))
    for r in range(4):
        torch.save({}, tmp_path / ckpt.rank_optimizer_name(r))
    saved = {"world_size": 4, "deepspeed": True, "zero_stage": 2, "ep_size": 2}
    with pytest.raises(ckpt.CheckpointError, match=r"written by 4 processes \(DeepSpeed ZeRO-2, model\.moe\.ep_size=2\)"
                                                   r", this run has 2: .*its experts' state"):
        ep.check_resume(tmp_path, saved)
    assert ep.check_resume(tmp_path, {**saved, "world_size": 2}) is None


def test_deepspeed_checks_the_steps_losses_once_before_the_engine_updates(tiny_cfg):
    """Under DeepSpeed the engine updates inside the last micro batch's backward (accelerate's
    sync_gradients): the micro batches before it back-propagate without a check, and the last one is
    refused when any loss of the step was not finite (one all-reduce per step, identity here)."""
    calls = []
    zero = _backend(ZeroBackend, tiny_cfg, Launch(deepspeed=True, zero_stage=2, world_size=1))
    zero.accelerator.backward = calls.append
    step = [(float("nan"), False), (1.0, True), (2.0, False), (3.0, True)]  # two steps of two micro batches
    results = []
    for value, last in step:
        zero.accelerator.sync_gradients = last
        results.append(zero.backward(torch.tensor(value)))
    assert results == [True, False, True, True]
    assert len(calls) == 3 and calls[0].isnan()  # the non-finite loss reached the gradient, never an update


def test_process_group_timeout_comes_from_the_recipe(tiny_cfg):
    """train.dist_timeout_s reaches torch.distributed through accelerate's InitProcessGroupKwargs; unset keeps
    torch's default; a non-positive value is refused by name."""
    from datetime import timedelta

    assert make_accelerator(tiny_cfg("train.dist_timeout_s=123").train).init_handler.timeout == timedelta(seconds=123)
    assert make_accelerator(tiny_cfg().train).init_handler is None
    with pytest.raises(RecipeError, match="train.dist_timeout_s"):
        make_accelerator(tiny_cfg("train.dist_timeout_s=0").train)
