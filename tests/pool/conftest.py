"""Pool fixtures: a scripted ``Fetcher`` (no sockets) and a pool wired to a real ``Router``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest

from prefix_router.pool.http import Fetched, FetchError
from prefix_router.pool.pool import WorkerPool
from prefix_router.pool.settings import WorkerSettings
from prefix_router.routing.router import Router
from prefix_router.routing.settings import RoutingSettings


@dataclass
class ScriptedFetcher:
    """Answers GETs from a table ``url -> Fetched | FetchError``; unknown URLs are refused connections."""

    table: dict[str, Fetched | FetchError] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)

    async def get(self, url: str, headers: Mapping[str, str], timeout_s: float, max_bytes: int) -> Fetched:
        self.calls.append(url)
        answer = self.table.get(url, FetchError("connection refused"))
        if isinstance(answer, FetchError):
            raise answer
        if len(answer.body) > max_bytes:
            raise FetchError("too big")
        return answer


@pytest.fixture
def fetcher() -> ScriptedFetcher:
    return ScriptedFetcher()


@pytest.fixture
def router() -> Router:
    return Router(RoutingSettings())


@pytest.fixture
def pool(router: Router) -> WorkerPool:
    """Two workers, each admitted as if its first probe had passed."""
    pool = WorkerPool(router, max_workers=8, thresholds=(3, 2))
    for name in ("w1", "w2"):
        pool.report(pool.add(WorkerSettings(url=f"http://{name}:8000", name=name)), True)
    return pool
