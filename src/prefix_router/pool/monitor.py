"""Background loops keeping the pool current: health probes, identification (models, engine), scrapes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from prefix_router.pool.health import HealthProber
from prefix_router.pool.http import Fetcher
from prefix_router.pool.identify import Identifier
from prefix_router.pool.pool import WorkerPool
from prefix_router.pool.scrape import MetricsScraper
from prefix_router.pool.settings import HealthSettings, ScrapeSettings
from prefix_router.pool.worker import Worker
from prefix_router.routing import Router

log = logging.getLogger(__name__)


class PoolMonitor:
    """Owns the prober, identifier and scraper and the three loops that drive them."""

    def __init__(
        self,
        pool: WorkerPool,
        router: Router,
        fetcher: Fetcher,
        settings: tuple[HealthSettings, ScrapeSettings, int],
        clock: Callable[[], float],
    ) -> None:
        health, scrape, max_models = settings
        self.pool = pool
        self.fetcher = fetcher
        self.prober = HealthProber(pool, fetcher, health)
        self.identifier = Identifier(fetcher, health.timeout_s, max_models, scrape.max_bytes)
        self.scraper = MetricsScraper(pool, router, fetcher, scrape, clock)
        self._health, self._scrape = health, scrape
        self.probe_and_scrape = True
        self._tasks: list[asyncio.Task[None]] = []

    async def refresh(self, worker: Worker) -> None:
        """Identify and probe one worker now (start-up, or a worker added at runtime)."""
        await self.identifier.identify(worker)
        await self.prober.probe(worker)

    async def refresh_all(self) -> None:
        await asyncio.gather(*(self.refresh(w) for w in self.pool))

    def start(self) -> None:
        """Start the loops (idempotent). With ``probe_and_scrape`` off only identification runs: the
        probes' and scrapes' results come from elsewhere (another process of ``serve --processes``)."""
        if self._tasks:
            return
        loops: list[tuple[float, Callable[[], Awaitable[None]]]] = [
            (self._health.models_interval_s, self._identify_all),
        ]
        if self.probe_and_scrape:
            loops.append((self._health.interval_s, self._probe_all))
        else:  # the probes run elsewhere: what this process saw fail is identified again here
            loops.append((self._health.interval_s, self._identify_stale))
        if self.probe_and_scrape and self._scrape.enabled:
            loops.append((self._scrape.interval_s, self.scraper.scrape_all))
        self._tasks = [asyncio.create_task(_every(interval, fn)) for interval, fn in loops]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    async def _probe_all(self) -> None:
        """Probe every worker. One not healthy (pending, or ejected) or whose identity is stale (a failure
        since its models were read: ``Worker.identity_stale``) is identified first (its models), so that
        it serves what it serves now (an engine restarted with another model, within the ejection time)."""
        await asyncio.gather(
            *(
                self.prober.probe(w) if w.health.healthy and not w.identity_stale else self.refresh(w)
                for w in self.pool
            )
        )

    async def _identify_stale(self) -> None:
        await asyncio.gather(*(self.identifier.identify(w) for w in self.pool if w.identity_stale))

    async def _identify_all(self) -> None:
        await asyncio.gather(*(self.identifier.identify(w) for w in self.pool if w.health.healthy))


async def _every(interval_s: float, fn: Callable[[], Awaitable[None]]) -> None:
    """Run ``fn`` every ``interval_s`` seconds; an exception is logged, never fatal to the loop."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            await fn()
        except Exception:
            log.exception("pool monitor step %s failed", getattr(fn, "__name__", fn))
