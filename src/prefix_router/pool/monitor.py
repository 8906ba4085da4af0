"""Background loops keeping the pool current: health probes, model discovery, metrics scrapes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from prefix_router.config import Config
from prefix_router.pool.discovery import Discovery
from prefix_router.pool.health import HealthProber
from prefix_router.pool.http import Fetcher
from prefix_router.pool.pool import WorkerPool
from prefix_router.pool.scrape import MetricsScraper
from prefix_router.pool.worker import Worker
from prefix_router.routing.router import Router

log = logging.getLogger(__name__)


class PoolMonitor:
    """Owns the prober, discovery and scraper and the three loops that drive them."""

    def __init__(
        self, pool: WorkerPool, router: Router, fetcher: Fetcher, cfg: Config, clock: Callable[[], float]
    ) -> None:
        self.pool = pool
        self.fetcher = fetcher
        self.prober = HealthProber(pool, fetcher, cfg.health)
        self.discovery = Discovery(
            fetcher, cfg.health.timeout_s, cfg.limits.max_models_per_worker, cfg.scrape.max_bytes
        )
        self.scraper = MetricsScraper(pool, router, fetcher, cfg.scrape, clock)
        self._cfg = cfg
        self._tasks: list[asyncio.Task[None]] = []

    async def refresh(self, worker: Worker) -> None:
        """Discover and probe one worker now (start-up, or a worker added at runtime)."""
        await self.discovery.discover(worker)
        await self.prober.probe(worker)

    async def refresh_all(self) -> None:
        await asyncio.gather(*(self.refresh(w) for w in self.pool))

    def start(self) -> None:
        """Start the loops (idempotent)."""
        if self._tasks:
            return
        loops: list[tuple[float, Callable[[], Awaitable[None]]]] = [
            (self._cfg.health.interval_s, self.prober.probe_all),
            (self._cfg.health.models_interval_s, self._discover_all),
        ]
        if self._cfg.scrape.enabled:
            loops.append((self._cfg.scrape.interval_s, self.scraper.scrape_all))
        self._tasks = [asyncio.create_task(_every(interval, fn)) for interval, fn in loops]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    async def _discover_all(self) -> None:
        await asyncio.gather(*(self.discovery.discover(w) for w in self.pool if w.health.healthy))


async def _every(interval_s: float, fn: Callable[[], Awaitable[None]]) -> None:
    """Run ``fn`` every ``interval_s`` seconds; an exception is logged, never fatal to the loop."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            await fn()
        except Exception:
            log.exception("pool monitor step %s failed", getattr(fn, "__name__", fn))
