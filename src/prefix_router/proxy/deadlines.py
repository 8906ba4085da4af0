"""Every live upstream wait's deadline, so that events can bring them forward.

Each wait on a worker (for the first byte, or for the rest of a stream) runs under a ``Deadlines.watch``:
an ``asyncio.Timeout`` registered while it runs (so the registry never holds more entries than there are
requests in flight). The wait itself may move its deadline (``Watch.push``: a stream's idle deadline
moves on with every chunk). Two events bring registered deadlines forward:

- ``stop(at)`` on graceful shutdown: no wait outlives the drain deadline; a stream cut there ends with an
  SSE error event saying so (instead of aiohttp cancelling the handler mid-write);
- ``eject(worker)`` when health checks eject a worker: every wait on it ends now. Requests still waiting
  for its first byte are retried elsewhere, instead of waiting out ``first_byte_s`` on a hung engine;
  streams it was serving end with an SSE error event, instead of holding their in-flight slots until
  ``total_s``.

A watch that ended early says why in ``cause`` (``Cause.DEADLINE`` when its own deadline passed).
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass
from types import TracebackType


class Cause(enum.Enum):
    DEADLINE = "deadline"  # the wait's own deadline (or none yet: the wait has not ended)
    SHUTDOWN = "shutdown"
    EJECTED = "ejected"


@dataclass(slots=True)
class _Wait:
    worker: str
    cause: Cause = Cause.DEADLINE


class Deadlines:
    def __init__(self) -> None:
        self._live: dict[asyncio.Timeout, _Wait] = {}
        self.stop_at: float | None = None

    @property
    def stopping(self) -> bool:
        return self.stop_at is not None

    def __len__(self) -> int:
        return len(self._live)

    def watch(self, worker: str, when: float) -> Watch:
        """``async with deadlines.watch(...)``: like ``asyncio.timeout_at(when)``, but movable."""
        return Watch(self, _Wait(worker), when)

    def cap(self, when: float) -> float:
        return when if self.stop_at is None else min(when, self.stop_at)

    def stop(self, at: float) -> None:
        """Graceful shutdown: nothing waits past ``at`` (loop time)."""
        self.stop_at = at
        for timeout, wait in self._live.items():
            _bring_forward(timeout, wait, at, Cause.SHUTDOWN)

    def eject(self, worker: str, now: float) -> int:
        """The worker was ejected: every wait on it ends now. Returns how many."""
        waits = [(t, w) for t, w in self._live.items() if w.worker == worker]
        for timeout, wait in waits:
            _bring_forward(timeout, wait, now, Cause.EJECTED)
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

    @property
    def cause(self) -> Cause:
        return self._wait.cause

    def push(self, when: float) -> None:
        """Move this wait's own deadline to ``when`` (later or earlier); never past the shutdown deadline,
        and not at all once an event or the deadline ended the wait."""
        timeout = self._timeout
        if timeout is None or timeout.expired() or self._wait.cause is not Cause.DEADLINE:
            return
        capped = self._owner.cap(when)
        if capped < when:
            self._wait.cause = Cause.SHUTDOWN
        timeout.reschedule(capped)

    async def __aenter__(self) -> Watch:
        when = self._owner.cap(self._when)
        if when < self._when:
            self._wait.cause = Cause.SHUTDOWN
        self._timeout = asyncio.timeout_at(when)
        await self._timeout.__aenter__()
        self._owner.add(self._timeout, self._wait)
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._timeout is not None
        self._owner.discard(self._timeout)
        await self._timeout.__aexit__(kind, exc, tb)


def _bring_forward(timeout: asyncio.Timeout, wait: _Wait, at: float, cause: Cause) -> None:
    when = timeout.when()
    if not timeout.expired() and (when is None or at < when):
        timeout.reschedule(at)
        wait.cause = cause
