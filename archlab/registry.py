"""One registry per kind of component: a recipe's ``type:`` name resolves to a class here.

    NORMS = Registry("norm")

    @NORMS.register("rmsnorm")
    class RMSNorm(nn.Module): ...

    NORMS.get("rmsnorm")  # -> RMSNorm; an unknown name raises with the list of valid ones
"""

from __future__ import annotations

from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """A name -> class table for one kind of component (norm, position, ffn, router...)."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} type {name!r} is registered twice")
            self._entries[name] = obj
            return obj

        return deco

    def get(self, name: str) -> T:
        if name not in self._entries:
            raise KeyError(f"unknown {self.kind} type {name!r}; valid: {', '.join(self.names())}")
        return self._entries[name]

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries
