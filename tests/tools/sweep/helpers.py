"""What the sweep tests share: tiny runs and a cooldown spec file."""

from __future__ import annotations

import json

TINY = ["model.vocab_size=384", "train.seq_len=32", "train.micro_batch_size=8", "data.max_bytes=150000",
        "train.eval_batches=2", "train.tensorboard=false", "train.eval_context_multipliers=[1]",
        "model.d_model=16", "model.n_layers=1", "model.n_heads=2"]


def write_cooldown_spec(tmp_path, name="cd.yaml", **extra):
    spec = {"out": str(tmp_path / "sweep"), "set": TINY + [f"data.cache_dir={tmp_path / 'cache'}"],
            "ladders": {"ok": {"recipe": "recipes/dense/tiny.yaml"}},
            "cooldown": {"tokens": [2048, 4096], "decay_fraction": 0.2, "shape": "sqrt"}, **extra}
    path = tmp_path / name
    path.write_text(json.dumps(spec))
    return path, spec
