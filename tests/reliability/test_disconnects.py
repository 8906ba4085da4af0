"""Many clients hanging up mid-stream: every upstream request is cancelled at once (long before the
streams would end), and every in-flight count returns to zero. The bound is generous on purpose (the
machine may be loaded); the measured cancellation latency is a benchmark figure (docs/reliability.md)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest

from prefix_router.lab.sim.server import CONTEXT, EngineSimSettings, build_app
from prefix_router.node.life.server import Running, start

STREAMS = 40
BOUND_S = 1.0  # the engine's streams would run for 10 s and more


async def open_streams(url: str, n: int, body: dict[str, Any]) -> tuple[aiohttp.ClientSession, list[Any]]:
    """``n`` streams through the router, each having delivered its first chunk."""
    http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True))
    responses = await asyncio.gather(*(http.post(url + "/v1/chat/completions", json=body) for _ in range(n)))
    for resp in responses:
        assert resp.status == 200
        assert await resp.content.readany()
    return http, responses


async def hang_up(http: aiohttp.ClientSession, responses: list[Any]) -> float:
    """Close every client connection at once; returns when."""
    for resp in responses:
        resp.close()
    hung_up = time.monotonic()
    await http.close()
    return hung_up


async def test_every_upstream_request_is_cancelled_at_once(
    recording_engine: Any, start_router: Any, kit: Any
) -> None:
    engines = [await recording_engine(f"rec{i}", chunk_delay_s=0.02) for i in range(2)]
    router = await start_router(*engines)
    http, responses = await open_streams(router.url, STREAMS, {**kit.CHAT, "stream": True})
    assert sum(e.active for e in engines) == STREAMS
    assert router.state.pool.total_in_flight() == STREAMS
    assert len(router.state.deadlines) == STREAMS  # one watched wait per stream, no more
    hung_up = await hang_up(http, responses)
    await kit.wait_until(lambda: sum(e.active for e in engines) == 0, timeout_s=5.0, step_s=0.002)
    delays = sorted(t - hung_up for e in engines for t in e.cancelled)
    assert len(delays) == STREAMS  # every upstream request was cancelled, none ran to its end
    assert delays[-1] < BOUND_S, f"slowest cancellation {delays[-1] * 1e3:.1f} ms"
    await kit.wait_until(lambda: kit.quiescent(router))


async def test_hanging_up_before_the_first_byte_cancels_too(
    recording_engine: Any, start_router: Any, kit: Any
) -> None:
    engine = await recording_engine("slowstart", delay_s=30)
    router = await start_router(engine)
    async with aiohttp.ClientSession() as http:
        tasks = [
            asyncio.ensure_future(http.post(router.url + "/v1/chat/completions", json=kit.CHAT))
            for _ in range(10)
        ]
        await kit.wait_until(lambda: engine.active == 10)
        for task in tasks:
            task.cancel()
        hung_up = time.monotonic()
        await asyncio.gather(*tasks, return_exceptions=True)
    await kit.wait_until(lambda: engine.active == 0, step_s=0.002)
    assert len(engine.cancelled) == 10 and max(engine.cancelled) - hung_up < BOUND_S
    await kit.wait_until(lambda: kit.quiescent(router))


@pytest.fixture
async def sim_app() -> AsyncIterator[tuple[Running, Any]]:
    app = build_app(EngineSimSettings(model="m", time_scale=1.0))
    running = await start(app, shutdown_timeout=0.2)
    try:
        yield running, app[CONTEXT]
    finally:
        await running.stop()


async def test_the_simulated_engine_stops_generating(
    sim_app: tuple[Running, Any], start_router: Any, kit: Any
) -> None:
    """The same through a simulated engine (simulated): its scheduler's live requests drop to zero."""
    running, ctx = sim_app
    router = await start_router({"url": running.url, "name": "sim", "models": ["m"]})
    body = {**kit.CHAT, "stream": True, "max_tokens": 4000}
    http, responses = await open_streams(router.url, 20, body)
    assert ctx.driver.live() == 20
    await hang_up(http, responses)
    elapsed = await kit.wait_until(lambda: ctx.driver.live() == 0, step_s=0.002)
    assert elapsed < BOUND_S, f"engine still generating {elapsed * 1e3:.1f} ms after the hang-up"
    await kit.wait_until(lambda: kit.quiescent(router))
    status, _, raw = await kit.post(router.url, body={**kit.CHAT, "max_tokens": 4})
    assert status == 200 and orjson.loads(raw)["choices"]  # and the router serves on
