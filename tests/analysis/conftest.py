"""Small real run folders for the analysis tests, trained once per test session.

Four dense sizes, a Mixtral-style and a DeepSeek-style MoE run (checkpoints at steps 10 and 20,
routing records every 2 steps), a run that diverges (absurd learning rate) and a run killed
before its end (the finished Mixtral run's folder without summary.json). Tiny models, 20 steps each.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Optional

import pytest
import torch

COMMON = ["model.vocab_size=384", "train.seq_len=32", "train.micro_batch_size=8", "data.max_bytes=150000",
          "train.log_every=5", "train.eval_every=10", "train.eval_batches=2", "train.warmup_steps=2",
          "train.max_steps=20", "train.tensorboard=false", "train.eval_context_multipliers=[1]"]
SMALL = ["model.n_heads=2"]
RUNS = {
    "dense-d16": ("recipes/dense/tiny.yaml", ["model.d_model=16", "model.n_layers=1"]),
    "dense-d24": ("recipes/dense/tiny.yaml", ["model.d_model=24", "model.n_layers=1"]),
    "dense-d32": ("recipes/dense/tiny.yaml", ["model.d_model=32", "model.n_layers=2"]),
    "dense-d48": ("recipes/dense/tiny.yaml", ["model.d_model=48", "model.n_layers=2"]),
    "mixtral-d32": ("recipes/mixtral/tiny.yaml", ["model.d_model=32", "model.n_layers=2", "model.n_kv_heads=1",
                                                  "model.moe.num_experts=4", "model.moe.expert_hidden=32",
                                                  "train.ckpt_every=10", "train.routing_every=2"]),
    "deepseek-d32": ("recipes/deepseek/tiny.yaml", ["model.d_model=32", "model.n_layers=2", "model.n_kv_heads=1",
                                                    "model.moe.expert_hidden=16", "train.ckpt_every=10",
                                                    "train.routing_every=2",
                                                    "model.moe.balance.bias_update_rate=0.01"]),
}


@pytest.fixture(scope="session")
def analysis_runs(tmp_path_factory) -> dict[str, Path]:
    """name -> run folder. Names: the keys of RUNS, plus "diverged" and "killed"."""
    root = tmp_path_factory.mktemp("analysis-runs")
    cache = tmp_path_factory.mktemp("analysis-cache")
    base = COMMON + SMALL + [f"data.cache_dir={cache}", f"train.out_dir={root / 'runs'}"]
    out = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is fastest, and the machine is shared
    try:
        out.update(_train_all(root / "runs", base))
    finally:
        torch.set_num_threads(threads)
    killed = root / "runs" / "killed"
    shutil.copytree(out["mixtral-d32"], killed)
    (killed / "summary.json").unlink()
    out["killed"] = killed
    return out


def _train_all(runs: Path, base: list[str]) -> dict[str, Path]:
    from archlab.config import load_recipe
    from archlab.train import NonFiniteError, train

    out = {}
    for name, (recipe, extra) in RUNS.items():
        train(load_recipe(recipe, base + extra + [f"train.run_name={name}"]))
        out[name] = runs / name
    with pytest.raises(NonFiniteError):
        train(load_recipe("recipes/dense/tiny.yaml", base + ["model.d_model=16", "model.n_layers=1", "train.lr=1e4",
                                                             "train.grad_clip=0", "train.run_name=diverged"]))
    out["diverged"] = runs / "diverged"
    return out


# ------------------------------------------------------------------ fake run folders (no training)


def write_fake_run(folder: Path, recipe: str, overrides: list[str], *, tokens: float, loss: float,
                   curve: list[tuple[float, float]] = (), status: str = "completed",
                   summary_extra: Optional[dict] = None) -> Path:
    """A run folder as ``archlab.train`` leaves it, without training: the resolved recipe, run.json,
    summary.json (final loss at the training context, tokens, status) and metrics.jsonl (a first
    training row at loss 10, and validation rows from ``curve``: (tokens, loss) pairs, the last one
    the final loss unless given). ``status="nonfinite"`` writes a diverged run; ``summary_extra``
    adds keys to summary.json (e.g. ``{"role": "stable"}``)."""
    import json

    from omegaconf import OmegaConf

    from archlab.config import load_recipe
    from archlab.costs import training_flops_per_token

    cfg = load_recipe(recipe, list(overrides))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "recipe.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    (folder / "run.json").write_text(json.dumps({"archlab_run": 1, "name": folder.name, "created": 0.0}))
    seq = int(cfg.train.seq_len)
    fpt = float(training_flops_per_token(archlab_model_config(cfg), seq))
    rows = [{"kind": "train", "step": 1, "tokens": seq, "loss": 10.0}]
    pts = list(curve) or [(tokens, loss)]
    if status == "completed" and pts[-1][0] != tokens:
        pts.append((tokens, loss))
    rows += [{"kind": "val", "step": i + 1, "tokens": t, "loss": v, "context_multiplier": 1}
             for i, (t, v) in enumerate(pts)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {"status": status, "step": len(pts), "tokens": tokens, "training_flops": fpt * tokens,
               "final_val_loss": {str(seq): loss}}
    if status == "nonfinite":
        summary["message"] = "loss is nan at step 3"
    summary.update(summary_extra or {})
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def archlab_model_config(cfg):
    from archlab.config import model_config

    return model_config(cfg)


@pytest.fixture(scope="session")
def fake_run():
    """``fake_run(folder, recipe, overrides, tokens=..., loss=..., curve=..., status=...)``: see write_fake_run."""
    return write_fake_run


@pytest.fixture
def tick_overlaps(monkeypatch):
    """Every figure saved while the test runs, checked after its save for overlapping tick labels
    (:func:`analysis.plotting.tick_label_overlaps`): a list of (file name, overlaps)."""
    from matplotlib.figure import Figure

    from analysis.plotting import tick_label_overlaps

    seen = []
    original = Figure.savefig

    def savefig(fig, fname, *args, **kwargs):
        original(fig, fname, *args, **kwargs)
        seen.append((Path(str(fname)).name.replace(".tmp", ""), tick_label_overlaps(fig)))

    monkeypatch.setattr(Figure, "savefig", savefig)
    return seen
