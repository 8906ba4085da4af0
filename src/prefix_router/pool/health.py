"""Active health probes: ``GET <health path>`` on every worker, falling back to ``/v1/models``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from prefix_router.pool.http import Fetcher, FetchError
from prefix_router.pool.pool import WorkerPool
from prefix_router.pool.settings import HealthSettings
from prefix_router.pool.worker import Worker

FALLBACK_PATH = "/v1/models"
PROBE_MAX_BYTES = 1024 * 1024
_NOT_THERE = (404, 405, 501)
ProbeListener = Callable[[Worker, bool, str | None], None]


class HealthProber:
    """Probes workers and reports each result to the pool (which ejects and re-admits), then to
    ``on_result`` if set (``serve --processes``: the other processes take the same result)."""

    def __init__(self, pool: WorkerPool, fetcher: Fetcher, cfg: HealthSettings) -> None:
        self._pool = pool
        self._fetcher = fetcher
        self._cfg = cfg
        self.on_result: ProbeListener | None = None

    async def probe_all(self) -> None:
        await asyncio.gather(*(self.probe(w) for w in self._pool))

    async def probe(self, worker: Worker) -> bool:
        """Probe one worker once; returns whether it answered healthy."""
        error = await self.check(worker)
        if self._pool.get(worker.name) is worker:  # not removed meanwhile
            self._pool.report(worker, error is None, error)
            if self.on_result is not None:
                self.on_result(worker, error is None, error)
        return error is None

    async def check(self, worker: Worker) -> str | None:
        """None when healthy, else why not. The first path that answers 2xx is remembered."""
        for path in self.paths(worker):
            try:
                got = await self._fetcher.get(
                    worker.url + path, auth_headers(worker), self._cfg.timeout_s, PROBE_MAX_BYTES
                )
            except FetchError as exc:
                return f"{path}: {exc}"
            if 200 <= got.status < 300:
                worker.health_path = path
                return None
            if got.status not in _NOT_THERE:
                return f"{path}: HTTP {got.status}"
        return "no health endpoint answered"

    def paths(self, worker: Worker) -> list[str]:
        if worker.health_path is not None:
            return [worker.health_path]
        first = self._cfg.path or (worker.adapter.health_path if worker.adapter else "/health")
        return [first] if first == FALLBACK_PATH else [first, FALLBACK_PATH]


def auth_headers(worker: Worker) -> dict[str, str]:
    """The worker's upstream credentials, if configured."""
    if worker.api_key is None:
        return {}
    return {"Authorization": f"Bearer {worker.api_key.get_secret_value()}"}
