"""The prompt the explorer opens with: the start of the model's own validation split, so that a model trained
on Python code opens on Python code. BERT gets a ``[MASK]`` and T5 a sentinel span in place of one word. Where
no corpus can be read (a run folder without the ``env.json`` training writes, e.g. an imported model; a corpus
that is not on this machine), a neutral sentence, and a note saying why."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from archlab.checkpoints import RUN_MARKER
from archlab.data import build_corpus, split_corpus
from archlab.data.tokens import prepare_tokens
from archlab.errors import RecipeError
from archlab.train.run_folder import ENV

WINDOW = 48  # tokens of the validation split the prompt starts from (at most half the model's context)
READ_BYTES = 8192  # bytes of the first validation document read (a window of 48 tokens is far shorter)
NEUTRAL = {"decoder": "The cat sat on the", "encoder": "The cat sat on the [MASK].",
           "encoder_decoder": "The cat <extra_id_0> on the mat."}
GAP = {"encoder": "[MASK]", "encoder_decoder": "<extra_id_0>"}  # what replaces one word of the window
WORD = re.compile(r"[A-Za-z_][A-Za-z_0-9]+")


@dataclass
class DefaultPrompt:
    text: str
    note: str  # one line: where the text comes from, or why it is the neutral one


def trained_here(run_dir: Optional[Path]) -> Optional[str]:
    """None when the recipe's ``data`` says what the model was trained on (a recipe, or a run folder whose
    ``env.json`` records its data), else why not."""
    if run_dir is None:
        return None
    imported = _json(run_dir / RUN_MARKER).get("imported_from")
    if imported:
        source = imported.get("hf_folder") if isinstance(imported, dict) else imported
        return f"{run_dir} was imported from {source}: its training corpus is unknown"
    env = _json(run_dir / ENV)
    if not env:
        return f"{run_dir} has no {ENV} (not trained by archlab: imported?), so no corpus is known"
    if "data_meta" not in env:
        return f"{run_dir / ENV} records no data"
    return None


def _json(path: Path) -> dict:
    """The JSON object in ``path``; {} when it is missing or not an object."""
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return obj if isinstance(obj, dict) else {}


def validation_start(cfg) -> tuple[list[int] | str, str]:
    """The start of the validation split of ``cfg.data``: token ids (token shards) or text, and its name.

    A text corpus is split as training split it (``archlab.data.split_corpus``), with the run's ``max_bytes``
    lowered so that only the first validation document's first ``READ_BYTES`` are read: which documents
    validate depends on their count and names, not on ``max_bytes``, except for a single document, whose
    validation tail is read with the run's own settings."""
    data = cfg.data
    if data.source == "tokens":
        return [int(i) for i in prepare_tokens(cfg).val[:WINDOW]], "the validation shards"
    corpus = build_corpus(data)
    max_bytes = data.get("max_bytes")
    if len([d for d in corpus.documents if d.size > 0]) > 1:
        probe = math.ceil(READ_BYTES / data.val_fraction)
        max_bytes = probe if max_bytes is None else min(int(max_bytes), probe)
    split = split_corpus(corpus, data.val_fraction, data.seed, max_bytes)
    return split.val[0][:READ_BYTES], corpus.description


def _window(ex, start: list[int] | str, limit: int) -> str:
    """The first ``limit`` tokens decoded, cut after their last complete line (a window within one line: after
    its last complete word)."""
    ids = start if isinstance(start, list) else ex.codec.encode(start)
    text = ex.codec.decode(ids[:limit]).rstrip("\ufffd")
    for boundary in ("\n", " "):
        at = text.rfind(boundary)
        if at > 0 and text[:at].strip():
            return text[:at].rstrip()
    return text.strip()


def _gap(text: str, gap: str) -> str:
    """``text`` with its middle word replaced by ``gap`` (or ``gap`` appended when it has no word)."""
    words = list(WORD.finditer(text))
    if not words:
        return f"{text} {gap}"
    w = words[len(words) // 2]
    return text[:w.start()] + gap + text[w.end():]


def default_prompt(ex, run_dir: Optional[Path] = None) -> DefaultPrompt:
    """The explorer's first prompt for ``ex`` (an Explorable; ``run_dir``: its run folder, None for a recipe)."""
    neutral = NEUTRAL[ex.kind]
    why = trained_here(run_dir)
    if why is None:
        try:
            start, name = validation_start(ex.cfg)
            limit = min(WINDOW, (ex.max_len or 2 * WINDOW) // 2)
            text = _window(ex, start, limit)
            if text.strip():
                text = _gap(text, GAP[ex.kind]) if ex.kind in GAP else text
                return DefaultPrompt(text, f"default prompt: the first {limit} tokens of the validation split "
                                           f"of {name}, cut at a line")
            why = f"the validation split of {name} starts with no text"
        except (RecipeError, OSError, ImportError) as e:  # DataError is a RecipeError
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
    return DefaultPrompt(neutral, f"default prompt: a neutral sentence ({why})")
