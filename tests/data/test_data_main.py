"""``python -m archlab.data``: prints a summary of the prepared data; bad input is one line, exit 2."""

from __future__ import annotations

from archlab.data.__main__ import main


def test_summary_of_a_prepared_corpus(text_recipe, root, capsys):
    overrides = ["data.source=text", f"data.paths=[{text_recipe.corpus}]", f"data.cache_dir={text_recipe.cache}",
                 "model.vocab_size=300"]
    assert main([str(root / "recipes" / "dense" / "tiny.yaml"), *overrides]) == 0
    out = capsys.readouterr().out
    assert "tokenizer  bpe, vocab 300" in out and "15 documents" in out and "nats/token" in out


def test_bad_input_is_one_line_and_exit_2(tmp_path, root, capsys):
    assert main([str(tmp_path / "missing.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: recipe file not found") and err.count("\n") == 1
    missing = tmp_path / "nowhere"
    code = main([str(root / "recipes" / "dense" / "tiny.yaml"), "data.source=text", f"data.paths=[{missing}]"])
    err = capsys.readouterr().err
    assert code == 2 and f"'{missing}' does not exist" in err and err.count("\n") == 1
