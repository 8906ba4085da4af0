"""Every live upstream wait's deadline, so that events can bring them forward.

Each wait on a worker runs under a ``Deadlines.watch``, registered while it runs (so the registry never
holds more entries than there are requests in flight). A watch behaves as ``asyncio.timeout_at``: when
its deadline passes, its task is cancelled and the ``CancelledError`` leaves the ``async with`` as a
``TimeoutError`` (a cancellation from elsewhere stays one). All watches share one timer, armed for the
earliest deadline (a heap of deadlines, stale entries dropped lazily, rebuilt from the live watches once
it holds more than ``2 * live + HEAP_SLACK``): entering and leaving a watch arms no timer of its own
(``asyncio.timeout`` arms and cancels one each time, about 10 us on uvloop, the costliest step of the
proxy's own path per request, ``benchmarks/request_path.py``). A wait is for a first byte,
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
import heapq
import itertools
from types import TracebackType

HEAP_SLACK = 64  # stale heap entries allowed beyond twice the live watches before a rebuild


class Cause(enum.Enum):
    DEADLINE = "deadline"  # the wait's own deadline (or none yet: the wait has not ended)
    SHUTDOWN = "shutdown"
    EJECTED = "ejected"


class Deadlines:
    def __init__(self) -> None:
        self._live: dict[Watch, None] = {}  # the watches running now, in order
        self.stop_at: float | None = None
        self._heap: list[tuple[float, int, Watch]] = []  # (deadline, entry, watch); stale entries too
        self._entries = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")  # the loop time the timer fires at

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
        if len(self._heap) > 2 * len(self._live) + HEAP_SLACK:
            self._rebuild()

    @property
    def heap_size(self) -> int:
        """Deadlines held (live and stale): at most ``2 * len(self) + HEAP_SLACK`` after any call."""
        return len(self._heap)

    def schedule(self, watch: Watch, when: float) -> int:
        """Hold ``watch``'s deadline ``when``; returns the entry that is current for it."""
        if len(self._heap) >= 2 * len(self._live) + HEAP_SLACK:
            self._rebuild()  # before the push: the watch's entry until now is stale after it
        entry = next(self._entries)
        heapq.heappush(self._heap, (when, entry, watch))
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a new event loop (tests): the old one's timer is gone with it
            self._loop, self._timer, self._timer_at = loop, None, float("inf")
        if when < self._timer_at:
            self._arm(loop, when)
        return entry

    def _rebuild(self) -> None:
        self._heap = [(w.when, w.entry, w) for w in self._live if w.running and w.when is not None]
        heapq.heapify(self._heap)

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = loop.call_at(when, self._fire, when), when

    def _fire(self, at: float) -> None:
        """The timer for ``at`` went off: every watch due by then (or by now) expires."""
        self._timer, self._timer_at = None, float("inf")
        loop = self._loop
        if loop is None:
            return
        due, heap = max(at, loop.time()), self._heap
        while heap and heap[0][0] <= due:
            _, entry, watch = heapq.heappop(heap)
            if watch.entry == entry and watch.running and watch in self._live:
                watch.expire()
        while heap and not heap[0][2].current(heap[0][1]):  # stale: left, expired or moved
            heapq.heappop(heap)
        if heap:
            self._arm(loop, heap[0][0])


class _State(enum.Enum):
    CREATED = "created"
    ENTERED = "entered"
    EXPIRING = "expiring"  # its deadline passed: its task was cancelled
    EXPIRED = "expired"
    EXITED = "exited"


class Watch:
    """One wait on ``worker``, registered with its ``Deadlines`` while it runs. ``idle_s``: a stream's idle
    limit now (an ejection shortens it); ``cause``: why it ended early."""

    __slots__ = ("_cancelling", "_owner", "_state", "_task", "_when", "cause", "entry", "idle_s", "worker")

    def __init__(self, owner: Deadlines, worker: str, idle_s: float | None, when: float) -> None:
        self._owner = owner
        self.worker = worker
        self.idle_s = idle_s  # None: a first-byte wait
        self.cause = Cause.DEADLINE
        self._when = when
        self._state = _State.CREATED
        self._task: asyncio.Task[object] | None = None
        self._cancelling = 0
        self.entry = -1  # the owner's heap entry that holds the deadline now

    @property
    def when(self) -> float | None:
        """The deadline now scheduled (None before the watch is entered)."""
        return None if self._state is _State.CREATED else self._when

    @property
    def running(self) -> bool:
        """Entered, and neither expired nor left."""
        return self._state is _State.ENTERED

    def expired(self) -> bool:
        return self._state in (_State.EXPIRING, _State.EXPIRED)

    def current(self, entry: int) -> bool:
        return entry == self.entry and self._state is _State.ENTERED

    def push(self, when: float) -> None:
        """Move this wait's own deadline to ``when`` (later or earlier); never past the shutdown deadline,
        not at all once the shutdown or the deadline ended the wait."""
        if self._state is not _State.ENTERED or self.cause is Cause.SHUTDOWN:
            return
        capped = self._owner.cap(when)
        if capped < when:
            self.cause = Cause.SHUTDOWN
        self._reschedule(capped)

    def bring_forward(self, at: float) -> bool:
        """Reschedule to ``at`` if that is earlier; returns whether it was."""
        if self._state is _State.ENTERED and at < self._when:
            self._reschedule(at)
            return True
        return False

    def _reschedule(self, when: float) -> None:
        self._when = when
        self.entry = self._owner.schedule(self, when)

    def expire(self) -> None:
        """The deadline passed: cancel the task waiting under this watch (``__aexit__`` makes it a
        ``TimeoutError``)."""
        self._state = _State.EXPIRING
        if self._task is not None:
            self._task.cancel()

    async def __aenter__(self) -> Watch:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a deadline watch must be used inside a task")
        self._task, self._cancelling = task, task.cancelling()
        when = self._owner.cap(self._when)
        if when < self._when:
            self.cause = Cause.SHUTDOWN
        self._state = _State.ENTERED
        self._owner.add(self)
        self._reschedule(when)
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._owner.discard(self)
        if self._state is _State.EXPIRING:
            self._state = _State.EXPIRED
            assert self._task is not None
            if self._task.uncancel() <= self._cancelling and kind is asyncio.CancelledError:
                raise TimeoutError from exc  # no other cancellation pending: it was the deadline's
        else:
            self._state = _State.EXITED
