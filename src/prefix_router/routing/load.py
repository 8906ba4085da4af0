"""Per-worker load as seen by this router: in-flight requests and the prefill work queued on each.

A request counts as pending prefill (its uncached prompt tokens) from dispatch until its first token,
and as in flight until it finishes. Other router replicas' in-flight counts (shared state) may be set per
worker and are added to the snapshot. Engine-reported queue depth and KV usage (scraped) are kept beside,
with their time, and ignored once stale so that a dead scrape never freezes routing. The table of
tracked requests is bounded; the oldest entry gives way (and its load is released) when it is full.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from prefix_router.routing.types import WorkerSnapshot


@dataclass(slots=True)
class _Tracked:
    worker: str
    uncached: int
    prefilling: bool = True


@dataclass(slots=True)
class _Engine:
    queue_depth: int
    kv_usage: float | None
    at: float


@dataclass(slots=True)
class _Load:
    in_flight: int = 0
    pending_prefill: int = 0
    weight: float = 1.0
    remote_in_flight: int = 0


class LoadTracker:
    def __init__(self, max_tracked: int, engine_stale_s: float) -> None:
        if max_tracked <= 0:
            raise ValueError("max_tracked must be positive")
        self.max_tracked = max_tracked
        self.engine_stale_s = engine_stale_s
        self._requests: OrderedDict[str, _Tracked] = OrderedDict()
        self._loads: dict[str, _Load] = {}
        self._engine: dict[str, _Engine] = {}

    def add_worker(self, worker: str, weight: float = 1.0) -> None:
        self._loads.setdefault(worker, _Load()).weight = weight

    def remove_worker(self, worker: str) -> None:
        self._loads.pop(worker, None)
        self._engine.pop(worker, None)
        for rid in [r for r, t in self._requests.items() if t.worker == worker]:
            del self._requests[rid]

    def start(self, request_id: str, worker: str, uncached_tokens: int) -> None:
        if request_id in self._requests:
            self.finish(request_id)
        load = self._loads.setdefault(worker, _Load())
        load.in_flight += 1
        load.pending_prefill += uncached_tokens
        self._requests[request_id] = _Tracked(worker, uncached_tokens)
        while len(self._requests) > self.max_tracked:
            self.finish(next(iter(self._requests)))

    def first_token(self, request_id: str) -> None:
        tracked = self._requests.get(request_id)
        if tracked is not None:
            self._prefill_done(tracked)

    def finish(self, request_id: str) -> str | None:
        tracked = self._requests.pop(request_id, None)
        if tracked is None:
            return None
        self._prefill_done(tracked)
        load = self._loads.get(tracked.worker)
        if load is not None:
            load.in_flight -= 1
        return tracked.worker

    def _prefill_done(self, tracked: _Tracked) -> None:
        load = self._loads.get(tracked.worker)
        if tracked.prefilling and load is not None:
            load.pending_prefill -= tracked.uncached
        tracked.prefilling = False

    def set_engine(self, worker: str, queue_depth: int, kv_usage: float | None, now: float) -> None:
        self._engine[worker] = _Engine(queue_depth, kv_usage, now)

    def tracked(self) -> int:
        return len(self._requests)

    def in_flight(self, worker: str) -> int:
        load = self._loads.get(worker)
        return 0 if load is None else load.in_flight

    def set_remote_in_flight(self, worker: str, count: int) -> None:
        """Requests other router replicas have in flight on ``worker`` (shared state); added to the
        snapshot's ``in_flight`` but never to ``in_flight()`` (this router's own count). Unknown workers
        are ignored, so the table stays bounded by the workers."""
        load = self._loads.get(worker)
        if load is not None:
            load.remote_in_flight = max(0, count)

    def snapshot(self, worker: str, now: float) -> WorkerSnapshot:
        load = self._loads.get(worker) or _Load()
        engine = self._engine.get(worker)
        fresh = engine is not None and now - engine.at <= self.engine_stale_s
        return WorkerSnapshot(
            name=worker,
            weight=load.weight,
            in_flight=load.in_flight + load.remote_in_flight,
            pending_prefill_tokens=load.pending_prefill,
            queue_depth=engine.queue_depth if fresh and engine else 0,
            kv_usage=engine.kv_usage if fresh and engine else None,
        )
