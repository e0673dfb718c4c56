"""archlab.data.tasks.span_qa: the question prefix, the binding's span as the answer, the first-occurrence
baseline."""

from __future__ import annotations

import numpy as np

from archlab.data.tasks.documents import parse_documents
from archlab.data.tasks.span_qa import baseline, make_items
from archlab.data.tokenizer import build_tokenizer

BYTES = build_tokenizer("byte", [], 257)


def decode(ids) -> str:
    return bytes(int(i) for i in ids if i < 256).decode()


def test_the_answer_is_the_one_binding_of_the_asked_name():
    src = "val = obj.val\nres = val + 1\n# " + "-" * 20 + "\n"  # `val`: the store, an attribute, a load
    (doc,), _ = parse_documents([src], BYTES)
    items = make_items([doc], 32, BYTES, np.random.default_rng(0))
    asked = {decode(x[:np.flatnonzero(x == BYTES.eos_id)[0]]): (x, y, g) for x, y, g in
             zip(items.x, items.y, items.guess)}
    assert set(asked) == {"val"}  # `res` is never read, `obj` never bound
    x, y, guess = asked["val"]
    assert decode(x[y[0]:y[1] + 1]) == "val" and decode(x[4:]).startswith("val = obj")
    assert y.tolist() == [4, 6]  # "val" + separator = 4 ids, then the store at content offset 0
    assert guess.tolist() == [4, 6]  # here the first occurrence is the binding


def test_the_baseline_fails_when_the_name_appears_before_its_binding():
    src = "print(obj.item)\nitem = 3\nprint(item)\n# " + "-" * 9 + "\n"  # one window of 48
    (doc,), _ = parse_documents([src], BYTES)
    items = make_items([doc], 48, BYTES, np.random.default_rng(0))
    assert len(items) == 1
    correct, counted = baseline(items, items, 257)
    assert decode(items.x[0][items.guess[0][0]:items.guess[0][1] + 1]) == "item"
    assert correct.tolist() == [0] and counted.tolist() == [1]
    start = items.y[0][0]
    assert decode(items.x[0][start - 1:start + 7]) == "\nitem = "


def test_a_name_bound_twice_in_the_window_is_not_asked():
    (doc,), _ = parse_documents(["a = 1\na = 2\nb = a\n# " + "-" * 40 + "\n"], BYTES)
    items = make_items([doc], 32, BYTES, np.random.default_rng(0))
    assert len(items) == 0
