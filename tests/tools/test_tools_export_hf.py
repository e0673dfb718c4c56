"""``python -m tools.export_hf``: a recipe becomes a folder transformers loads; refusals exit 2."""

from pathlib import Path

from tools import export_hf

ROOT = Path(__file__).resolve().parents[2]


def test_export_and_verify(tmp_path, capsys):
    out = tmp_path / "gpt"
    rc = export_hf.main(["--recipe", str(ROOT / "recipes/dense/tiny.yaml"), "--out", str(out), "--verify",
                         "model.n_layers=1", "model.vocab_size=300"])
    text = capsys.readouterr().out
    assert rc == 0 and "GPT2LMHeadModel" in text and "verified" in text
    assert (out / "model.safetensors").is_file()
    assert export_hf.main(["--recipe", str(ROOT / "recipes/dense/tiny.yaml"), "--out", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err


def test_inexpressible_model_exits_2_with_the_reason(tmp_path, capsys):
    rc = export_hf.main(["--recipe", str(ROOT / "recipes/dense/tiny-alibi.yaml"), "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert rc == 2 and "position.type=alibi" in err and "Traceback" not in err
    assert not (tmp_path / "x").exists()
