"""Tokenizers: byte-level BPE trained to an exact size, the byte tokenizer, save/load, round trips."""

from __future__ import annotations

import pytest

from archlab.data.corpus import DataError
from archlab.data.sources import stdlib_root
from archlab.data.tokenizer import EOS, TOKENIZERS, ByteTokenizer, Tokenizer, build_tokenizer

SAMPLE = "déf f(x):\n    return x ** 2  # 日本語, emoji 🙂, tab\t<|endoftext|> end\n\n"


@pytest.fixture(scope="module")
def train_texts() -> list[str]:
    return [(stdlib_root() / name).read_text() for name in ("textwrap.py", "string.py", "shlex.py")]


@pytest.fixture(scope="module")
def bpe(train_texts) -> Tokenizer:
    return build_tokenizer("bpe", train_texts, 400)


def test_registry_names_every_tokenizer():
    assert TOKENIZERS.names() == ["bpe", "byte"]
    with pytest.raises(DataError, match="unknown tokenizer type 'sentencepiece'"):
        build_tokenizer("sentencepiece", [], 300)


def test_bpe_has_exactly_the_requested_vocab_and_round_trips(bpe, train_texts):
    assert bpe.vocab_size == 400
    assert bpe.decode([bpe.eos_id]) == EOS
    for text in (SAMPLE, train_texts[0][:2000], ""):
        assert bpe.decode(bpe.encode(text)) == text
    # merges were learned: common code compresses well below one token per byte
    ids = bpe.encode(train_texts[0])
    assert len(ids) < 0.6 * len(train_texts[0].encode())


def test_endoftext_inside_a_text_is_plain_text(bpe):
    ids = bpe.encode("a <|endoftext|> b")
    assert bpe.eos_id not in ids
    assert bpe.decode(ids) == "a <|endoftext|> b"


def test_encode_batch_equals_encode(bpe, train_texts):
    texts = [SAMPLE, train_texts[1][:3000]]
    assert bpe.encode_batch(texts) == [bpe.encode(t) for t in texts]


def test_save_and_load_give_the_same_tokenizer(bpe, tmp_path):
    bpe.save(tmp_path / "tokenizer.json")
    assert [p.name for p in tmp_path.iterdir()] == ["tokenizer.json"]  # no temporary file left
    loaded = Tokenizer.load(tmp_path / "tokenizer.json")
    assert (loaded.vocab_size, loaded.eos_id) == (bpe.vocab_size, bpe.eos_id)
    assert loaded.encode(SAMPLE) == bpe.encode(SAMPLE)
    assert bpe.eos_id not in loaded.encode("x<|endoftext|>y")  # the plain-text rule survives loading


def test_load_of_a_bad_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    with pytest.raises(DataError, match="cannot load tokenizer"):
        Tokenizer.load(bad)


def test_bpe_larger_than_the_corpus_supports_names_both_sizes():
    with pytest.raises(DataError, match=r"model\.vocab_size=5000 is larger than this corpus supports \(\d+ tokens"):
        build_tokenizer("bpe", ["tiny corpus, few merges\n"], 5000)


def test_byte_tokenizer_ids_are_the_utf8_bytes():
    tok = build_tokenizer("byte", [], 300)
    assert (tok.vocab_size, tok.eos_id) == (257, 256)
    ids = tok.encode(SAMPLE)
    assert ids == list(SAMPLE.encode("utf-8"))
    assert tok.decode(ids + [256]) == SAMPLE + EOS
    assert tok.decode([104, 105, 300, 195]) == "hi\ufffd"  # id 300: a model row past the vocabulary
    assert tok.decode(tok.encode(bytes(range(128)).decode())) == bytes(range(128)).decode()
    assert tok.encode_batch([SAMPLE, "é"]) == [e.ids for e in tok.backend.encode_batch([SAMPLE, "é"])]
    with pytest.raises(DataError, match="needs 257 ids"):
        build_tokenizer("byte", [], 256)


def test_load_gives_back_the_kind_that_was_saved(bpe, tmp_path):
    build_tokenizer("byte", [], 257).save(tmp_path / "byte.json")
    bpe.save(tmp_path / "bpe.json")
    assert type(Tokenizer.load(tmp_path / "byte.json")) is ByteTokenizer
    assert type(Tokenizer.load(tmp_path / "bpe.json")) is Tokenizer
