"""Train an arm's architecture from scratch on a probe task (``archlab.data.probes``) and score it: accuracy at
the test set's answer positions with a Wilson interval. What the ``mqar`` and ``mad`` measurements run.

The model is the arm's recipe with its overrides, then the probe's: ``model.vocab_size`` and the sequence length
of the task, ``model.d_model`` = the probe's width (and ``model.n_layers`` when given); the optimizer and the lr
schedule are the recipe's (``archlab.optim``: ``train.optimizer``, ``train.schedule``) over ``steps`` steps of
``batch`` sequences, each training sequence seen once. The loss is the model's own (cross-entropy at the scored
positions, -100 elsewhere) plus its auxiliary loss (MoE balance).

Shape legend: B batch, S sequence length, N test sequences.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Optional, Sequence

import torch
from scipy.stats import binomtest

from archlab.config import load_recipe
from archlab.data.probes import IGNORE, PROBES, ProbeTask, probe_task
from archlab.io import write_json_atomic
from archlab.model.build import build_model
from archlab.optim import build_optimizer, lr_at, set_lr


def probe_overrides(task: ProbeTask, width: int, layers: Optional[int], steps: int, batch: int, lr: float,
                    seed: int) -> list[str]:
    """The overrides that fit an arm's recipe to ``task`` (applied after the arm's own; the vocabulary is set on
    the loaded config by :func:`probe_config`, since the recipe's tokenizer would refuse a probe's small one)."""
    warmup = max(1, steps // 10)
    out = [f"model.max_seq_len={task.seq_len}",
           f"train.seq_len={task.seq_len}", f"model.d_model={width}", f"train.max_steps={steps}",
           f"train.micro_batch_size={batch}", "train.grad_accum=1", f"train.lr={lr}", f"train.warmup_steps={warmup}",
           f"train.seed={seed}"]
    return out + ([f"model.n_layers={layers}"] if layers else [])


def probe_config(recipe: str, overrides: Sequence[str], task: ProbeTask):
    """The recipe with ``overrides``, its model's vocabulary the task's (the probe's ids, not the corpus's)."""
    cfg = load_recipe(recipe, list(overrides))
    cfg.model.vocab_size = task.vocab_size
    return cfg


def wilson(correct: int, n: int) -> dict:
    """{mean, low, high}: the share ``correct / n`` with its 95% Wilson interval (scipy)."""
    ci = binomtest(correct, n).proportion_ci(confidence_level=0.95, method="wilson")
    return {"mean": correct / n, "low": float(ci.low), "high": float(ci.high)}


@torch.no_grad()
def answer_accuracy(model, inputs_NS: torch.Tensor, targets_NS: torch.Tensor, batch: int = 64) -> tuple[int, int]:
    """(correct, answers): argmax predictions against the targets at the scored positions."""
    model.eval()
    correct = answers = 0
    for i in range(0, inputs_NS.shape[0], batch):
        x_BS, y_BS = inputs_NS[i:i + batch], targets_NS[i:i + batch]
        scored_BS = y_BS != IGNORE
        pred_BS = model(x_BS).logits.argmax(-1)
        correct += int((pred_BS == y_BS)[scored_BS].sum())
        answers += int(scored_BS.sum())
    return correct, answers


def test_sequences(task: ProbeTask, test_answers: int) -> int:
    """How many test sequences give at least ``test_answers`` answers."""
    per = task.generate(8, 0, "test").answers / 8
    return math.ceil(test_answers / per)


def train_probe(recipe: str, overrides: Sequence[str], task: ProbeTask, *, width: int, layers: Optional[int],
                steps: int, batch: int, lr: float, seed: int, test_answers: int = 1024) -> dict:
    """Train the recipe's model on ``task`` from scratch and score it on the test set.

    Returns {accuracy: {mean, low, high}, correct, answers, chance, final_loss, params, cpu_s, steps, width}."""
    cfg = probe_config(recipe, [*overrides, *probe_overrides(task, width, layers, steps, batch, lr, seed)], task)
    if str(cfg.model.type) != "decoder":
        raise ValueError(f"{recipe}: model.type={cfg.model.type!r}: a probe scores next-token answers; it needs a "
                         "causal decoder (model.type: decoder)")
    train = task.generate(steps * batch, seed, "train")
    test = task.generate(test_sequences(task, test_answers), seed, "test")
    t0 = time.process_time()
    torch.manual_seed(seed)
    model = build_model(cfg)
    model.train()
    opt = build_optimizer(model, cfg.train)
    losses = []
    for step in range(steps):
        set_lr(opt, lr_at(step, cfg.train))
        x_BS = train.inputs_NS[step * batch:(step + 1) * batch]
        y_BS = train.targets_NS[step * batch:(step + 1) * batch]
        out = model(x_BS, targets=y_BS)
        (out.loss + out.aux_loss).backward()
        if cfg.train.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(out.loss.detach()))
    correct, answers = answer_accuracy(model, test.inputs_NS, test.targets_NS)
    tail = losses[-max(1, steps // 10):]
    return {"accuracy": wilson(correct, answers), "correct": correct, "answers": answers, "chance": task.chance,
            "final_loss": sum(tail) / len(tail), "params": sum(p.numel() for p in model.parameters()),
            "cpu_s": time.process_time() - t0, "steps": steps, "width": width}

def train_and_store(job: tuple, threads: Optional[int] = None) -> None:
    """Train one probe run and store its result as the measurements' cache file (JSON ``{"settings", "result"}``,
    what ``analysis.measurements.base.cached`` reads back): a task of the probe measurements' process pool."""
    path, settings, recipe, overrides, task, train, test_answers = job
    if threads:
        torch.set_num_threads(threads)
    result = train_probe(recipe, overrides, task, test_answers=test_answers, **train)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(Path(path), {"settings": settings, "result": result}, sort_keys=False)


def main(argv: Optional[Sequence[str]] = None) -> None:
    """``python -m analysis.probe_training RECIPE --task mqar [--probe KEY=VALUE] [--set KEY=VALUE]``: one probe
    run of a recipe, printed as JSON (what the ``mqar`` and ``mad`` measurements run per arm)."""
    p = argparse.ArgumentParser(prog="python -m analysis.probe_training", description=main.__doc__.split("\n")[0])
    p.add_argument("recipe")
    p.add_argument("--task", required=True, help=f"one of {', '.join(PROBES.names())}")
    p.add_argument("--probe", action="append", default=[], metavar="KEY=VALUE",
                   help="a task setting, e.g. seq_len=128 (repeatable)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a recipe override (repeatable)")
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--test-answers", type=int, default=1024)
    a = p.parse_args(argv)
    settings = {}
    for kv in a.probe:
        key, sep, value = kv.partition("=")
        if not sep:
            p.error(f"--probe {kv!r}: expected KEY=VALUE, e.g. seq_len=128")
        settings[key] = float(value) if "." in value or "e" in value else int(value)
    task = probe_task(a.task, settings)
    result = train_probe(a.recipe, a.set, task, width=a.width, layers=a.layers, steps=a.steps, batch=a.batch,
                         lr=a.lr, seed=a.seed, test_answers=a.test_answers)
    print(json.dumps({"task": a.task, "settings": vars(task), "recipe": a.recipe, "set": a.set, **result}))


if __name__ == "__main__":
    main()
