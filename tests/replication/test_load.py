"""In-flight counts shared between replicas, so that they do not all pick the same idle worker."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest


def busy(kit: Any, router: Any, worker: str, count: int, tag: int) -> None:
    for i in range(count):
        kit.dispatch(router, f"{tag}-{i}", kit.prefix(tag * 100 + i), 1.0, finish=False, candidates=[worker])


async def test_remote_in_flight_is_added_to_the_load_view(replicas: Any, kit: Any) -> None:
    cfg = kit.fast_config(load_interval_s=60)  # only the explicit syncs below
    a, b = await replicas.add(cfg=cfg), await replicas.add(cfg=cfg)
    busy(kit, a.router, "w0", 3, 1)
    busy(kit, a.router, "w1", 2, 2)
    busy(kit, b.router, "w1", 1, 3)
    await a.sync_load()
    await b.sync_load()
    await a.sync_load()
    assert [b.router.load.snapshot(w, 1.0).in_flight for w in kit.WORKERS] == [3, 3, 0, 0]
    assert [a.router.load.snapshot(w, 1.0).in_flight for w in kit.WORKERS] == [3, 3, 0, 0]
    assert a.router.load.in_flight("w1") == 2 and b.counters.remote_replicas == 1


async def test_a_replica_that_stops_reporting_is_forgotten(replicas: Any, kit: Any) -> None:
    cfg = kit.fast_config(load_interval_s=60, load_ttl_s=0.2)
    a, b = await replicas.add(cfg=cfg), await replicas.add(cfg=cfg)
    busy(kit, a.router, "w2", 4, 1)
    await a.sync_load()
    await b.sync_load()
    assert b.router.load.snapshot("w2", 1.0).in_flight == 4
    await asyncio.sleep(0.3)
    await b.sync_load()
    assert b.router.load.snapshot("w2", 1.0).in_flight == 0 and b.counters.remote_replicas == 0


async def test_the_background_task_shares_load(replicas: Any, kit: Any) -> None:
    a, b = await replicas.add(), await replicas.add()
    busy(kit, a.router, "w3", 2, 1)
    await kit.wait_until(lambda: b.router.load.snapshot("w3", 1.0).in_flight == 2)


@pytest.mark.parametrize("limit", [1, 2])
async def test_replicas_read_are_bounded(replicas: Any, kit: Any, limit: int) -> None:
    cfg = kit.fast_config(load_interval_s=60, max_replicas=limit)
    group = [await replicas.add(cfg=cfg) for _ in range(4)]
    for state in group:
        busy(kit, state.router, "w0", 1, 7)
        await state.sync_load()
    await group[0].sync_load()
    assert group[0].counters.remote_replicas <= limit


async def test_remote_load_is_forgotten_when_redis_is_gone(
    redis_server: Any, replicas: Any, kit: Any
) -> None:
    cfg = kit.fast_config(load_ttl_s=0.3)
    a, b = await replicas.add(cfg=cfg), await replicas.add(cfg=cfg)
    busy(kit, a.router, "w1", 5, 1)
    await kit.wait_until(lambda: b.router.load.snapshot("w1", 1.0).in_flight == 5)
    redis_server.kill()
    await kit.wait_until(lambda: b.router.load.snapshot("w1", 1.0).in_flight == 0)
    assert b.counters.load_failures > 0
