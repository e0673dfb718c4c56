"""What data preparation returns: a tokenizer and the token ids of both splits (a text cache's or token
shards'), and the version of the cache layout."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from archlab.data.tokenizer import Tokenizer

DATA_FORMAT_VERSION = 1  # bump when the cache layout or the split/encoding rules change


@dataclass
class PreparedData:
    """A tokenized corpus: the tokenizer and the two splits as 1-D memory-mapped id arrays."""

    tokenizer: Tokenizer  # token shards without a tokenizer: archlab.data.tokens.NoTokenizer
    train: np.ndarray  # (N_train,) uint16 or uint32 memmap (token shards: archlab.data.tokens.ShardedTokens)
    val: np.ndarray  # (N_val,)
    cache_path: Path
    meta: dict[str, Any]
