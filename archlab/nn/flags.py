"""Setting a switch on many modules for the length of a block."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterable, Iterator

from torch import nn


@contextmanager
def flag_set(modules: Iterable[nn.Module], name: str, value: Any) -> Iterator[None]:
    """Attribute ``name`` is ``value`` on each of ``modules`` inside the block; on exit each one
    gets back the value it had (also when the block raises)."""
    modules = list(modules)
    before = [getattr(m, name) for m in modules]
    for m in modules:
        setattr(m, name, value)
    try:
        yield
    finally:
        for m, b in zip(modules, before):
            setattr(m, name, b)
