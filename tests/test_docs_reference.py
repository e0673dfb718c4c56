"""docs/recipe-keys.md is what ``python -m archlab.config.reference`` writes from the schema today."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

from archlab.config import reference
from archlab.config.schema import Recipe

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "recipe-keys.md"


def _leaf_keys(cls: type, prefix: str = "") -> set[str]:
    keys = set()
    for f in dataclasses.fields(cls):
        inner = reference._nested(reference.typing.get_type_hints(cls)[f.name])
        keys.add(prefix + f.name)
        if inner is not None:
            keys |= _leaf_keys(inner, f"{prefix}{f.name}.")
    return keys


def test_the_committed_page_is_the_generated_one():
    assert PAGE.read_text() == reference.render(), (
        "docs/recipe-keys.md is stale: run `python -m archlab.config.reference > docs/recipe-keys.md`")


def test_every_schema_key_has_a_row():
    rendered = reference.render()
    missing = [k for k in sorted(_leaf_keys(Recipe)) if f"| `{k}` |" not in rendered]
    assert not missing, missing
    assert "| `model.attention.window` | Optional[int] | `null` | sliding_window: positions a query sees" in rendered


def test_a_comment_above_a_field_and_one_on_its_line_both_count():
    @dataclasses.dataclass
    class Node:
        # read by the first variant
        a: int = 1  # on the line
        b: str = "x"
        # only above
        c: bool = False

    assert reference._comments(Node) == {"a": "read by the first variant: on the line", "b": "",
                                         "c": "only above"}


def test_the_module_writes_the_page_to_stdout():
    out = subprocess.run([sys.executable, "-m", "archlab.config.reference"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    assert out == reference.render()
