"""Every live upstream wait's deadline, so that events can bring them forward.

Each wait on a worker runs under a ``Deadlines.watch``: an ``asyncio.Timeout`` registered while it runs
(so the registry never holds more entries than there are requests in flight). A wait is for a first byte,
or for the next chunk of a stream: a stream's watch has an idle limit (``idle_s``), and its owner moves
the deadline on as chunks arrive (``Watch.push``). Two events bring registered deadlines forward:

- ``stop(at)`` on graceful shutdown: no wait outlives the drain deadline; a stream cut there ends with an
  SSE error event saying so (instead of aiohttp cancelling the handler mid-write);
- ``eject(worker, now, grace_s)`` when health checks eject a worker: requests still waiting for its first
  byte give up on it now and are retried elsewhere, instead of waiting out ``first_byte_s`` on a hung
  engine; the streams it serves get ``grace_s`` as their idle limit from now on, so a stream the engine
  has stopped feeding (a hung engine) ends within ``grace_s`` with an SSE error event, instead of holding
  its in-flight slot until ``stream_idle_s`` or ``total_s``, while a stream that is still flowing (the
  engine only failed its health endpoint) runs to its end.

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
    idle_s: float | None  # a stream's idle limit; None: a first-byte wait
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

    def watch(self, worker: str, when: float, idle_s: float | None = None) -> Watch:
        """``async with deadlines.watch(...)``: like ``asyncio.timeout_at(when)``, but movable. ``idle_s``:
        a stream's wait, whose owner pushes the deadline on by (at most) that much per chunk."""
        return Watch(self, _Wait(worker, idle_s), when)

    def cap(self, when: float) -> float:
        return when if self.stop_at is None else min(when, self.stop_at)

    def stop(self, at: float) -> None:
        """Graceful shutdown: nothing waits past ``at`` (loop time)."""
        self.stop_at = at
        for timeout, wait in self._live.items():
            if _bring_forward(timeout, at):
                wait.cause = Cause.SHUTDOWN

    def eject(self, worker: str, now: float, grace_s: float) -> int:
        """The worker was ejected: its first-byte waits end now, its streams must show a chunk within every
        ``grace_s`` from now on. Returns how many waits were on it."""
        waits = [(t, w) for t, w in self._live.items() if w.worker == worker]
        for timeout, wait in waits:
            if wait.cause is Cause.SHUTDOWN:
                continue
            wait.cause = Cause.EJECTED
            if wait.idle_s is None:
                _bring_forward(timeout, now)
            else:
                wait.idle_s = min(wait.idle_s, grace_s)
                _bring_forward(timeout, now + grace_s)
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

    @property
    def when(self) -> float | None:
        """The deadline now scheduled (None before the watch is entered)."""
        return self._timeout.when() if self._timeout is not None else None

    @property
    def idle_s(self) -> float | None:
        """The stream's idle limit now (an ejection shortens it)."""
        return self._wait.idle_s

    def push(self, when: float) -> None:
        """Move this wait's own deadline to ``when`` (later or earlier); never past the shutdown deadline,
        not at all once the shutdown or the deadline ended the wait."""
        timeout = self._timeout
        if timeout is None or timeout.expired() or self._wait.cause is Cause.SHUTDOWN:
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


def _bring_forward(timeout: asyncio.Timeout, at: float) -> bool:
    """Reschedule ``timeout`` to ``at`` if that is earlier; returns whether it was."""
    when = timeout.when()
    if not timeout.expired() and (when is None or at < when):
        timeout.reschedule(at)
        return True
    return False
