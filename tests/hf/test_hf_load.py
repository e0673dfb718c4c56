"""The run folder an import writes (``archlab.hf.load``) is a run folder like the trainer's: ``tools.sample``
generates from it with its tokenizer, and ``train.init_from`` fine-tunes from it (classification, two steps);
a tokenizer without ``<|endoftext|>`` gets config.json's ``eos_token_id`` as ``data.eot_id``."""

from __future__ import annotations

import json

import pytest
import torch
from tokenizers import Tokenizer, models

import archlab
from archlab.checkpoints import verify
from archlab.data.tokenizer import byte_tokenizer
from archlab.train import train
from archlab.train.checkpoint import load_recipe_of, resolve_checkpoint
from archlab.train.run_folder import read_jsonl
from tools import sample

V = 300


def llama_folder(tmp_path, tokenizer: bool = True):
    """A random tiny LlamaForCausalLM folder, with archlab's byte tokenizer (256 bytes + <|endoftext|>)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    folder = tmp_path / "hf"
    LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                 eos_token_id=256)).save_pretrained(folder)
    if tokenizer:
        byte_tokenizer([], 257).save(folder / "tokenizer.json")
    return folder


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("import")
    return archlab.from_hf(llama_folder(tmp), tmp / "runs" / "llama")


def test_the_run_folder_has_the_trainers_layout(imported):
    assert json.loads((imported / "run.json").read_text())["archlab_run"] == 1
    ckpt = resolve_checkpoint(imported)
    assert ckpt.name == "step_00000000"
    assert set(verify(ckpt)["files"]) == {"model.safetensors", "state.json", "recipe.yaml"}
    assert (imported / "recipe.yaml").read_text() == (ckpt / "recipe.yaml").read_text()
    assert (imported / "tokenizer.json").is_file()
    cfg = load_recipe_of(ckpt)
    assert cfg.data.tokenizer == str(imported.resolve() / "tokenizer.json") and cfg.data.eot_id is None
    assert not [p.name for p in imported.parent.iterdir() if p.name.startswith(".")]  # no temporary folder left


def test_tools_sample_generates_from_it(imported, capsys):
    assert sample.main(["--checkpoint", str(imported), "--prompt", "hi", "--max-new-tokens", "5",
                        "--temperature", "0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("hi"), out


def test_init_from_fine_tunes_it(imported, tmp_path):
    corpus = tmp_path / "text"
    corpus.mkdir()
    for i in range(8):
        (corpus / f"doc{i}.txt").write_text(("a " if i % 2 else "b ") * 200)
    cfg = archlab.load_recipe(imported / "recipe.yaml", [
        "train.objective=classify", f"train.init_from={imported}", "train.objective.pooling=last",
        "train.objective.train_examples=64", "train.objective.eval_examples=16", "data.source=text",
        f"data.paths=[{corpus}]", "data.tokenizer=byte", "data.val_fraction=0.25", f"data.cache_dir={tmp_path}/cache",
        "train.seq_len=16", "train.micro_batch_size=4", "train.max_steps=2", "train.warmup_steps=0",
        "train.eval_every=2", "train.eval_batches=1", "train.eval_context_multipliers=[1]", f"train.out_dir={tmp_path}",
        "train.run_name=ft"])
    train(cfg)
    rows = read_jsonl(tmp_path / "ft" / "metrics.jsonl")
    assert [r["step"] for r in rows if r.get("kind") == "train"][-1] == 2
    meta = json.loads((tmp_path / "ft" / "env.json").read_text())["data_meta"]
    assert meta["init_from"].startswith(str(imported))


def test_a_tokenizer_without_endoftext_takes_the_configs_eos_id(tmp_path):
    folder = llama_folder(tmp_path, tokenizer=False)
    Tokenizer(models.WordLevel({"a": 0, "b": 1, "</s>": 2}, unk_token="a")).save(str(folder / "tokenizer.json"))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "eos_token_id": 2}))
    run = archlab.from_hf(folder, tmp_path / "run")
    assert load_recipe_of(resolve_checkpoint(run)).data.eot_id == 2
    (folder / "config.json").write_text(json.dumps({**config, "eos_token_id": None}))
    with pytest.raises(ValueError, match=r"tokenizer.json: no <\|endoftext\|> token and config.json has no "
                                         r"eos_token_id"):
        archlab.from_hf(folder, tmp_path / "run2")
