"""Per-worker load as seen by this router: in-flight requests and the prefill work queued on each.

This is the router's one in-flight counter: the proxy's caps, ``/metrics``, the admin API and the
replicas' load share all read it. A request counts as pending prefill (its uncached prompt tokens) from
dispatch until its first token, and as in flight until it finishes. Requests are keyed by id and each one
holds the counts of the worker incarnation it started on: removing a worker forgets its counts (a worker
added again under the same name starts at zero) while its requests stay tracked, so that ``tracked()``
(every request of this router in flight) stays right and a late ``finish`` neither goes negative nor
touches the new incarnation nor re-creates state for a removed worker (neither does a request started
on, or a scrape of, a worker that is not there). Other router replicas' in-flight
counts (shared state) may be set per worker and are added to the snapshot. Engine-reported queue depth
and KV usage (scraped) are kept beside, with their time, and ignored once stale so that a dead scrape
never freezes routing. The table of tracked requests is bounded; the oldest entry gives way (and its
load is released) when it is full (so ``routing.max_tracked_requests`` must not be below the proxy's
``limits.max_in_flight``, or the global cap could never be reached).

Each worker's ``WorkerSnapshot`` is kept up to date in place, so a decision over hundreds of candidates
reads them without building anything; policies must treat them as read-only. The prefill work still
queued on each worker (``prefill_backlog``) is estimated by ``backlog.PrefillBacklog`` from the same events.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from prefix_router.routing.backlog import PrefillBacklog
from prefix_router.routing.types import WorkerSnapshot


@dataclass(slots=True)
class _Counts:
    own: int = 0
    remote: int = 0
    engine_at: float | None = None


@dataclass(init=False, slots=True)  # a written __init__, compiled: see routing/types.py
class _Tracked:
    worker: str
    snap: WorkerSnapshot  # the worker incarnation the request started on (detached once it is removed)
    counts: _Counts
    uncached: int
    work: float  # the prefill's token-equivalents (backlog.prefill_work)
    prefilling: bool = True

    def __init__(
        self,
        worker: str,
        snap: WorkerSnapshot,
        counts: _Counts,
        uncached: int,
        work: float,
        prefilling: bool = True,
    ) -> None:
        self.worker = worker
        self.snap = snap
        self.counts = counts
        self.uncached = uncached
        self.work = work
        self.prefilling = prefilling


# a scraped engine load older than this is ignored: five of the pool's default scrape intervals (2 s), so a
# scrape or two may fail before routing falls back to the router's own in-flight counts
ENGINE_LOAD_STALE_S = 10.0


class LoadTracker:
    def __init__(self, max_tracked: int, engine_stale_s: float = ENGINE_LOAD_STALE_S) -> None:
        if max_tracked <= 0:
            raise ValueError("max_tracked must be positive")
        self.max_tracked = max_tracked
        self.engine_stale_s = engine_stale_s
        self._requests: OrderedDict[str, _Tracked] = OrderedDict()
        self._live: dict[str, WorkerSnapshot] = {}
        self._counts: dict[str, _Counts] = {}
        self._next_stale_check = 0.0
        self.backlog = PrefillBacklog()
        # the last decision's candidates and their snapshots: the same candidates again (the usual case)
        # reuse the list instead of building one per decision; any worker added or removed drops it
        self._names: list[str] = []
        self._snaps: list[WorkerSnapshot] = []

    # ------------------------------------------------------------ workers

    def add_worker(self, worker: str, weight: float = 1.0) -> None:
        snap = self._live.setdefault(worker, WorkerSnapshot(worker))
        snap.weight = weight
        self._names, self._snaps = [], []
        self._counts.setdefault(worker, _Counts())
        self.backlog.add_worker(worker, snap)

    def remove_worker(self, worker: str) -> None:
        """Forget ``worker``'s counts; its requests stay tracked until they finish (see the module doc)."""
        self._live.pop(worker, None)
        self._counts.pop(worker, None)
        self._names, self._snaps = [], []
        self.backlog.remove_worker(worker)

    def _counted(self, worker: str) -> tuple[WorkerSnapshot, _Counts]:
        """``worker``'s live counts; for an unknown (removed) worker, detached ones that nothing reads."""
        snap = self._live.get(worker)
        if snap is None:
            return WorkerSnapshot(worker), _Counts()
        return snap, self._counts[worker]

    # ------------------------------------------------------------ requests

    def start(
        self, route_id: str, worker: str, uncached_tokens: int, now: float = 0.0, work: float | None = None
    ) -> None:
        """``work``: the prefill's token-equivalents (``backlog.prefill_work``; default: uncached)."""
        if route_id in self._requests:
            self.finish(route_id, now)
        snap, counts = self._counted(worker)
        work = float(uncached_tokens) if work is None else work
        self.backlog.dispatched(worker, work, now)
        counts.own += 1
        snap.in_flight += 1
        snap.pending_prefill_tokens += uncached_tokens
        self._requests[route_id] = _Tracked(worker, snap, counts, uncached_tokens, work)
        while len(self._requests) > self.max_tracked:
            self.finish(next(iter(self._requests)), now)

    def first_token(self, route_id: str, now: float = 0.0) -> None:
        tracked = self._requests.get(route_id)
        if tracked is not None and tracked.prefilling:
            self._prefill_done(tracked)
            tracked.snap.decoding += 1
            if self._current(tracked):
                self.backlog.first_token(tracked.worker, tracked.work, now)

    def finish(self, route_id: str, now: float = 0.0) -> str | None:
        """Release one request (unknown or already finished ids are ignored); returns its worker."""
        tracked = self._requests.pop(route_id, None)
        if tracked is None:
            return None
        if tracked.prefilling and self._current(tracked):
            self.backlog.abandoned(tracked.worker, tracked.work, now)
        elif not tracked.prefilling:
            tracked.snap.decoding -= 1
        self._prefill_done(tracked)
        tracked.counts.own -= 1
        tracked.snap.in_flight -= 1
        return tracked.worker

    def _current(self, tracked: _Tracked) -> bool:
        """Whether the request's worker is still the incarnation it started on."""
        return self._live.get(tracked.worker) is tracked.snap

    @staticmethod
    def _prefill_done(tracked: _Tracked) -> None:
        if tracked.prefilling:
            tracked.snap.pending_prefill_tokens -= tracked.uncached
        tracked.prefilling = False

    # ------------------------------------------------------------ outside views

    def set_engine(self, worker: str, queue_depth: int, kv_usage: float | None, now: float) -> None:
        """The engine's scraped load (ignored for unknown workers: a late scrape re-creates nothing)."""
        snap, counts = self._live.get(worker), self._counts.get(worker)
        if snap is not None and counts is not None:
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
        """This router's requests in flight, on any worker (removed ones included until they finish)."""
        return len(self._requests)

    def in_flight(self, worker: str) -> int:
        """This router's requests in flight on ``worker`` (never the other replicas')."""
        counts = self._counts.get(worker)
        return 0 if counts is None else counts.own

    def decoding(self, worker: str) -> int:
        """Requests of this router on ``worker`` past their first token (0 for an unknown worker)."""
        snap = self._live.get(worker)
        return 0 if snap is None else snap.decoding

    def queued(self, worker: str) -> int:
        """Requests on ``worker`` not past their first token (other replicas' included, as the snapshot's
        ``in_flight - decoding``; 0 for an unknown worker)."""
        snap = self._live.get(worker)
        return 0 if snap is None else max(0, snap.in_flight - snap.decoding)

    def _drop_stale(self, now: float) -> None:
        if now < self._next_stale_check:
            return
        self._next_stale_check = now + min(1.0, self.engine_stale_s)
        for worker, counts in self._counts.items():
            if counts.engine_at is not None and now - counts.engine_at > self.engine_stale_s:
                snap = self._live[worker]
                snap.queue_depth, snap.kv_usage, counts.engine_at = 0, None, None

    def snapshots(self, workers: Sequence[str], now: float) -> list[WorkerSnapshot]:
        """The live load of ``workers`` (read-only views, to be read before the next call; unknown names
        read as idle)."""
        self._drop_stale(now)
        self.backlog.refresh(now)  # the live snapshots' backlogs (the busy workers' only: O(busy))
        if workers == self._names:  # the same candidates as last time: compared in C, nothing built
            return self._snaps
        found = list(map(self._live.get, workers))  # in C: no per-candidate Python step
        if all(found):
            out = cast(list[WorkerSnapshot], found)
        else:  # unknown names (rare): idle snapshots of their own
            out = [snap or WorkerSnapshot(name) for snap, name in zip(found, workers, strict=True)]
        self._names, self._snaps = list(workers), out
        return out

    def snapshot(self, worker: str, now: float) -> WorkerSnapshot:
        """One worker's live load (the last decision's candidate list stays as it is)."""
        self._drop_stale(now)
        self.backlog.refresh(now)
        return self._live.get(worker) or WorkerSnapshot(worker)
