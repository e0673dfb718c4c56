"""``python -m tools.import_hf FOLDER --out RUN [--force]``: writes the run, refuses an existing one without
--force and a config key archlab cannot express by name (exit 2, one line); ``tools.explore`` and
``tools.export_hf`` read the run it writes."""

from __future__ import annotations

import torch

from archlab.data.tokenizer import byte_tokenizer
from tools import export_hf, import_hf
from tools.explore.load import load


def gpt2_folder(tmp_path, activation: str = "gelu_new"):
    """A random tiny GPT2LMHeadModel folder with archlab's byte tokenizer (256 bytes + <|endoftext|>)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    folder = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(vocab_size=300, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                               activation_function=activation)).save_pretrained(folder)
    byte_tokenizer([], 257).save(folder / "tokenizer.json")
    return folder


def test_it_writes_a_run_that_explore_and_export_read(tmp_path, capsys):
    run = tmp_path / "runs" / "gpt2"
    assert import_hf.main([str(gpt2_folder(tmp_path)), "--out", str(run)]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {run}: decoder, 2 layers, d_model 32, vocab 300")
    explorable = load(run)
    assert explorable.source == "run" and explorable.model.cfg.d_model == 32
    assert export_hf.main(["--checkpoint", str(run), "--out", str(tmp_path / "back"), "--verify"]) == 0
    assert "GPT2LMHeadModel" in capsys.readouterr().out

    assert import_hf.main([str(gpt2_folder(tmp_path)), "--out", str(run)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert import_hf.main([str(gpt2_folder(tmp_path)), "--out", str(run), "--force"]) == 0


def test_an_unsupported_key_is_refused_by_name(tmp_path, capsys):
    assert import_hf.main([str(gpt2_folder(tmp_path, "gelu_fast")),
                           "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == ("error: config.json: activation_function='gelu_fast': archlab supports gelu_new / "
                       "gelu_pytorch_tanh (GELU, tanh approximation), gelu (exact GELU, erf) and relu")
    assert not (tmp_path / "run").exists()
