"""The set of workers behind the router, kept in step with the routing core's view of them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prefix_router.pool.settings import WorkerSettings, url_identity
from prefix_router.pool.worker import Worker
from prefix_router.routing import Role, Router

HealthListener = Callable[[Worker, bool], None]


class PoolError(ValueError):
    """A pool operation that cannot be done (duplicate name, unknown worker, pool full)."""


class WorkerPool:
    """Workers by name (bounded by ``max_workers``) and their availability.

    Every membership change is mirrored into the ``Router``; a worker ejected by health checks has its
    cached-prefix entries purged (the engine probably restarted and lost its cache) but keeps its
    in-flight count. In-flight counts are the routing core's (``Router.load``), read here for the caps.
    """

    def __init__(self, router: Router, max_workers: int, thresholds: tuple[int, int] = (3, 2)) -> None:
        self._router = router
        self._max = max_workers
        self._fail_threshold, self._success_threshold = thresholds
        self._workers: dict[str, Worker] = {}
        self._prefill_workers = 0  # of role prefill: while there is one, requests are disaggregated
        self._listeners: list[HealthListener] = []

    def __len__(self) -> int:
        return len(self._workers)

    def __iter__(self) -> Iterator[Worker]:
        return iter(list(self._workers.values()))

    def get(self, name: str) -> Worker | None:
        return self._workers.get(name)

    def require(self, name: str) -> Worker:
        worker = self._workers.get(name)
        if worker is None:
            raise PoolError(f"unknown worker {name!r}")
        return worker

    def on_health_change(self, listener: HealthListener) -> None:
        self._listeners.append(listener)

    # ------------------------------------------------------------------ membership

    def add(self, cfg: WorkerSettings) -> Worker:
        """A new worker, pending until its first probe passes (``report``)."""
        worker = Worker.from_config(cfg)
        if worker.name in self._workers:
            raise PoolError(f"worker {worker.name!r} already exists")
        same = url_identity(worker.url)
        twin = next((w for w in self._workers.values() if url_identity(w.url) == same), None)
        if twin is not None:
            raise PoolError(f"worker {twin.name!r} already has the URL {worker.url}")
        if len(self._workers) >= self._max:
            raise PoolError(f"pool is full ({self._max} workers, limits.max_workers)")
        self._workers[worker.name] = worker
        self._prefill_workers += worker.role == "prefill"
        self._router.add_worker(worker.name, capacity_tokens=worker.capacity_tokens, weight=worker.weight)
        return worker

    def remove(self, name: str) -> Worker:
        worker = self.require(name)
        del self._workers[name]
        self._prefill_workers -= worker.role == "prefill"
        self._router.remove_worker(name)
        return worker

    def drain(self, name: str, draining: bool = True) -> Worker:
        """A draining worker finishes what it has but gets no new requests."""
        worker = self.require(name)
        worker.draining = draining
        return worker

    def set_role(self, name: str, role: Role) -> Worker:
        """Change a worker's role in place (``routing/pd.py``): its next requests follow it; those in
        flight finish as they started. The engine must be able to play it (its KV connector's role)."""
        worker = self.require(name)
        self._prefill_workers += (role == "prefill") - (worker.role == "prefill")
        worker.role = role
        return worker

    # ------------------------------------------------------------------ selection

    def candidates(self, model: str | None, per_worker_cap: int) -> list[str]:
        """Names of available workers serving ``model`` (any model when None) below the in-flight cap."""
        # per request and worker: ``Worker.available`` and ``Worker.serves`` inline, a third of the calls'
        # cost (10 vs 28 us for 64 workers); tests/pool/test_pool.py holds them equal
        in_flight = self._router.load.in_flight
        out = []
        for w in self._workers.values():
            if not w.health.healthy or w.draining or in_flight(w.name) >= per_worker_cap:
                continue
            if model is None or (
                model in w.configured_models
                if w.configured_models
                else w.listed_models is None or model in w.listed_models
            ):
                out.append(w.name)
        return out

    @property
    def disaggregated(self) -> bool:
        """Some worker, available or not, is of role ``prefill``: requests are split (``routing/pd.py``)."""
        return self._prefill_workers > 0

    def split(self, names: list[str]) -> tuple[list[str], list[str]]:
        """``names`` (candidates) as (the prefill workers, the decode-capable ones: roles decode and both)."""
        prefill: list[str] = []
        decode: list[str] = []
        for name in names:
            (prefill if self._workers[name].role == "prefill" else decode).append(name)
        return prefill, decode

    def knows_model(self, model: str) -> bool:
        """Whether any worker, healthy or not, serves ``model``."""
        return any(w.serves(model) for w in self._workers.values())

    def any_available(self, model: str | None = None) -> bool:
        return any(w.available and (model is None or w.serves(model)) for w in self._workers.values())

    def models(self) -> list[dict[str, object]]:
        """The union of the workers' models, as ``/v1/models`` entries (first worker's entry wins)."""
        seen: dict[str, dict[str, object]] = {}
        for worker in self._workers.values():
            for model_id in worker.model_ids():
                entry = (worker.listed_models or {}).get(model_id)
                seen.setdefault(model_id, dict(entry) if entry else _model_entry(model_id))
        return list(seen.values())

    # ------------------------------------------------------------------ load (the routing core's count)

    def in_flight(self, name: str) -> int:
        """This router's requests in flight on worker ``name``."""
        return self._router.load.in_flight(name)

    def total_in_flight(self) -> int:
        """This router's requests in flight on any worker (removed ones included until they finish)."""
        return self._router.load.tracked()

    def public(self, worker: Worker) -> dict[str, Any]:
        """``worker``'s admin view with its in-flight count."""
        return worker.public(self.in_flight(worker.name))

    # ------------------------------------------------------------------ health

    def report(self, worker: Worker, ok: bool, error: str | None = None) -> bool:
        """Count one probe (or request) result: admit a pending worker on its first success, eject after
        ``fail_threshold`` failures in a row, re-admit after ``success_threshold`` successes in a row.
        A failure also marks the worker's identity stale (``Worker.identity_stale``). Returns whether the
        verdict changed."""
        state = worker.health
        if ok:
            state.successes, state.failures = state.successes + 1, 0
            flip = not state.healthy and (state.pending or state.successes >= self._success_threshold)
        else:
            state.failures, state.successes, state.last_error = state.failures + 1, 0, error
            state.failed_results += 1
            worker.identity_stale = True
            flip = state.healthy and state.failures >= self._fail_threshold
        if flip:
            self._set_health(worker, not state.healthy)
        return flip

    def _set_health(self, worker: Worker, healthy: bool) -> None:
        worker.health.healthy = healthy
        worker.health.pending = False
        worker.health.ejections += 0 if healthy else 1
        if not healthy and worker.name in self._workers:
            self._router.forget_cache(worker.name)  # what the engine probably lost; its requests still run
        for listener in self._listeners:
            listener(worker, healthy)


def _model_entry(model_id: str) -> dict[str, object]:
    return {"id": model_id, "object": "model", "created": 0, "owned_by": "prefix-router"}
