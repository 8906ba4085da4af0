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
from types import TracebackType


class Cause(enum.Enum):
    DEADLINE = "deadline"  # the wait's own deadline (or none yet: the wait has not ended)
    SHUTDOWN = "shutdown"
    EJECTED = "ejected"


class Deadlines:
    def __init__(self) -> None:
        self._live: dict[Watch, None] = {}  # the watches running now, in order
        self.stop_at: float | None = None

    @property
    def stopping(self) -> bool:
        return self.stop_at is not None

    def __len__(self) -> int:
        return len(self._live)

    def watch(self, worker: str, when: float, idle_s: float | None = None) -> Watch:
        """``async with deadlines.watch(...)``: like ``asyncio.timeout_at(when)``, but movable. ``idle_s``:
        a stream's wait, whose owner pushes the deadline on by (at most) that much per chunk."""
        return Watch(self, worker, idle_s, when)

    def cap(self, when: float) -> float:
        return when if self.stop_at is None else min(when, self.stop_at)

    def stop(self, at: float) -> None:
        """Graceful shutdown: nothing waits past ``at`` (loop time)."""
        self.stop_at = at
        for watch in self._live:
            if watch.bring_forward(at):
                watch.cause = Cause.SHUTDOWN

    def eject(self, worker: str, now: float, grace_s: float) -> int:
        """The worker was ejected: its first-byte waits end now, its streams must show a chunk within every
        ``grace_s`` from now on. Returns how many waits were on it."""
        watches = [w for w in self._live if w.worker == worker]
        for watch in watches:
            if watch.cause is Cause.SHUTDOWN:
                continue
            watch.cause = Cause.EJECTED
            if watch.idle_s is None:
                watch.bring_forward(now)
            else:
                watch.idle_s = min(watch.idle_s, grace_s)
                watch.bring_forward(now + grace_s)
        return len(watches)

    def add(self, watch: Watch) -> None:
        self._live[watch] = None

    def discard(self, watch: Watch) -> None:
        self._live.pop(watch, None)


class Watch:
    """One wait on ``worker``: an ``asyncio.Timeout`` while it runs, registered with its ``Deadlines``.
    ``idle_s``: a stream's idle limit now (an ejection shortens it); ``cause``: why it ended early."""

    __slots__ = ("_owner", "_timeout", "_when", "cause", "idle_s", "worker")

    def __init__(self, owner: Deadlines, worker: str, idle_s: float | None, when: float) -> None:
        self._owner = owner
        self.worker = worker
        self.idle_s = idle_s  # None: a first-byte wait
        self.cause = Cause.DEADLINE
        self._when = when
        self._timeout: asyncio.Timeout | None = None

    @property
    def when(self) -> float | None:
        """The deadline now scheduled (None before the watch is entered)."""
        return self._timeout.when() if self._timeout is not None else None

    def push(self, when: float) -> None:
        """Move this wait's own deadline to ``when`` (later or earlier); never past the shutdown deadline,
        not at all once the shutdown or the deadline ended the wait."""
        timeout = self._timeout
        if timeout is None or timeout.expired() or self.cause is Cause.SHUTDOWN:
            return
        capped = self._owner.cap(when)
        if capped < when:
            self.cause = Cause.SHUTDOWN
        timeout.reschedule(capped)

    def bring_forward(self, at: float) -> bool:
        """Reschedule to ``at`` if that is earlier; returns whether it was."""
        timeout = self._timeout
        if timeout is None:
            return False
        when = timeout.when()
        if not timeout.expired() and (when is None or at < when):
            timeout.reschedule(at)
            return True
        return False

    async def __aenter__(self) -> Watch:
        when = self._owner.cap(self._when)
        if when < self._when:
            self.cause = Cause.SHUTDOWN
        timeout = self._timeout = asyncio.timeout_at(when)
        await timeout.__aenter__()
        self._owner.add(self)
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._timeout is not None
        self._owner.discard(self)
        await self._timeout.__aexit__(kind, exc, tb)
