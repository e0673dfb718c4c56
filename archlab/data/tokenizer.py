"""Tokenizers, by ``data.tokenizer``: ``bpe`` (byte-level BPE trained here), ``byte`` (raw bytes), or
the path of a Hugging Face ``tokenizers`` file (``*.json``, e.g. GPT-2's ``tokenizer.json``).

All are ``tokenizers`` library objects behind one small :class:`Tokenizer` wrapper, saved as the
library's own ``tokenizer.json``:

- ``bpe``: GPT-2-style byte-level BPE (ByteLevel pre-tokenizer and decoder, the 256-symbol byte
  alphabet, ``<|endoftext|>`` as the only special token), trained on the training split to exactly
  ``model.vocab_size`` entries.
- ``byte``: id = byte value (0-255), ``<|endoftext|>`` = 256; no training. A model may have a larger
  vocabulary than these 257 ids (the extra rows are never targets).
- a tokenizer file: loaded with ``tokenizers.Tokenizer.from_file`` (:func:`load_tokenizer_file`),
  never trained; its end-of-text id is ``data.eot_id`` or its ``<|endoftext|>`` token. The model's
  vocabulary may be larger than the file's (padding, e.g. GPT-2's 50257 ids in 50304 rows), never
  smaller. It is saved byte for byte as it was read.

Any text round-trips exactly: ``decode(encode(s)) == s``. The string ``<|endoftext|>`` inside a text
is encoded as plain text; the end-of-text id is only ever inserted between documents.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from archlab.data.corpus import DataError
from archlab.registry import Registry

EOS = "<|endoftext|>"
BYTE_VOCAB_SIZE = 257  # 256 byte values + EOS

TOKENIZERS: Registry = Registry("tokenizer")  # name -> (train_texts, vocab_size) -> Tokenizer


class Tokenizer:
    """Text <-> token ids. ``vocab_size`` counts every id, ``eos_id`` separates documents.

    ``eos_id`` defaults to the id of ``<|endoftext|>``; a tokenizer without that token needs it
    given (``require_eos=False`` accepts none: ``eos_id`` is then None). ``source_json``, when set,
    is what :meth:`save` writes (a user's tokenizer file is kept byte for byte).
    """

    def __init__(self, backend: tokenizers.Tokenizer, eos_id: Optional[int] = None, require_eos: bool = True,
                 source_json: Optional[bytes] = None):
        backend.encode_special_tokens = True  # "<|endoftext|>" in a text stays text (not saved in json)
        self.backend = backend
        self.vocab_size: int = backend.get_vocab_size()
        eos = backend.token_to_id(EOS) if eos_id is None else int(eos_id)
        if eos is None and require_eos:
            raise DataError(f"tokenizer has no {EOS} token: not an archlab tokenizer "
                            "(for another tokenizer file, set data.eot_id to its end-of-text id)")
        if eos is not None and not 0 <= eos < self.vocab_size:
            raise DataError(f"end-of-text id {eos} is outside the tokenizer's {self.vocab_size} ids")
        self.eos_id: Optional[int] = eos
        self.source_json = source_json

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Encode many documents at once (the library's multithreaded path)."""
        return [e.ids for e in self.backend.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``. An end-of-text id shows as ``<|endoftext|>``; ids beyond the vocabulary
        (a model may have more rows) are skipped; bytes that are not valid UTF-8 show as U+FFFD."""
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=False)

    def save(self, path: Union[str, Path]) -> None:
        """Write ``tokenizer.json`` atomically (tmp file + rename): the file it was read from, byte for
        byte, for a tokenizer file (:func:`load_tokenizer_file`); else the library's serialisation."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        if self.source_json is not None:
            tmp.write_bytes(self.source_json)
        else:
            self.backend.save(str(tmp))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Union[str, Path], eos_id: Optional[int] = None, require_eos: bool = True) -> "Tokenizer":
        """A saved tokenizer; a byte vocabulary comes back as a :class:`ByteTokenizer`."""
        try:
            backend = tokenizers.Tokenizer.from_file(str(path))
        except Exception as e:  # the library raises bare Exception on a bad file
            raise DataError(f"cannot load tokenizer {path}: {e}") from None
        if backend.get_vocab() == byte_vocab():
            return ByteTokenizer(backend, eos_id)
        return Tokenizer(backend, eos_id, require_eos)

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, eos_id={self.eos_id})"


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's map from the 256 byte values to printable characters, as used by ByteLevel."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    chars = printable + [256 + i for i in range(len(others))]
    return dict(zip(printable + others, map(chr, chars)))


def byte_vocab() -> dict[str, int]:
    """The byte tokenizer's vocabulary: ByteLevel character of byte b -> b, and EOS -> 256."""
    return {**{char: byte for byte, char in byte_to_unicode().items()}, EOS: 256}


class ByteTokenizer(Tokenizer):
    """The byte tokenizer: the same ids as its ``tokenizers`` backend, encoded directly from UTF-8
    (with one id per byte, the library's per-token bookkeeping would dominate the encoding time)."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [list(t.encode("utf-8")) for t in texts]


def _byte_level(model: models.Model) -> tokenizers.Tokenizer:
    backend = tokenizers.Tokenizer(model)
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return backend


@TOKENIZERS.register("bpe")
def train_bpe(texts: Sequence[str], vocab_size: int) -> Tokenizer:
    """Train a byte-level BPE of exactly ``vocab_size`` ids on ``texts``.

    Raises :class:`DataError` when the texts support fewer merges than that.
    """
    backend = _byte_level(models.BPE())
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(texts, trainer, length=len(texts))
    got = backend.get_vocab_size()
    if got < vocab_size:
        raise DataError(f"model.vocab_size={vocab_size} is larger than this corpus supports "
                        f"({got} tokens after every possible merge); lower model.vocab_size or add data")
    return Tokenizer(backend)


@TOKENIZERS.register("byte")
def byte_tokenizer(texts: Sequence[str], vocab_size: int) -> Tokenizer:
    """Raw UTF-8 bytes: id = byte value, EOS = 256. ``texts`` are not needed."""
    if vocab_size < BYTE_VOCAB_SIZE:
        raise DataError(f"model.vocab_size={vocab_size}: the byte tokenizer needs {BYTE_VOCAB_SIZE} ids "
                        "(256 bytes + end-of-text); raise model.vocab_size")
    vocab = {char: byte for byte, char in byte_to_unicode().items()}
    backend = _byte_level(models.BPE(vocab=vocab, merges=[]))
    backend.add_special_tokens([EOS])
    return ByteTokenizer(backend)


def is_tokenizer_file(kind: str) -> bool:
    """Whether ``data.tokenizer`` names a tokenizer file (``*.json``) rather than a tokenizer archlab makes."""
    return str(kind).endswith(".json") and str(kind) not in TOKENIZERS.names()


def load_tokenizer_file(path: Union[str, Path], eos_id: Optional[int] = None, require_eos: bool = True,
                        key: str = "data.tokenizer") -> Tokenizer:
    """A Hugging Face ``tokenizers`` file (``tokenizer.json``), kept byte for byte for :meth:`Tokenizer.save`.

    The end-of-text id is ``eos_id`` when given, else the file's ``<|endoftext|>`` token; a file
    without one is refused (``require_eos``) with the advice to set ``data.eot_id``.
    """
    path = Path(os.path.expanduser(str(path)))
    if not path.is_file():
        raise DataError(f"{key}={str(path)!r}: no such file (give bpe, byte or the path of a tokenizer.json, "
                        "e.g. the one in a local snapshot of the gpt2 model)")
    try:
        raw = path.read_bytes()
        backend = tokenizers.Tokenizer.from_str(raw.decode("utf-8"))
    except Exception as e:  # the library raises bare Exception on a bad file
        raise DataError(f"{key}={str(path)!r}: not a Hugging Face tokenizers file ({e})") from None
    if eos_id is None and backend.token_to_id(EOS) is None and require_eos:
        raise DataError(f"{key}={str(path)!r}: the tokenizer has no {EOS} token; set data.eot_id to its "
                        "end-of-text id (e.g. the id of </s>)")
    kind = ByteTokenizer if backend.get_vocab() == byte_vocab() else Tokenizer
    try:
        return kind(backend, eos_id, require_eos, source_json=raw)
    except DataError as e:
        raise DataError(f"{key}={str(path)!r}: {e} (data.eot_id={eos_id})") from None


def check_model_vocab(model_vocab_size: int, tokenizer: Tokenizer, where: str) -> None:
    """A model needs a row for every id of its tokenizer; more rows (padding) are allowed."""
    if model_vocab_size < tokenizer.vocab_size:
        raise DataError(f"model.vocab_size={model_vocab_size} is smaller than the tokenizer's vocabulary "
                        f"({tokenizer.vocab_size} ids in {where}): set model.vocab_size >= {tokenizer.vocab_size} "
                        "(a larger vocabulary is padding, e.g. GPT-2's 50257 ids in 50304 rows)")


def build_tokenizer(kind: str, texts: Sequence[str], vocab_size: int, eos_id: Optional[int] = None) -> Tokenizer:
    """Train (or make) the tokenizer named ``kind`` on the training texts; a tokenizer file is
    loaded instead (``vocab_size`` is then the model's and must hold the file's vocabulary)."""
    if is_tokenizer_file(kind):
        tokenizer = load_tokenizer_file(kind, eos_id)
        check_model_vocab(vocab_size, tokenizer, str(kind))
        return tokenizer
    try:
        make: Callable[[Sequence[str], int], Tokenizer] = TOKENIZERS.get(kind)
    except KeyError as e:
        raise DataError(f"data.tokenizer={kind!r}: {e.args[0]}") from None
    return make(texts, vocab_size)
