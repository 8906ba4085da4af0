"""Two real router apps (the proxy) sharing their prefix view through Redis, over real HTTP."""

from __future__ import annotations

from typing import Any

import aiohttp
from prometheus_client import generate_latest

from prefix_router.node.config import load_config
from prefix_router.node.life.server import Running, start
from prefix_router.node.state import STATE
from prefix_router.protocol import MATCH_HEADER, WORKER_HEADER
from prefix_router.proxy.run.app import create_app
from prefix_router.replication.wiring import ReplicationCollector, ReplicationSlot, install
from support.routers import QUIET


async def start_replica(url: str, engines: list[Any], kit: Any) -> tuple[Running, ReplicationSlot, Any]:
    """A router app sharing its prefix view through ``url``; its in-flight counts are not shared (the
    load task's first sync is an hour away): the test below is about affinity, and a remote count,
    shared at any moment, would weigh against the holder (``test_load`` holds the load sharing)."""
    workers = [{"url": e.url, "name": e.name} for e in engines]
    app = create_app(load_config(env={}, overrides={**QUIET, "workers": workers}))
    app_state = app[STATE]
    cfg = kit.fast_config(url=url, load_interval_s=3600)
    slot = install(app, app_state.router, cfg, clock=app_state.clock)
    app_state.metrics.registry.register(ReplicationCollector(slot))
    return await start(app, shutdown_timeout=0.2), slot, app_state


async def chat(session: aiohttp.ClientSession, base: str, prompt: str) -> tuple[str, int]:
    body = {"model": "m", "messages": [{"role": "user", "content": prompt}]}
    async with session.post(base + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        await resp.read()
        return resp.headers[WORKER_HEADER], int(resp.headers[MATCH_HEADER])


async def test_replicas_share_affinity_over_http(redis_server: Any, fake_engine: Any, kit: Any) -> None:
    engines = [await fake_engine(name=f"e{i}") for i in range(4)]
    first, slot_a, state_a = await start_replica(redis_server.url, engines, kit)
    second, slot_b, state_b = await start_replica(redis_server.url, engines, kit)
    try:
        assert all(s.replication is not None and s.replication.ready for s in (slot_a, slot_b))
        prompts = [f"document {i}: " + "lorem ipsum dolor sit amet " * 40 for i in range(6)]
        async with aiohttp.ClientSession() as session:
            placed = [(await chat(session, first.url, p))[0] for p in prompts]
            names = [e.name for e in engines]
            index_a, index_b = state_a.router.index, state_b.router.index
            # the first replica has accounted every request (the client can read the whole answer
            # before the router's accounting of it has run), so its index is final; the second one
            # holds the same blocks for every worker: it applied all of them (inserts only)
            await kit.wait_until(lambda: all(state_a.router.load.in_flight(n) == 0 for n in names))
            await kit.wait_until(
                lambda: (
                    all(index_b.blocks_of(n) == index_a.blocks_of(n) for n in names)
                    and sum(index_b.blocks_of(n) for n in names) > 0
                )
            )
            load_b = state_b.router.load
            settled = lambda: all(s.in_flight == 0 for s in load_b.snapshots(names, 0.0))  # noqa: E731
            for prompt, worker in zip(prompts, placed, strict=True):
                await kit.wait_until(settled)  # the second replica's own previous request accounted
                again, predicted = await chat(session, second.url, prompt + " and one more question")
                assert again == worker and predicted > 0
            text = generate_latest(state_b.metrics.registry).decode()
        assert "prefix_router_replication_applied_changes_total" in text
        assert "prefix_router_replication_connected 1.0" in text
        assert len(set(placed)) > 1
    finally:
        await first.stop()
        await second.stop()
    assert slot_a.replication is not None and not slot_a.replication.ready


def test_an_empty_slot_has_no_replication_and_no_stats() -> None:
    slot = ReplicationSlot()
    assert slot.replication is None and slot.stats() == {}
