"""archlab.data.tasks.bound: is every name the window reads bound within it? Builtins and attributes do not
count; the splits are balanced."""

from __future__ import annotations

import numpy as np

from archlab.data.tasks.bound import make_items, window_label
from archlab.data.tasks.documents import parse_documents
from archlab.data.tokenizer import build_tokenizer

BYTES = build_tokenizer("byte", [], 257)


def label(src: str):
    (doc,), _ = parse_documents([src], BYTES)
    return window_label(doc, 0, len(doc.ids))


def test_labels_on_snippets():
    assert label("def f(x):\n    return len(x.y)\n") == 1  # x a parameter; len a builtin; y an attribute
    assert label("def f(x):\n    return g(x)\n") == 0  # g is read and bound nowhere in the window
    assert label("y = z\nz = 1\n") == 1  # the binding may come after the read
    assert label("import os\nos.getcwd()\n") == 1
    assert label("x = 1\n") is None  # no read: not an item


def test_items_are_balanced():
    src = "".join(f"def f{k}(a):\n    return a + {'b' if k % 3 else 'a'}\n" for k in range(60))
    (doc,), _ = parse_documents([src], BYTES)
    items = make_items([doc], 32, BYTES, np.random.default_rng(0))
    assert len(items) > 10 and items.y.shape[1] == 1
    assert (items.y[:, 0] == 1).sum() == (items.y[:, 0] == 0).sum()
