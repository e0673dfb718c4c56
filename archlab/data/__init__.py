"""Data: corpus -> train/validation split -> tokenizer -> cached token ids -> sharded batches.

    data = prepare_data(cfg)                    # cfg: a whole recipe (uses cfg.data, cfg.model.vocab_size);
                                                # archlab.objectives.token_data(cfg) leaves its objective's ids free
    data.tokenizer.encode("def f(): pass")      # -> list[int]
    batches = TokenBatches(data.train, seq_len, micro_batch_size, grad_accum, rank, world_size, seed)
    x_BS1 = batches.get(step, micro)            # (B, S+1): inputs x[:, :-1], targets x[:, 1:]

Sources (``data.source``): ``stdlib`` (Python's own source, no download), ``text``, ``hf``, and
``tokens`` (pre-tokenised shards read as memory maps: llm.c / modded-nanogpt, nanoGPT, archlab caches).
Tokenizers (``data.tokenizer``): ``bpe`` (byte-level BPE trained on the training split), ``byte``, or the
path of a Hugging Face ``tokenizers`` file (``tokenizer.json``).
"""

from archlab.data.batches import TokenBatches, check_length, eval_windows, unigram_entropy
from archlab.data.corpus import Corpus, DataError, Document, split_corpus
from archlab.data.prepare import DATA_FORMAT_VERSION, PreparedData, cache_key, prepare_data
from archlab.data.sources import SOURCES, build_corpus
from archlab.data.tokenizer import EOS, TOKENIZERS, Tokenizer, build_tokenizer, load_tokenizer_file
from archlab.data.tokens import ShardedTokens, prepare_tokens

__all__ = [
    "DATA_FORMAT_VERSION", "EOS", "SOURCES", "TOKENIZERS", "Corpus", "DataError", "Document",
    "PreparedData", "ShardedTokens", "TokenBatches", "Tokenizer", "build_corpus", "build_tokenizer", "cache_key",
    "check_length", "eval_windows", "load_tokenizer_file", "prepare_data", "prepare_tokens", "split_corpus",
    "unigram_entropy",
]
