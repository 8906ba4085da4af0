"""Router fixtures: a real router app on 127.0.0.1 in front of fake engines."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web
from openai import AsyncOpenAI

from prefix_router.config import load_config
from prefix_router.pool.http import Fetched
from prefix_router.proxy.app import create_app
from prefix_router.proxy.context import STATE, AppState
from prefix_router.proxy.server import Running, start
from prefix_router.proxy.upstream import Upstream


@dataclass
class RouterHandle:
    app: web.Application
    running: Running

    @property
    def url(self) -> str:
        return self.running.url

    @property
    def state(self) -> AppState:
        return self.app[STATE]

    def openai(self, api_key: str = "unused", **kwargs: Any) -> AsyncOpenAI:
        return AsyncOpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, **kwargs)

    def admit(self, name: str) -> None:
        """Admit a worker as if its first probe had passed (one that is down by the time of the test:
        an engine that died after start-up)."""
        self.state.pool.report(self.state.pool.require(name), True)


class UpFetcher:
    """The probes' side of an in-memory network: every worker answers 200 ``{}``."""

    async def get(self, url: str, headers: Mapping[str, str], timeout_s: float, max_bytes: int) -> Fetched:
        return Fetched(200, b"{}")


RouterFactory = Callable[..., Awaitable[RouterHandle]]

QUIET = {"health.interval_s": 3600, "health.models_interval_s": 3600, "scrape.interval_s": 3600}


def worker_entry(worker: Any) -> Any:
    if isinstance(worker, str | dict):
        return worker
    return {"url": worker.url, "name": worker.name}


@pytest.fixture
async def start_router() -> AsyncIterator[RouterFactory]:
    """``await start_router(engine_a, engine_b, settings={"retries.max_attempts": 2})``."""
    handles: list[RouterHandle] = []

    async def make(
        *workers: Any, settings: dict[str, Any] | None = None, upstream: Upstream | None = None
    ) -> RouterHandle:
        overrides = {**QUIET, "workers": [worker_entry(w) for w in workers], **(settings or {})}
        fetcher = UpFetcher() if upstream is not None else None
        app = create_app(load_config(env={}, overrides=overrides), upstream=upstream, fetcher=fetcher)
        handle = RouterHandle(app, await start(app, shutdown_timeout=0.2))
        handles.append(handle)
        return handle

    try:
        yield make
    finally:
        for handle in handles:
            await handle.running.stop()
