"""The run's closing record for an objective whose validation loss is not ``loss`` (masked LM, span
corruption): summary.json names it, the closing lines print it, loss.png draws it."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import matplotlib.axes
import pytest

import archlab
from archlab.objectives import objective_for
from archlab.train.console import closing_lines
from archlab.train.record import summarize

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("recipe, key, label", [("t5/tiny", "span_loss", "validation (masked spans)"),
                                                ("bert/tiny", "mlm_loss", "validation (masked tokens)")])
def test_the_objectives_validation_loss_reaches_summary_closing_lines_and_loss_png(tmp_path, monkeypatch,
                                                                                   recipe, key, label):
    cfg = archlab.load_recipe(ROOT / f"recipes/{recipe}.yaml")
    rows = [{"kind": "train", "step": s, "tokens": 64 * s, "loss": 7.0 - s / 10, "tokens_per_s": 1e3, "mfu": 0.01}
            for s in (1, 2)]
    rows += [{"kind": "val", "step": 2, "tokens": 128, "context_len": 64, "context_multiplier": 1,
              key: 6.25, "final": True}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    trainer = SimpleNamespace(run_dir=tmp_path, step=2, tokens=128, branch=None, last_ckpt=None, cfg=cfg,
                              info=SimpleNamespace(rank=0, is_main=True), objective=objective_for(cfg),
                              metrics=None, unigram_entropy=6.0, flops_per_token=1.0)
    drawn: list[str] = []
    plot = matplotlib.axes.Axes.plot
    monkeypatch.setattr(matplotlib.axes.Axes, "plot",
                        lambda ax, *a, **kw: (drawn.append(kw.get("label")), plot(ax, *a, **kw))[1])

    summary = summarize(trainer, "completed", "", 1.0)

    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["val_loss_key"] == key and on_disk[f"final_val_{key}"] == {"64": 6.25}
    assert f"[archlab] final validation {key} (nats/token): 6.250 at 64 tokens" in closing_lines(summary)
    assert drawn == ["train", label] and (tmp_path / "loss.png").is_file()
