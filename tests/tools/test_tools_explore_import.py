"""A Hugging Face GPT-2 imported with ``python -m tools.import_hf FOLDER --out RUN`` opens in the explorer: the
next-token probabilities /api/analyze gives for a prompt are the HF model's on the same ids."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tools.explore.encode import decode
from tools.explore.load import load
from tools.explore.prompt import NEUTRAL

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "def add(a, b):\n    return a + b"
EOT = "<|endoftext|>"


def _tokenizer(folder: Path) -> Tokenizer:
    """A byte-level BPE of ~300 ids trained here on a few lines (GPT-2's kind of tokenizer), saved as
    ``folder/tokenizer.json``."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([PROMPT, "def sub(a, b):\n    return a - b", "the cat sat on the mat"] * 10, trainer)
    tok.save(str(folder / "tokenizer.json"))
    return tok


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """(the HF model, its tokenizer, the archlab run folder it was imported into)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    tmp = tmp_path_factory.mktemp("gpt2")
    hf_dir = tmp / "hf"
    hf_dir.mkdir()
    tok = _tokenizer(hf_dir)
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=tok.get_vocab_size(), n_positions=64, n_embd=32, n_layer=2, n_head=2,
                     initializer_range=0.3,  # weights far from zero: probabilities far from uniform
                     bos_token_id=tok.token_to_id(EOT), eos_token_id=tok.token_to_id(EOT))
    hf = GPT2LMHeadModel(cfg).eval()
    hf.save_pretrained(hf_dir)
    run = tmp / "runs" / "gpt2-imported"
    r = subprocess.run([sys.executable, "-m", "tools.import_hf", str(hf_dir), "--out", str(run)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return hf, tok, run


def test_an_imported_gpt2_gives_the_hf_models_next_token_probabilities(imported):
    from starlette.testclient import TestClient

    from tools.explore.server import Explorer, app

    hf, tok, run = imported
    ex = load(run)
    answer = TestClient(app(Explorer([ex]), ["testserver"])).post("/api/analyze", json={"text": PROMPT}).json()
    data = answer["runs"][0]
    ids = tok.encode(PROMPT).ids
    assert [t["id"] for t in data["tokens"]] == ids
    with torch.no_grad():
        theirs_V = torch.softmax(hf(torch.tensor([ids])).logits[0, -1].double(), -1)
    ours_V = torch.softmax(torch.from_numpy(decode(data["next"]["logits"]).copy()).double(), -1)
    torch.testing.assert_close(ours_V, theirs_V, atol=1e-5, rtol=0)
    assert float(theirs_V.max()) > 5 / len(theirs_V)  # not a uniform answer, which any model would match


def test_an_imported_model_opens_on_a_neutral_prompt_and_says_why(imported):
    ex = load(imported[2])
    assert ex.prompt.text == NEUTRAL["decoder"] and "was imported from" in ex.prompt.note
