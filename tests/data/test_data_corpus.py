"""The train/validation split by document, max_bytes, and reading files as strict text."""

from __future__ import annotations

import pytest

from archlab.data.corpus import Corpus, DataError, Document, document_rank, read_text_file, split_corpus


def make_corpus(texts: dict[str, str]) -> Corpus:
    docs = [Document(name, len(t.encode("utf-8")), lambda t=t: t) for name, t in texts.items()]
    return Corpus("test", f"{len(docs)} test documents", docs, None)


def lines_doc(i: int, n_lines: int = 40) -> str:
    return "".join(f"document {i} line {j}: some text é\n" for j in range(n_lines))


TEXTS = {f"dir/file{i:02d}.txt": lines_doc(i) for i in range(40)}


def test_split_is_by_document_rank_and_ignores_listing_order():
    split = split_corpus(make_corpus(TEXTS), val_fraction=0.1, seed=0)
    reversed_split = split_corpus(make_corpus(dict(reversed(list(TEXTS.items())))), val_fraction=0.1, seed=0)
    assert split.train == reversed_split.train and split.val == reversed_split.val
    assert split.n_docs == {"train": 36, "val": 4}
    ranked = sorted(TEXTS, key=lambda n: document_rank(n, 0))
    assert split.val == [TEXTS[n] for n in ranked[:4]]  # whole documents, in rank order
    assert set(split.train).isdisjoint(split.val)
    assert sorted(split.train + split.val) == sorted(TEXTS.values())


def test_seed_changes_the_split():
    a = split_corpus(make_corpus(TEXTS), 0.1, seed=0)
    b = split_corpus(make_corpus(TEXTS), 0.1, seed=1)
    assert a.val != b.val


def test_max_bytes_caps_each_split_and_cuts_at_a_line():
    split = split_corpus(make_corpus(TEXTS), val_fraction=0.1, seed=0, max_bytes=5000)
    assert split.n_bytes["val"] <= 500 and split.n_bytes["train"] <= 4500
    assert split.n_bytes["train"] > 4000  # the cap is used, not just respected
    assert sum(len(t.encode()) for t in split.train) == split.n_bytes["train"]
    assert all(t.endswith("\n") for t in split.train + split.val)
    whole = split_corpus(make_corpus(TEXTS), val_fraction=0.1, seed=0)
    assert split.train[0] == whole.train[0]  # the cap takes documents in the same rank order
    assert whole.train[len(split.train) - 1].startswith(split.train[-1])


def test_a_single_document_is_cut_into_train_head_and_val_tail():
    text = lines_doc(0, 100)
    split = split_corpus(make_corpus({"only.txt": text}), val_fraction=0.2, seed=0)
    assert split.train[0] + split.val[0] == text
    assert split.train[0].endswith("\n")
    assert 0.75 < split.n_bytes["train"] / len(text.encode()) <= 0.8


def test_empty_corpus_is_an_error():
    with pytest.raises(DataError, match="empty corpus"):
        split_corpus(make_corpus({}), 0.1, 0)
    with pytest.raises(DataError, match="empty corpus"):
        split_corpus(make_corpus({"a.txt": "", "b.txt": ""}), 0.1, 0)


def test_a_one_line_single_document_is_too_small():
    with pytest.raises(DataError, match="too short to split"):
        split_corpus(make_corpus({"tiny.txt": "x"}), 0.1, 0)


def test_read_text_file_names_a_binary_or_non_utf8_file(tmp_path):
    good = tmp_path / "good.txt"
    good.write_text("héllo\n", encoding="utf-8")
    assert read_text_file(good) == "héllo\n"
    binary = tmp_path / "image.bin"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    with pytest.raises(DataError, match=r"image\.bin is not a text file"):
        read_text_file(binary)
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("caf\xe9\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"latin1\.txt is not UTF-8 text \(invalid byte at offset 3\)"):
        read_text_file(latin1)
