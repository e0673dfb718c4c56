"""Errors shared by the recipe loader and the components that state their own rules."""

from __future__ import annotations

from typing import Any


class RecipeError(ValueError):
    """A recipe (or override) is invalid. The message names key, value and rule."""


def fail(key: str, value: Any, rule: str) -> None:
    """Raise the error every validation rule raises: ``key=value: rule``."""
    raise RecipeError(f"{key}={value!r}: {rule}")
