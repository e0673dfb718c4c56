"""Data: corpus -> train/validation split -> tokenizer -> cached token ids -> sharded batches.

    data = prepare_data(cfg)                    # cfg: a whole recipe (uses cfg.data, cfg.model.vocab_size)
    data.tokenizer.encode("def f(): pass")      # -> list[int]
    batches = TokenBatches(data.train, seq_len, micro_batch_size, grad_accum, rank, world_size, seed)
    x_BS1 = batches.get(step, micro)            # (B, S+1): inputs x[:, :-1], targets x[:, 1:]

Sources (``data.source``): ``stdlib`` (Python's own source, no download), ``text``, ``hf``.
Tokenizers (``data.tokenizer``): ``bpe`` (byte-level BPE trained on the training split), ``byte``.
"""

from archlab.data.batches import TokenBatches, check_length, eval_windows, unigram_entropy
from archlab.data.corpus import Corpus, DataError, Document, split_corpus
from archlab.data.prepare import DATA_FORMAT_VERSION, PreparedData, cache_key, prepare_data
from archlab.data.sources import SOURCES, build_corpus
from archlab.data.tokenizer import EOS, TOKENIZERS, Tokenizer, build_tokenizer

__all__ = [
    "DATA_FORMAT_VERSION", "EOS", "SOURCES", "TOKENIZERS", "Corpus", "DataError", "Document",
    "PreparedData", "TokenBatches", "Tokenizer", "build_corpus", "build_tokenizer", "cache_key",
    "check_length", "eval_windows", "prepare_data", "split_corpus", "unigram_entropy",
]
