"""``python -m tools.export_hf``: a recipe becomes a folder transformers loads; refusals exit 2."""

from pathlib import Path

import pytest

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


@pytest.mark.parametrize("recipe", ["tiny", "s"])
def test_a_refused_deepseek_recipe_is_pointed_at_v3_tiny_in_one_line(tmp_path, capsys, recipe):
    rc = export_hf.main(["--recipe", str(ROOT / f"recipes/deepseek/{recipe}.yaml"), "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert f"deepseek-{recipe} cannot be exported as DeepseekV3ForCausalLM: attention.type=" in err
    assert "python -m archlab.train recipes/deepseek/v3-tiny.yaml" in err


def test_help_says_it_exports_dense_and_moe_families(capsys):
    from tools.export_hf import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "dense or MoE" in out
    for hf in ("GPT2LMHeadModel", "LlamaForCausalLM", "MixtralForCausalLM", "Qwen3MoeForCausalLM",
               "DeepseekV3ForCausalLM", "BertForMaskedLM", "T5ForConditionalGeneration"):
        assert hf in out


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="DeepSpeed warns only where it finds no GPU")
def test_no_deepspeed_accelerator_warning_in_the_output(tmp_path, root):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    proc = subprocess.run([sys.executable, "-m", "tools.export_hf", "--recipe", "recipes/llama/tiny.yaml",
                           "--out", str(tmp_path / "out"), "model.n_layers=1"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "LlamaForCausalLM" in proc.stderr + proc.stdout
    assert "Setting accelerator" not in proc.stderr + proc.stdout
