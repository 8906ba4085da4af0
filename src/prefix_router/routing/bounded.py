"""A small bounded LRU map, for the router's per-request and per-session tables."""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class BoundedLRU(Generic[K, V]):
    """A mapping that keeps at most ``capacity`` entries, dropping the least recently set one."""

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError("capacity must be positive")
        self.capacity = capacity
        self._data: OrderedDict[K, V] = OrderedDict()

    def __len__(self) -> int:
        return len(self._data)

    def get(self, key: K) -> V | None:
        return self._data.get(key)

    def pop(self, key: K) -> V | None:
        return self._data.pop(key, None)

    def set(self, key: K, value: V) -> None:
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self.capacity:
            self._data.popitem(last=False)

    def items(self) -> list[tuple[K, V]]:
        """The entries, least recently set first (a copy)."""
        return list(self._data.items())

    def drop_values(self, value: V) -> None:
        for key in [k for k, v in self._data.items() if v == value]:
            del self._data[key]
