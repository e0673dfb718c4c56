"""archlab.data.tasks.tag: roles on each identifier's first token, -100 elsewhere; the per-token-id baseline."""

from __future__ import annotations

import numpy as np

from archlab.data.tasks.documents import parse_documents
from archlab.data.tasks.items import IGNORE
from archlab.data.tasks.roles import ROLE_ID
from archlab.data.tasks.tag import baseline, make_items, token_labels
from archlab.data.tokenizer import build_tokenizer

BYTES = build_tokenizer("byte", [], 257)  # one token per ASCII character: positions are offsets


def test_labels_sit_on_the_first_character_of_each_identifier():
    src = "def f(x): return g(x.y)\n"
    (doc,), _ = parse_documents([src], BYTES)
    lab = token_labels(doc)
    expect = {4: "definition", 6: "parameter", 17: "call", 19: "load", 21: "attribute"}
    assert {int(i): int(v) for i, v in enumerate(lab) if v != IGNORE} == {k: ROLE_ID[r] for k, r in expect.items()}


def test_only_the_first_sub_token_of_a_long_name_is_labelled():
    (doc,), _ = parse_documents(["total_count = 1\n"], BYTES)
    lab = token_labels(doc)
    assert lab[0] == ROLE_ID["store"] and (lab[1:] == IGNORE).all()


def test_items_are_windows_with_a_label_and_the_baseline_learns_per_token_id():
    src = "".join(f"def f{k}(x): return x\n" for k in range(20))
    (doc,), _ = parse_documents([src], BYTES)
    items = make_items([doc], 16, BYTES, np.random.default_rng(0))
    assert items.x.shape[1] == items.y.shape[1] == 16 and len(items) > 0
    assert ((items.y != IGNORE).sum(1) > 0).all()
    correct, counted = baseline(items, items, 257)
    assert (counted == (items.y != IGNORE).sum(1)).all()
    # 'x' is a parameter once and a load once in every line: the per-id majority gets one of the two right
    assert 0 < correct.sum() < counted.sum()
