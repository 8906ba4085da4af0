"""Discovered workers join and leave a real WorkerPool (and so the router)."""

from __future__ import annotations

import asyncio

from prefix_router.pool.pool import WorkerPool
from prefix_router.pool.worker import Worker
from prefix_router.pool.worker_discovery.membership import Membership
from prefix_router.pool.worker_discovery.pool_sink import PoolSink
from prefix_router.routing.router import Router
from prefix_router.routing.settings import RoutingSettings


async def test_workers_join_and_leave_the_pool_and_the_router() -> None:
    router = Router(RoutingSettings())
    probed: list[str] = []

    async def probe(worker: Worker) -> None:
        probed.append(worker.name)

    sink = PoolSink(WorkerPool(router, max_workers=2), {"weight": 2.0, "name": "ignored"}, on_added=probe)
    members = Membership(sink, max_workers=8)
    members.replace(["http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000"])
    await asyncio.sleep(0)
    assert sorted(router.workers()) == ["10.0.0.1:8000", "10.0.0.2:8000"]
    assert sink.rejected == 1 and sorted(probed) == ["10.0.0.1:8000", "10.0.0.2:8000"]
    assert sink.pool.require("10.0.0.1:8000").weight == 2.0
    members.replace(["http://10.0.0.2:8000"])
    assert router.workers() == ["10.0.0.2:8000"]
    sink.on_remove("http://10.9.9.9:1")  # unknown: ignored
