"""muP through the trainer: the per-layer learning rates survive a checkpoint and resume exactly."""

import signal

import torch
from safetensors.torch import load_file

from archlab.train import Trainer, train
from archlab.train import checkpoint as ckpt

MUP = ("model.parametrization=mup", "model.mup_base_width=16", "train.ckpt_every=100")  # d_model 32: m = 2


def test_mup_run_resumes_exactly(tiny_cfg, rows, monkeypatch):
    full = train(tiny_cfg(*MUP, "train.run_name=full"))
    original = Trainer.train_step

    def train_step(self):  # a real SIGINT right after step 3 is computed
        out = original(self)
        if self.step + 1 == 3:
            signal.raise_signal(signal.SIGINT)
        return out

    with monkeypatch.context() as m:
        m.setattr(Trainer, "train_step", train_step)
        part = train(tiny_cfg(*MUP, "train.run_name=part"))
    assert part["status"] == "interrupted" and part["step"] == 3
    resumed = train(tiny_cfg(*MUP, "train.run_name=part", "train.resume=auto"))
    assert resumed["status"] == "completed" and resumed["step"] == 8
    a, b = rows(full["run_dir"]), rows(resumed["run_dir"])
    assert [(r["loss"], r["lr"]) for r in a] == [(r["loss"], r["lr"]) for r in b]
    full_w = load_file(ckpt.latest(full["run_dir"]) / ckpt.WEIGHTS)
    res_w = load_file(ckpt.latest(resumed["run_dir"]) / ckpt.WEIGHTS)
    assert all(torch.equal(full_w[k], res_w[k]) for k in full_w)
    saved = torch.load(ckpt.latest(resumed["run_dir"]) / ckpt.OPTIMIZER, weights_only=True)
    assert [g["lr_scale"] for g in saved["param_groups"]] == [0.5, 1.0, 1.0]  # decay, readout, no_decay
