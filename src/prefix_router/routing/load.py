"""Per-worker load as seen by this router: in-flight requests and the prefill work queued on each.

A request counts as pending prefill (its uncached prompt tokens) from dispatch until its first token,
and as in flight until it finishes. Other router replicas' in-flight counts (shared state) may be set per
worker and are added to the snapshot. Engine-reported queue depth and KV usage (scraped) are kept beside,
with their time, and ignored once stale so that a dead scrape never freezes routing. The table of
tracked requests is bounded; the oldest entry gives way (and its load is released) when it is full.

Each worker's ``WorkerSnapshot`` is kept up to date in place, so a decision over hundreds of candidates
reads them without building anything; policies must treat them as read-only.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from prefix_router.routing.drain import PrefillDrain
from prefix_router.routing.types import WorkerSnapshot


@dataclass(slots=True)
class _Tracked:
    worker: str
    uncached: int
    work: float
    prefilling: bool = True


@dataclass(slots=True)
class _Counts:
    own: int = 0
    remote: int = 0
    engine_at: float | None = None


class LoadTracker:
    def __init__(self, max_tracked: int, engine_stale_s: float) -> None:
        if max_tracked <= 0:
            raise ValueError("max_tracked must be positive")
        self.max_tracked = max_tracked
        self.engine_stale_s = engine_stale_s
        self._requests: OrderedDict[str, _Tracked] = OrderedDict()
        self._live: dict[str, WorkerSnapshot] = {}
        self._counts: dict[str, _Counts] = {}
        self._next_stale_check = 0.0
        self.drain = PrefillDrain()

    # ------------------------------------------------------------ workers

    def add_worker(self, worker: str, weight: float = 1.0) -> None:
        self._live.setdefault(worker, WorkerSnapshot(worker)).weight = weight
        self._counts.setdefault(worker, _Counts())
        self.drain.add_worker(worker)

    def remove_worker(self, worker: str) -> None:
        self._live.pop(worker, None)
        self._counts.pop(worker, None)
        self.drain.remove_worker(worker)
        for rid in [r for r, t in self._requests.items() if t.worker == worker]:
            del self._requests[rid]

    def _ensure(self, worker: str) -> tuple[WorkerSnapshot, _Counts]:
        if worker not in self._live:
            self.add_worker(worker)
        return self._live[worker], self._counts[worker]

    # ------------------------------------------------------------ requests

    def start(
        self, request_id: str, worker: str, uncached_tokens: int, now: float = 0.0, work: float | None = None
    ) -> None:
        """``work``: the prefill's token-equivalents (``drain.prefill_work``; default: uncached)."""
        if request_id in self._requests:
            self.finish(request_id, now)
        snap, counts = self._ensure(worker)
        work = float(uncached_tokens) if work is None else work
        self.drain.dispatched(worker, work, now)
        counts.own += 1
        snap.in_flight += 1
        snap.pending_prefill_tokens += uncached_tokens
        self._requests[request_id] = _Tracked(worker, uncached_tokens, work)
        while len(self._requests) > self.max_tracked:
            self.finish(next(iter(self._requests)), now)

    def first_token(self, request_id: str, now: float = 0.0) -> None:
        tracked = self._requests.get(request_id)
        if tracked is not None and tracked.prefilling:
            self._prefill_done(tracked)
            self.drain.first_token(tracked.worker, tracked.work, now)

    def finish(self, request_id: str, now: float = 0.0) -> str | None:
        tracked = self._requests.pop(request_id, None)
        if tracked is None:
            return None
        if tracked.prefilling:
            self._prefill_done(tracked)
            self.drain.abandoned(tracked.worker, tracked.work, now)
        if tracked.worker in self._live:
            self._counts[tracked.worker].own -= 1
            self._live[tracked.worker].in_flight -= 1
        return tracked.worker

    def _prefill_done(self, tracked: _Tracked) -> None:
        snap = self._live.get(tracked.worker)
        if tracked.prefilling and snap is not None:
            snap.pending_prefill_tokens -= tracked.uncached
        tracked.prefilling = False

    # ------------------------------------------------------------ outside views

    def set_engine(self, worker: str, queue_depth: int, kv_usage: float | None, now: float) -> None:
        snap, counts = self._ensure(worker)
        snap.queue_depth, snap.kv_usage, counts.engine_at = queue_depth, kv_usage, now

    def set_remote_in_flight(self, worker: str, count: int) -> None:
        """Requests other router replicas have in flight on ``worker`` (shared state); added to the
        snapshot's ``in_flight`` but never to ``in_flight()`` (this router's own count). Unknown workers
        are ignored, so the table stays bounded by the workers."""
        counts = self._counts.get(worker)
        if counts is None:
            return
        count = max(0, count)
        self._live[worker].in_flight += count - counts.remote
        counts.remote = count

    # ------------------------------------------------------------ reads

    def tracked(self) -> int:
        return len(self._requests)

    def in_flight(self, worker: str) -> int:
        counts = self._counts.get(worker)
        return 0 if counts is None else counts.own

    def _drop_stale(self, now: float) -> None:
        if now < self._next_stale_check:
            return
        self._next_stale_check = now + min(1.0, self.engine_stale_s)
        for worker, counts in self._counts.items():
            if counts.engine_at is not None and now - counts.engine_at > self.engine_stale_s:
                snap = self._live[worker]
                snap.queue_depth, snap.kv_usage, counts.engine_at = 0, None, None

    def snapshots(self, workers: Sequence[str], now: float) -> list[WorkerSnapshot]:
        """The live load of ``workers`` (read-only views; unknown names read as idle)."""
        self._drop_stale(now)
        live, drain = self._live, self.drain
        out = [live.get(w) or WorkerSnapshot(w) for w in workers]
        for snap in out:
            snap.prefill_backlog = drain.remaining(snap.name, now)
        return out

    def snapshot(self, worker: str, now: float) -> WorkerSnapshot:
        return self.snapshots([worker], now)[0]
