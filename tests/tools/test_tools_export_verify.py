"""``python -m tools.export_hf RUN --verify`` reloads each exported family with its own transformers Auto class
(causal LM, masked LM, sequence-to-sequence) and compares its logits with archlab's; a difference fails."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import archlab
from archlab.train import checkpoint
from tools import export_hf, export_verify

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, recipe: str) -> tuple[Path, torch.nn.Module]:
    """A run folder of ``recipe`` (one layer) with one checkpoint of its random init."""
    cfg = archlab.load_recipe(ROOT / recipe, ["model.n_layers=1"])
    torch.manual_seed(0)
    model = archlab.build_model(cfg)
    run = tmp_path / "run"
    run.mkdir()
    (run / checkpoint.RUN_MARKER).write_text("{}")
    tmp = checkpoint.begin(run, 1)
    checkpoint.save_model_weights(model, tmp / checkpoint.WEIGHTS)
    checkpoint.save_recipe(cfg, tmp / checkpoint.RECIPE)
    checkpoint.finish(run, 1, keep_last=1)
    return run, model


@pytest.mark.parametrize("recipe, hf_class", [("recipes/t5/tiny.yaml", "T5ForConditionalGeneration"),
                                              ("recipes/bert/tiny.yaml", "BertForMaskedLM"),
                                              ("recipes/llama/tiny.yaml", "LlamaForCausalLM")])
def test_verify_reloads_each_family_with_its_auto_class(tmp_path, capsys, recipe, hf_class):
    run, _ = _run(tmp_path, recipe)
    rc = export_hf.main(["--checkpoint", str(run), "--out", str(tmp_path / "hf"), "--verify"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert hf_class in out and "verified: max |logit diff|" in out


def test_verify_of_a_t5_finds_a_changed_weight(tmp_path):
    run, model = _run(tmp_path, "recipes/t5/tiny.yaml")
    assert export_hf.main(["--checkpoint", str(run), "--out", str(tmp_path / "hf")]) == 0
    assert export_verify.verify(model, tmp_path / "hf") < 1e-4
    with torch.no_grad():  # the decoder's cross-attention: seen only when both encoder and decoder ids are fed
        model.get_parameter("blocks.0.cross.wq.weight").add_(0.5)
    with pytest.raises(AssertionError):
        export_verify.verify(model, tmp_path / "hf")
