"""The loop's callbacks: the hooks run in the order archlab.train.callbacks.base documents, a hook's
work reaches the run's record, and the recipe chooses the callbacks once."""

from __future__ import annotations

from types import SimpleNamespace

import archlab
from archlab.objectives import objective_for
from archlab.train import callbacks, loop, train
from archlab.train.callbacks import (
    Branch,
    Callback,
    MetricsLogger,
    MoEBookkeeping,
    NonFinitePolicy,
    RouterTracing,
    Trackers,
)

HOOKS = [name for name in vars(Callback) if name.startswith(("on_", "before_", "after_"))]


class Recorder(Callback):
    """Records every hook it is called at, with the step it saw."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __getattribute__(self, name):
        if name in HOOKS:
            def hook(trainer, *args):
                extra = args[0] if name in ("before_forward", "after_forward") else None  # the micro batch
                self.calls.append((name, trainer.step) if extra is None else (name, trainer.step, extra))
            return hook
        return super().__getattribute__(name)


def with_recorder(monkeypatch) -> Recorder:
    recorder = Recorder()
    monkeypatch.setattr(loop, "choose", lambda trainer: [*callbacks.choose(trainer), recorder])
    return recorder


def step_calls(step: int, micro_batches: int, row: bool = False) -> list[tuple]:
    """The hooks of the optimizer step that ends at ``step``; ``row``: the logger writes its train row
    (on_row, from the logger's after_step, which comes before the recorder's: list order)."""
    forwards = [(hook, step - 1, m) for m in range(micro_batches) for hook in ("before_forward", "after_forward")]
    return [("before_step", step - 1), *forwards, ("after_backward", step - 1), ("after_update", step),
            *([("on_row", step)] if row else []), ("after_step", step)]


def test_hooks_run_in_the_documented_order(tiny_cfg, monkeypatch):
    recorder = with_recorder(monkeypatch)
    cfg = tiny_cfg("train.max_steps=3", "train.grad_accum=2", "train.log_every=2", "train.eval_every=2",
                   "train.ckpt_every=100", "train.eval_context_multipliers=[1]")
    train(cfg)
    assert recorder.calls == [
        ("on_run_folder", 0), ("on_build", 0), ("on_start", 0),
        *step_calls(1, 2),
        *step_calls(2, 2, row=True),  # the train row of step 2 (log_every=2)
        ("on_row", 2), ("on_eval", 2),  # the validation row between steps (eval_every=2)
        *step_calls(3, 2, row=True),  # the last step's train row
        ("on_row", 3), ("on_eval", 3),  # the final validation row
        ("on_end", 3), ("on_close", 3),
    ]


def test_a_resumed_run_restores_before_it_builds(tiny_cfg, monkeypatch):
    train(tiny_cfg("train.max_steps=4", "train.ckpt_every=2"))
    recorder = with_recorder(monkeypatch)
    train(tiny_cfg("train.max_steps=4", "train.resume=auto"))
    assert recorder.calls[:4] == [("on_restore", 4), ("on_run_folder", 4), ("on_build", 4), ("on_start", 4)]
    assert recorder.calls[4:] == [("on_row", 4), ("on_eval", 4), ("on_row", 4), ("on_eval", 4), ("on_end", 4),
                                  ("on_close", 4)]  # nothing left to train: the final rows (two contexts)


class ExtraField(Callback):
    """Adds a field to every step's row and asks for statistics at step 1 only."""

    def __init__(self) -> None:
        self.reads: list[bool] = []

    def reads_stats(self, trainer, step: int) -> bool:
        return step == 1

    def after_update(self, trainer, result, read: bool) -> None:
        self.reads.append(read)
        result["extra"]["probe/step_seen"] = trainer.step


def test_a_callbacks_hooks_run_and_reach_the_metrics_row(tiny_cfg, rows, monkeypatch):
    probe = ExtraField()
    monkeypatch.setattr(loop, "choose", lambda trainer: [*callbacks.choose(trainer), probe])
    summary = train(tiny_cfg("train.max_steps=4", "train.log_every=2"))
    assert probe.reads == [True, True, False, True]  # its own step 1; the logger's rows at 2 and 4
    assert [(r["step"], r["probe/step_seen"]) for r in rows(summary["run_dir"])] == [(2, 2), (4, 4)]


def kinds(cfg, is_main: bool = True) -> list[type]:
    model = objective_for(cfg).build_model(cfg)
    trainer = SimpleNamespace(cfg=cfg, model=model, run_dir=cfg.train.out_dir, info=SimpleNamespace(is_main=is_main))
    return [type(cb) for cb in callbacks.choose(trainer)]


def test_the_recipe_chooses_the_callbacks(root, tmp_path, tiny_overrides):
    def cfg(recipe, *overrides):
        return archlab.load_recipe(root / "recipes" / f"{recipe}.yaml",
                                   [*tiny_overrides, f"train.out_dir={tmp_path}", *overrides])

    assert kinds(cfg("llama/tiny")) == [NonFinitePolicy, MetricsLogger]
    moe = ("model.moe.num_experts=4", "model.moe.expert_hidden=16", "train.router_trace_every=2")
    assert kinds(cfg("mixtral/tiny", *moe)) == [NonFinitePolicy, MoEBookkeeping, RouterTracing, MetricsLogger]
    assert kinds(cfg("mixtral/tiny", *moe), is_main=False) == [NonFinitePolicy, MoEBookkeeping, MetricsLogger]
    parent = tmp_path / "trunk" / "checkpoints" / "step_00000004"
    assert kinds(cfg("llama/tiny", f"train.branch_from={parent}", "train.trackers=[tensorboard]")) == [
        NonFinitePolicy, Branch, MetricsLogger, Trackers]
