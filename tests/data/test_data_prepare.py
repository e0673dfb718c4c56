"""prepare_data: the cache is built once, reused when fresh, rebuilt when stale or broken, and a
failed build leaves nothing behind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from archlab.config import load_recipe
from archlab.data import EOS, DataError, prepare_data, unigram_entropy
from archlab.data import prepare as prepare_module


def cache_entries(cache_dir) -> list[str]:
    """The cache's folders and files, less the lock files that builders take turns on."""
    if not cache_dir.exists():
        return []
    return sorted(p.name for p in cache_dir.iterdir() if not p.name.endswith(".lock"))


def test_prepared_arrays_hold_the_encoded_splits(text_recipe):
    data = prepare_data(text_recipe())
    assert data.tokenizer.vocab_size == 320
    assert data.train.dtype == np.uint16 and isinstance(data.train, np.memmap)
    m = data.meta
    assert (len(data.train), len(data.val)) == (m["tokens"]["train"], m["tokens"]["val"])
    assert m["n_files"] == {"train": 15, "val": 1}  # 16 files, val_fraction 0.05 -> round(0.8) = 1
    assert sorted(p.name for p in data.cache_path.iterdir()) == ["meta.json", "tokenizer.json", "train.bin", "val.bin"]
    assert data.cache_path.name == f"text-{m['key'][:16]}"
    # documents are separated by EOS, and the ids decode back to the files' text
    eos = data.tokenizer.eos_id
    assert data.train[-1] == eos and int((data.train == eos).sum()) == 15
    val_text = data.tokenizer.decode(data.val.tolist())
    assert val_text.endswith(EOS)
    originals = {p.read_text() for p in text_recipe.corpus.rglob("*.txt")}
    assert val_text[:-len(EOS)] in originals
    assert 2.0 < unigram_entropy(data.train) < np.log(320)


def test_a_fresh_cache_is_reused_without_rebuilding(text_recipe, monkeypatch):
    first = prepare_data(text_recipe())

    def no_build(*args, **kwargs):
        raise AssertionError("rebuilt a fresh cache")

    monkeypatch.setattr(prepare_module, "_build", no_build)
    second = prepare_data(text_recipe())
    assert second.cache_path == first.cache_path
    assert np.array_equal(second.train, first.train)


def test_changed_content_or_settings_give_a_new_cache(text_recipe):
    base = prepare_data(text_recipe()).cache_path
    for override in ("data.seed=1", "data.val_fraction=0.2", "data.max_bytes=100000", "model.vocab_size=330"):
        assert prepare_data(text_recipe(override)).cache_path != base, override
    victim = text_recipe.corpus / "keyword.txt"
    victim.write_text(victim.read_text().replace("keyword", "KEYWORD"))  # same size, new content
    rebuilt = prepare_data(text_recipe())
    assert rebuilt.cache_path != base
    assert "KEYWORD" in rebuilt.tokenizer.decode(np.concatenate([rebuilt.train, rebuilt.val]).tolist())


@pytest.mark.parametrize("damage", ["no_meta", "truncated_ids", "other_key", "garbage_meta"])
def test_a_broken_cache_folder_is_rebuilt(text_recipe, damage):
    good = prepare_data(text_recipe())
    folder, n_train = good.cache_path, len(good.train)
    train_ids = np.array(good.train)
    del good
    if damage == "no_meta":
        (folder / "meta.json").unlink()
    elif damage == "truncated_ids":
        with open(folder / "train.bin", "r+b") as f:
            f.truncate(100)
    elif damage == "other_key":
        meta = json.loads((folder / "meta.json").read_text())
        (folder / "meta.json").write_text(json.dumps({**meta, "key": "0" * 64}))
    else:
        (folder / "meta.json").write_text("{")
    again = prepare_data(text_recipe())
    assert again.cache_path == folder and len(again.train) == n_train
    assert np.array_equal(again.train, train_ids)
    assert cache_entries(text_recipe.cache) == [folder.name]  # no stale or temporary folder left


def test_a_failed_build_leaves_no_cache(text_recipe):
    with pytest.raises(DataError, match=r"model\.vocab_size=60000 is larger than this corpus supports"):
        prepare_data(text_recipe("model.vocab_size=60000"))
    assert cache_entries(text_recipe.cache) == []


def test_a_binary_file_in_the_corpus_is_named_and_nothing_is_cached(text_recipe):
    (text_recipe.corpus / "json" / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" * 4)
    with pytest.raises(DataError, match=r"logo\.png is not a text file"):
        prepare_data(text_recipe())
    assert cache_entries(text_recipe.cache) == []


def test_seq_len_longer_than_the_data_is_a_clear_error(text_recipe):
    with pytest.raises(DataError, match=r"corpus too small for seq_len=40000: the validation split holds \d+ tokens"):
        prepare_data(text_recipe("train.seq_len=40000", "model.max_seq_len=40000"))


def test_byte_tokenizer_cache(text_recipe):
    data = prepare_data(text_recipe("data.tokenizer=byte", "model.vocab_size=512"))
    assert (data.tokenizer.vocab_size, data.tokenizer.eos_id) == (257, 256)
    assert data.meta["tokens"]["train"] == data.meta["bytes"]["train"] + data.meta["n_files"]["train"]
    assert data.train.max() <= 256


def test_stdlib_default_corpus_with_a_byte_cap(tmp_path):
    cfg = load_recipe(None, [f"data.cache_dir={tmp_path}", "data.max_bytes=200000", "model.vocab_size=384"])
    data = prepare_data(cfg)
    m = data.meta
    assert m["source"] == "stdlib" and "standard library" in m["corpus"]
    assert m["bytes"]["train"] + m["bytes"]["val"] <= 200_000
    assert m["bytes"]["val"] <= 10_000 < m["bytes"]["train"]
    assert m["tokens"]["train"] < 0.6 * m["bytes"]["train"]  # BPE compresses Python source
    assert prepare_data(cfg).cache_path == data.cache_path


def test_a_crash_while_encoding_leaves_no_cache_and_the_next_run_builds(text_recipe, monkeypatch):
    real_write_ids = prepare_module._write_ids

    def crash_on_val(tokenizer, texts, path, dtype):
        if path.name == "val.bin":
            raise KeyboardInterrupt  # e.g. Ctrl-C after train.bin was written
        return real_write_ids(tokenizer, texts, path, dtype)

    monkeypatch.setattr(prepare_module, "_write_ids", crash_on_val)
    with pytest.raises(KeyboardInterrupt):
        prepare_data(text_recipe())
    assert cache_entries(text_recipe.cache) == []
    monkeypatch.setattr(prepare_module, "_write_ids", real_write_ids)
    assert len(prepare_data(text_recipe()).val) > 0


def test_a_leftover_temporary_folder_is_never_used(text_recipe):
    folder = prepare_data(text_recipe()).cache_path
    leftover = folder.with_name(f".{folder.name}.tmp-99999-deadbeef")  # as a killed build leaves it
    folder.rename(leftover)
    (leftover / "train.bin").write_bytes(b"")
    data = prepare_data(text_recipe())
    assert data.cache_path == folder and len(data.train) > 0


def test_token_dtype_and_encoding_in_chunks(text_recipe, monkeypatch):
    assert prepare_module.token_dtype(2**16) == np.uint16 and prepare_module.token_dtype(2**16 + 1) == np.uint32
    whole = prepare_data(text_recipe())
    train_ids = np.array(whole.train)
    monkeypatch.setattr(prepare_module, "ENCODE_CHUNK_CHARS", 1000)  # many small encode_batch calls
    chunked = prepare_data(text_recipe("data.cache_dir=" + str(text_recipe.cache / "chunked")))
    assert np.array_equal(chunked.train, train_ids)
    assert chunked.meta["dtype"] == "<u2"


WORKER = """
import sys
from archlab.config import load_recipe
from archlab.data import prepare_data
built = []
data = prepare_data(load_recipe(None, sys.argv[1:]), progress=built.append)
print("built" if any("building the token cache" in m for m in built) else "loaded", len(data.train), data.cache_path)
"""


def test_parallel_runs_needing_one_missing_cache_build_it_once(text_recipe):
    # a sweep's --jobs N runs start together on a cache nobody has built: one builds, the others load it
    overrides = [
        "data.source=text", f"data.paths=[{text_recipe.corpus}]", f"data.cache_dir={text_recipe.cache}",
        "model.vocab_size=320", "train.seq_len=32",
    ]
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, *overrides], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    results = [(p.wait(timeout=300), *p.communicate()) for p in procs]
    assert [rc for rc, _, _ in results] == [0] * 4, [err for _, _, err in results]
    lines = sorted(out.split() for _, out, _ in results)
    assert [line[0] for line in lines] == ["built", "loaded", "loaded", "loaded"]
    assert len({tuple(line[1:]) for line in lines}) == 1  # one folder, one length
    assert cache_entries(text_recipe.cache) == [Path(lines[0][2]).name]
