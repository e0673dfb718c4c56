"""``python -m tools.sample``: continuation from a recipe; user mistakes exit 2 without a traceback."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tools import sample

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "recipes/llama/tiny.yaml")


def test_prints_prompt_and_continuation(capsys):
    rc = sample.main(["--recipe", TINY, "--prompt", "def f(x):", "--max-new-tokens", "5", "--temperature", "0",
                      "model.n_layers=1", "model.vocab_size=300"])
    out = capsys.readouterr().out
    assert rc == 0 and out.startswith("def f(x):") and len(out) > len("def f(x):\n")


def test_seed_makes_samples_reproducible_and_num_samples_counts():
    args = ["--recipe", TINY, "--prompt", "ab", "--max-new-tokens", "6", "--top-k", "20", "--top-p", "0.9",
            "--num-samples", "3", "--seed", "7", "model.n_layers=1", "model.vocab_size=300"]
    a = sample.sample(sample.parse_args(args))
    b = sample.sample(sample.parse_args(args))
    assert a == b and len(a) == 3


def test_byte_codec_round_trip_and_unknown_ids():
    codec = sample.ByteCodec()
    text = "héllo ✓"
    assert codec.decode(codec.encode(text)) == text
    assert codec.decode([104, 300, 105]) == "h<|300|>i"


@pytest.mark.parametrize("argv,message", [
    (["--recipe", TINY, "model.n_heads=5"], "model.n_heads=5"),
    (["--recipe", TINY, "--top-p", "0"], "--top-p=0.0"),
    (["--recipe", TINY, "--temperature", "-1"], "--temperature=-1.0"),
    (["--recipe", "no/such/recipe.yaml"], "recipe file not found"),
    (["--checkpoint", "no/such/run"], "checkpoint not found"),
    (["--recipe", str(ROOT / "recipes/dense/tiny.yaml"), "--max-new-tokens", "2000"], "model.max_seq_len=1024"),
])
def test_user_mistakes_exit_2_with_a_message(argv, message, capsys):
    assert sample.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_cli_process_exits_2_without_traceback():
    proc = subprocess.run([sys.executable, "-m", "tools.sample", "--recipe", TINY, "model.d_model=-1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "model.d_model=-1: must be a positive number" in proc.stderr and "Traceback" not in proc.stderr


def fake_run(tmp_path, monkeypatch):
    """A run folder with a byte tokenizer, and a checkpoint loader that returns a small model."""
    import archlab.train.checkpoint as checkpoint
    from archlab.data.tokenizer import build_tokenizer

    run = tmp_path / "run"
    (run / "checkpoints" / "step_00000001").mkdir(parents=True)
    build_tokenizer("byte", [], 257).save(run / "tokenizer.json")
    cfg = sample.archlab.load_recipe(TINY, ["model.n_layers=1", "model.vocab_size=257", "data.tokenizer=byte"])
    model = sample.archlab.build_model(cfg)
    monkeypatch.setattr(checkpoint, "load_model", lambda path: (model, cfg))
    return run, model


def test_checkpoint_uses_the_runs_tokenizer(tmp_path, monkeypatch, capsys):
    run, _ = fake_run(tmp_path, monkeypatch)
    assert sample.find_tokenizer_file(run / "checkpoints" / "step_00000001") == run / "tokenizer.json"
    rc = sample.main(["--checkpoint", str(run), "--prompt", "hi", "--max-new-tokens", "4", "--temperature", "0"])
    assert rc == 0 and capsys.readouterr().out.startswith("hi")
    assert sample.main(["--checkpoint", str(run), "model.n_layers=2"]) == 2
    assert "overrides apply to --recipe only" in capsys.readouterr().err


def test_export_from_checkpoint_carries_the_tokenizer(tmp_path, monkeypatch, capsys):
    from transformers import AutoTokenizer

    from tools import export_hf

    run, _ = fake_run(tmp_path, monkeypatch)
    out = tmp_path / "hf"
    assert export_hf.main(["--checkpoint", str(run), "--out", str(out), "--verify"]) == 0
    tok = AutoTokenizer.from_pretrained(out)
    assert tok("hé").input_ids == list("hé".encode()) and tok.eos_token_id == 256


T5 = str(ROOT / "recipes/t5/tiny.yaml")


def test_an_encoder_decoder_fills_the_prompts_spans(capsys):
    rc = sample.main(["--recipe", T5, "--prompt", "def f(x): <extra_id_0> x <extra_id_1>", "--max-new-tokens", "8",
                      "--num-samples", "2", "model.vocab_size=300"])
    out = capsys.readouterr()
    assert rc == 0 and "Traceback" not in out.err
    samples = [line for line in out.out.splitlines() if not line.startswith("--- sample")]
    assert len(samples) == 2 and all(re.fullmatch(r"def f\(x\): \[.*\] x \[.*\]", s, re.S) for s in samples)


def test_span_filling_reads_each_span_behind_its_sentinel():
    codec, V = sample.ByteCodec(), 300
    ids, sentinels = sample.encode_spans(codec, "a<extra_id_0>b<extra_id_1>", V)
    assert ids == [ord("a"), V - 2, ord("b"), V - 3] and sentinels == [V - 2, V - 3]
    out = [V - 1, V - 2, ord("x"), ord("y"), V - 3, ord("z"), V - 4, ord("w")]  # a third sentinel ends the output
    assert sample.fill_spans(codec, "a<extra_id_0>b<extra_id_1>", out, V) == "a[xy]b[z]"


def test_an_encoder_decoder_prompt_without_a_mark_is_refused(capsys):
    assert sample.main(["--recipe", T5, "--prompt", "def f(x):", "model.vocab_size=300"]) == 2
    err = capsys.readouterr().err
    assert "--prompt has no <extra_id_N> mark" in err and "Traceback" not in err


def test_generate_names_generate_seq2seq_for_an_encoder_decoder():
    model = sample.archlab.build_model(sample.archlab.load_recipe(T5, ["model.vocab_size=300"]))
    with pytest.raises(ValueError, match="generate_seq2seq"):
        sample.archlab.generate(model, torch.tensor([[1, 2]]), 2)
