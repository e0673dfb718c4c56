"""``data.tokenizer: <path to tokenizer.json>``: a Hugging Face ``tokenizers`` file instead of a BPE
trained here; the model's vocabulary may pad it, never cut it; the cache keeps it byte for byte."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import tokenizers

import archlab
from archlab.config import RecipeError
from archlab.data import DataError, Tokenizer, load_tokenizer_file, prepare_data
from tests.data.conftest import write_tokenizer_json


def test_text_is_encoded_with_the_file_and_the_cache_keeps_it_byte_for_byte(text_recipe, tokenizer_json):
    data = prepare_data(text_recipe(f"data.tokenizer={tokenizer_json}", "model.vocab_size=320"))  # 20 rows padding
    tok = tokenizers.Tokenizer.from_file(str(tokenizer_json))
    assert data.tokenizer.vocab_size == 300 and data.tokenizer.eos_id == 299 == tok.token_to_id("<|endoftext|>")
    assert (data.cache_path / "tokenizer.json").read_bytes() == tokenizer_json.read_bytes()
    assert data.meta["tokenizer"] == {"kind": str(tokenizer_json), "vocab_size": 300, "eos_id": 299}
    ids = np.asarray(data.train)
    assert ids.max() < 300 and (ids == 299).sum() == data.meta["n_files"]["train"]  # one EOS after each document
    first_doc = ids[:int(np.argmax(ids == 299))]
    assert data.tokenizer.decode(first_doc.tolist()) == tok.decode(first_doc.tolist())
    assert list(first_doc[:50]) == tok.encode(data.tokenizer.decode(first_doc.tolist())).ids[:50]
    again = prepare_data(text_recipe(f"data.tokenizer={tokenizer_json}", "model.vocab_size=320"))
    assert again.cache_path == data.cache_path  # reused
    run_copy = data.cache_path.parent / "run-tokenizer.json"
    again.tokenizer.save(run_copy)  # what the trainer does for the run folder
    assert run_copy.read_bytes() == tokenizer_json.read_bytes()


def test_the_cache_is_keyed_by_the_files_content_not_its_path(text_recipe, tokenizer_json, tmp_path):
    base = prepare_data(text_recipe(f"data.tokenizer={tokenizer_json}", "model.vocab_size=320")).cache_path
    moved = shutil.copy(tokenizer_json, tmp_path / "elsewhere.json")
    assert prepare_data(text_recipe(f"data.tokenizer={moved}", "model.vocab_size=320")).cache_path == base
    other = write_tokenizer_json(tmp_path / "other" / "tokenizer.json", vocab_size=310)
    assert prepare_data(text_recipe(f"data.tokenizer={other}", "model.vocab_size=320")).cache_path != base
    bpe = prepare_data(text_recipe("model.vocab_size=320")).cache_path
    assert bpe != base


def test_a_model_vocabulary_smaller_than_the_tokenizers_is_refused(text_recipe, tokenizer_json):
    with pytest.raises(DataError, match=r"model.vocab_size=299 is smaller than the tokenizer's vocabulary "
                                        r"\(300 ids in .*tokenizer.json\): set model.vocab_size >= 300"):
        prepare_data(text_recipe(f"data.tokenizer={tokenizer_json}", "model.vocab_size=299"))
    prepare_data(text_recipe(f"data.tokenizer={tokenizer_json}", "model.vocab_size=300"))  # equal: fine


def test_a_missing_or_broken_file_is_named(text_recipe, tmp_path):
    with pytest.raises(DataError, match=r"data.tokenizer='.*nope.json': no such file"):
        prepare_data(text_recipe(f"data.tokenizer={tmp_path / 'nope.json'}"))
    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "a tokenizer"}')
    with pytest.raises(DataError, match=r"data.tokenizer='.*bad.json': not a Hugging Face tokenizers file"):
        prepare_data(text_recipe(f"data.tokenizer={bad}"))


def test_recipe_rules_for_the_tokenizer_key():
    with pytest.raises(RecipeError, match=r"data.tokenizer='sentencepiece': must be bpe, byte or the path of a "):
        archlab.load_recipe(None, ["data.tokenizer=sentencepiece"])
    archlab.load_recipe(None, ["data.tokenizer=gpt2/tokenizer.json", "model.vocab_size=100"])  # read at data time
    with pytest.raises(RecipeError, match=r"data.eot_id=7: only used when data.source is tokens or data.tokenizer "
                                          r"is a tokenizer file"):
        archlab.load_recipe(None, ["data.eot_id=7"])
    with pytest.raises(RecipeError, match=r"data.eot_id=5000: must lie in \[0, model.vocab_size=4096\)"):
        archlab.load_recipe(None, ["data.tokenizer=t.json", "data.eot_id=5000"])


def test_a_tokenizer_without_endoftext_needs_data_eot_id(text_recipe, tmp_path):
    path = write_tokenizer_json(tmp_path / "llama-like" / "tokenizer.json", vocab_size=300, eos="</s>")
    with pytest.raises(DataError, match=r"has no <\|endoftext\|> token; set data.eot_id"):
        prepare_data(text_recipe(f"data.tokenizer={path}"))
    data = prepare_data(text_recipe(f"data.tokenizer={path}", "data.eot_id=299"))
    assert data.tokenizer.eos_id == 299 and (np.asarray(data.train) == 299).sum() == data.meta["n_files"]["train"]
    again = prepare_data(text_recipe(f"data.tokenizer={path}", "data.eot_id=299"))  # reloaded from the cache
    assert again.cache_path == data.cache_path and again.tokenizer.eos_id == 299
    assert prepare_data(text_recipe(f"data.tokenizer={path}", "data.eot_id=3")).cache_path != data.cache_path


def test_load_tokenizer_file_and_tokenizer_load(tokenizer_json, tmp_path):
    tok = load_tokenizer_file(tokenizer_json)
    assert tok.vocab_size == 300 and tok.eos_id == 299 and tok.decode(tok.encode("x = 1")) == "x = 1"
    assert Tokenizer.load(tokenizer_json).eos_id == 299
    no_eos = write_tokenizer_json(tmp_path / "t" / "tokenizer.json", eos="</s>")
    assert Tokenizer.load(no_eos, require_eos=False).eos_id is None
    assert Tokenizer.load(no_eos, eos_id=12).eos_id == 12
    with pytest.raises(DataError, match="end-of-text id 300 is outside the tokenizer's 300 ids"):
        load_tokenizer_file(tokenizer_json, eos_id=300)
