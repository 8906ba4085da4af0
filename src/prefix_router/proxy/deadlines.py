"""Every live upstream wait's deadline, so that events can bring them forward.

Each wait on a worker (for the first byte, or for the rest of a stream) runs under a ``Deadlines.watch``:
an ``asyncio.Timeout`` registered while it runs (so the registry never holds more entries than there are
requests in flight). Two events move registered deadlines:

- ``stop(at)`` on graceful shutdown: no wait outlives the drain deadline; a stream cut there ends with an
  SSE error event saying so (instead of aiohttp cancelling the handler mid-write);
- ``eject(worker)`` when health checks eject a worker: requests still waiting for its first byte give up
  on it now and are retried elsewhere, instead of waiting out ``first_byte_s`` on a hung engine.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from types import TracebackType


@dataclass(slots=True, frozen=True)
class _Wait:
    worker: str
    first_byte: bool


class Deadlines:
    def __init__(self) -> None:
        self._live: dict[asyncio.Timeout, _Wait] = {}
        self.stop_at: float | None = None

    @property
    def stopping(self) -> bool:
        return self.stop_at is not None

    def __len__(self) -> int:
        return len(self._live)

    def watch(self, worker: str, when: float, first_byte: bool) -> Watch:
        """``async with deadlines.watch(...)``: like ``asyncio.timeout_at(when)``, but movable."""
        return Watch(self, _Wait(worker, first_byte), when)

    def cap(self, when: float) -> float:
        return when if self.stop_at is None else min(when, self.stop_at)

    def stop(self, at: float) -> None:
        """Graceful shutdown: nothing waits past ``at`` (loop time)."""
        self.stop_at = at
        for timeout in self._live:
            _bring_forward(timeout, at)

    def eject(self, worker: str, now: float) -> int:
        """The worker was ejected: its first-byte waits end now. Returns how many."""
        waits = [t for t, w in self._live.items() if w.worker == worker and w.first_byte]
        for timeout in waits:
            _bring_forward(timeout, now)
        return len(waits)

    def add(self, timeout: asyncio.Timeout, wait: _Wait) -> None:
        self._live[timeout] = wait

    def discard(self, timeout: asyncio.Timeout) -> None:
        self._live.pop(timeout, None)


class Watch:
    __slots__ = ("_owner", "_timeout", "_wait", "_when")

    def __init__(self, owner: Deadlines, wait: _Wait, when: float) -> None:
        self._owner = owner
        self._wait = wait
        self._when = when
        self._timeout: asyncio.Timeout | None = None

    async def __aenter__(self) -> Watch:
        self._timeout = asyncio.timeout_at(self._owner.cap(self._when))
        await self._timeout.__aenter__()
        self._owner.add(self._timeout, self._wait)
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._timeout is not None
        self._owner.discard(self._timeout)
        await self._timeout.__aexit__(kind, exc, tb)


def _bring_forward(timeout: asyncio.Timeout, at: float) -> None:
    when = timeout.when()
    if not timeout.expired() and (when is None or at < when):
        timeout.reschedule(at)
