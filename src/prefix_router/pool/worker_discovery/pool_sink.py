"""A discovery listener that adds and removes workers of a ``WorkerPool`` (named ``host:port``, so that
every router replica discovering the same endpoints uses the same names, which shared state relies on)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from prefix_router.pool.pool import PoolError, WorkerPool
from prefix_router.pool.settings import WorkerSettings
from prefix_router.pool.worker import Worker

log = logging.getLogger(__name__)
AddedHook = Callable[[Worker], Coroutine[Any, Any, None]]
RoleOf = Callable[[str], str | None]  # a discovered URL's role from its source (a pod label), if any


class PoolSink:
    """``on_add(url)``: ``pool.add`` a worker built from ``template`` (WorkerSettings fields but url, name),
    then run ``on_added`` (e.g. the monitor's first probe) in a task; ``on_remove(url)``: ``pool.remove``.
    Refused additions (pool full, duplicate) are counted in ``rejected``."""

    def __init__(
        self, pool: WorkerPool, template: Mapping[str, Any] | None = None, on_added: AddedHook | None = None
    ) -> None:
        self.pool = pool
        self.template = {k: v for k, v in (template or {}).items() if k not in ("url", "name")}
        self.on_added = on_added
        self.rejected = 0
        self.role_of: RoleOf | None = None  # set by sources that read roles (InferencePool pods)
        self._tasks: set[asyncio.Task[None]] = set()

    def on_add(self, url: str) -> None:
        role = self.role_of(url) if self.role_of is not None else None
        fields = {**self.template, "url": url} | ({"role": role} if role is not None else {})
        try:
            worker = self.pool.add(WorkerSettings(**fields))
        except (PoolError, ValueError) as exc:
            self.rejected += 1
            log.warning("discovered worker %s not added: %s", url, exc)
            return
        if self.on_added is not None:
            task: asyncio.Task[None] = asyncio.get_running_loop().create_task(self.on_added(worker))
            self._tasks.add(task)  # at most one per worker added, gone once done
            task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Cancel the ``on_added`` hooks still running (before the pool's monitor goes away)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def on_remove(self, url: str) -> None:
        name = WorkerSettings(**{**self.template, "url": url}).resolved_name()
        try:
            self.pool.remove(name)
        except PoolError:
            return
