"""Two real router apps (the proxy) sharing their prefix view through Redis, over real HTTP."""

from __future__ import annotations

from typing import Any

import aiohttp
from prometheus_client import generate_latest

from prefix_router.config import load_config
from prefix_router.protocol import MATCH_HEADER, WORKER_HEADER
from prefix_router.proxy.app import create_app
from prefix_router.proxy.context import CONTEXT
from prefix_router.proxy.server import Running, start
from prefix_router.replication.wiring import StateCollector, StateSlot, install
from support.routers import QUIET


async def start_replica(url: str, engines: list[Any], kit: Any) -> tuple[Running, StateSlot, Any]:
    workers = [{"url": e.url, "name": e.name} for e in engines]
    app = create_app(load_config(env={}, overrides={**QUIET, "workers": workers}))
    app_state = app[CONTEXT]
    slot = install(app, app_state.router, url, cfg=kit.fast_config(), clock=app_state.clock)
    app_state.metrics.registry.register(StateCollector(slot))
    return await start(app, shutdown_timeout=0.2), slot, app_state


async def chat(session: aiohttp.ClientSession, base: str, prompt: str) -> tuple[str, int]:
    body = {"model": "m", "messages": [{"role": "user", "content": prompt}]}
    async with session.post(base + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        await resp.read()
        return resp.headers[WORKER_HEADER], int(resp.headers[MATCH_HEADER])


async def test_replicas_share_affinity_over_http(redis_server: Any, fake_engine: Any, kit: Any) -> None:
    engines = [await fake_engine(name=f"e{i}") for i in range(4)]
    first, slot_a, _ = await start_replica(redis_server.url, engines, kit)
    second, slot_b, state_b = await start_replica(redis_server.url, engines, kit)
    try:
        assert all(s.state is not None and s.state.ready for s in (slot_a, slot_b))
        prompts = [f"document {i}: " + "lorem ipsum dolor sit amet " * 40 for i in range(6)]
        async with aiohttp.ClientSession() as session:
            placed = [(await chat(session, first.url, p))[0] for p in prompts]
            await kit.wait_until(lambda: slot_a.stats()["outbox_size"] == 0)
            published = slot_a.stats()["published_changes"]
            await kit.wait_until(lambda: slot_b.stats()["applied_changes"] >= published >= len(prompts))
            for prompt, worker in zip(prompts, placed, strict=True):
                again, predicted = await chat(session, second.url, prompt + " and one more question")
                assert again == worker and predicted > 0
            text = generate_latest(state_b.metrics.registry).decode()
        assert "prefix_router_state_applied_changes_total" in text
        assert "prefix_router_state_connected 1.0" in text
        assert len(set(placed)) > 1
    finally:
        await first.stop()
        await second.stop()
    assert slot_a.state is not None and not slot_a.state.ready


def test_an_empty_slot_has_no_state_and_no_stats() -> None:
    slot = StateSlot()
    assert slot.state is None and slot.stats() == {}
