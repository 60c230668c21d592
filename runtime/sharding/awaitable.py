"""Awaitables: the values the distributed stages hand to each other.

`input_dist` and `output_dist` start collectives and return an `Awaitable`;
the next stage calls `wait()`. On one rank nothing is in flight and the
value is simply `Done`.
"""

from __future__ import annotations

from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class Awaitable(Generic[T]):
    """A value that becomes available after `wait()`; `wait()` is idempotent."""

    def __init__(self, finish: Callable[[], T]) -> None:
        self._finish: Callable[[], T] | None = finish
        self._value: T | None = None

    def wait(self) -> T:
        if self._finish is not None:
            self._value = self._finish()
            self._finish = None
        return self._value  # type: ignore[return-value]


class Done(Awaitable[T]):
    """An awaitable whose value is already there."""

    def __init__(self, value: T) -> None:
        super().__init__(lambda: value)
