"""Scraping engines' ``/metrics`` (parsed by the engine adapters) into the routing core's load view.

A scrape that fails or hangs is bounded by its timeout and simply not applied: the router ignores engine
load older than ``routing.load.ENGINE_LOAD_STALE_S``, so routing falls back to its own in-flight counts. A
scrape that ends after its worker left the pool (removed, or replaced by a new worker of the same name)
is dropped: it re-creates no state for the removed worker and never lands on its successor.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from prefix_router.pool.engines.base import EngineLoad
from prefix_router.pool.health import auth_headers
from prefix_router.pool.http import Fetcher, FetchError
from prefix_router.pool.pool import WorkerPool
from prefix_router.pool.settings import ScrapeSettings
from prefix_router.pool.worker import Worker
from prefix_router.routing import Router

ScrapeListener = Callable[[Worker, EngineLoad], None]


class MetricsScraper:
    """Scrapes workers and applies what they say to the routing core, then hands it to ``on_result`` if
    set (``serve --processes``: the other processes apply the same load)."""

    def __init__(
        self,
        pool: WorkerPool,
        router: Router,
        fetcher: Fetcher,
        cfg: ScrapeSettings,
        clock: Callable[[], float],
    ) -> None:
        self._pool = pool
        self._router = router
        self._fetcher = fetcher
        self._cfg = cfg
        self._clock = clock
        self.on_result: ScrapeListener | None = None

    async def scrape_all(self) -> None:
        await asyncio.gather(*(self.scrape(w) for w in self._pool if w.health.healthy))

    async def scrape(self, worker: Worker) -> EngineLoad | None:
        """Scrape one worker and apply what it says; None when nothing usable came back."""
        text = await self._fetch(worker)
        if text is None or worker.adapter is None:
            return None
        try:
            load = worker.adapter.parse_metrics(text)
        except Exception:  # a garbage page must not break the loop
            return None
        self.apply(worker, load)
        if self.on_result is not None and self._pool.get(worker.name) is worker:
            self.on_result(worker, load)
        return load

    async def _fetch(self, worker: Worker) -> str | None:
        path = worker.adapter.metrics_path if worker.adapter is not None else None
        if path is None:
            return None
        try:
            got = await self._fetcher.get(
                worker.url + path, auth_headers(worker), self._cfg.timeout_s, self._cfg.max_bytes
            )
        except FetchError:
            return None
        return got.body.decode("utf-8", "replace") if got.status == 200 else None

    def apply(self, worker: Worker, load: EngineLoad) -> None:
        """Feed ``load`` to the router, if ``worker`` is still the pool's worker of that name."""
        if self._pool.get(worker.name) is not worker:
            return
        now = self._clock()
        if load.queue_depth is not None or load.kv_usage is not None:
            self._router.set_engine_load(worker.name, load.queue_depth or 0, load.kv_usage, now)
            worker.last_scrape_s = now
        if load.block_size:
            self._router.set_engine_block(worker.name, load.block_size)
        if (
            load.capacity_tokens
            and worker.capacity_tokens is None
            and load.capacity_tokens != worker.learned_capacity
        ):
            worker.learned_capacity = load.capacity_tokens
            self._router.set_capacity(worker.name, load.capacity_tokens)
