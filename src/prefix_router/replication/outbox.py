"""The bounded queue between the router (synchronous, never waits) and the publisher task."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence

from prefix_router.routing import ChangeHook, IndexChange, Router


class Outbox:
    """Changes waiting to be published. Full: the oldest change is dropped and counted."""

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError("outbox capacity must be positive")
        self.capacity = capacity
        self.dropped = 0
        self._items: deque[IndexChange] = deque()
        self._wake = asyncio.Event()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, change: IndexChange) -> None:
        """Called from the router's change hook: O(1), never blocks, never raises."""
        if len(self._items) >= self.capacity:
            self._items.popleft()
            self.dropped += 1
        self._items.append(change)
        self._wake.set()

    def take(self, limit: int) -> list[IndexChange]:
        """Up to ``limit`` oldest changes, removed from the queue."""
        count = min(limit, len(self._items))
        return [self._items.popleft() for _ in range(count)]

    def requeue(self, changes: Sequence[IndexChange]) -> None:
        """Put back changes that could not be published, ahead of newer ones, as space allows (what
        does not fit is the oldest, so it is dropped and counted)."""
        room = self.capacity - len(self._items)
        keep = list(changes)[len(changes) - max(room, 0) :] if room < len(changes) else list(changes)
        self.dropped += len(changes) - len(keep)
        self._items.extendleft(reversed(keep))
        if self._items:
            self._wake.set()

    async def wait(self) -> None:
        """Return once the queue is not empty."""
        while not self._items:
            self._wake.clear()
            await self._wake.wait()


class Tap:
    """Puts a router's index changes in an outbox, after whatever hook the router had (which still runs).
    ``attach`` and ``detach`` are idempotent; ``detach`` restores the previous hook."""

    def __init__(self, router: Router, outbox: Outbox) -> None:
        self.router, self.outbox = router, outbox
        self._previous: ChangeHook | None = None

    def attach(self) -> None:
        if self.router.on_change != self._on_change:
            self._previous = self.router.on_change
            self.router.on_change = self._on_change

    def detach(self) -> None:
        if self.router.on_change == self._on_change:
            self.router.on_change = self._previous

    def _on_change(self, change: IndexChange) -> None:
        self.outbox.put(change)
        if self._previous is not None:
            self._previous(change)
