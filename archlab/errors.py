"""Errors shared by the recipe loader and the components that state their own rules."""

from __future__ import annotations

from typing import Any


class RecipeError(ValueError):
    """A recipe (or override) is invalid. The message names key, value and rule."""


def fail(key: str, value: Any, rule: str) -> None:
    """Raise the error every validation rule raises: ``key=value: rule``."""
    raise RecipeError(f"{key}={value!r}: {rule}")


def positive(cfg, prefix: str, *names: str) -> None:
    """Each of ``names`` on ``cfg`` is a positive number."""
    for n in names:
        v = getattr(cfg, n)
        if v is None or v <= 0:
            fail(f"{prefix}.{n}", v, "must be a positive number")


def one_of(key: str, value: Any, valid) -> None:
    """``value`` is one of ``valid``."""
    if value not in valid:
        fail(key, value, f"must be one of: {', '.join(map(str, valid))}")


def fraction(key: str, value: float, hi_open: bool = True) -> None:
    """``value`` lies in [0, 1) (``hi_open``) or [0, 1]."""
    if not (0.0 <= value < 1.0 if hi_open else 0.0 <= value <= 1.0):
        fail(key, value, "must lie in [0, 1)")
