"""Overload: configurable in-flight caps (global and per worker). Beyond them the router answers 429 with
``Retry-After`` at once; nothing queues without bound and the engines never see more than the cap."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson


def assert_rate_limited(status: int, headers: Any, raw: bytes, retry_after: int) -> None:
    assert status == 429 and headers["Retry-After"] == str(retry_after)
    error = orjson.loads(raw)["error"]
    assert error["type"] == "rate_limit_error" and error["code"] == "too_many_requests"


async def test_global_cap_holds_under_a_burst(recording_engine: Any, start_router: Any, kit: Any) -> None:
    engines = [await recording_engine(f"e{i}", delay_s=0.3) for i in range(2)]
    settings = {"limits.max_in_flight": 5, "limits.retry_after_s": 7}
    router = await start_router(*engines, settings=settings)
    results = await asyncio.gather(*(kit.post(router.url) for _ in range(40)))  # arrive together
    served = [r for r in results if r[0] == 200]
    for status, headers, raw in results:
        if status != 200:
            assert_rate_limited(status, headers, raw, 7)
    assert 5 <= len(served) < 40
    assert sum(e.max_active for e in engines) <= 5  # never more than the cap reached the engines
    await kit.wait_until(lambda: kit.quiescent(router))
    assert (await kit.post(router.url))[0] == 200  # and the cap frees up


async def slow_body_request(port: int, body: bytes, pause_s: float) -> int:
    """Send the head, pause, then the body; returns the response status."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = "POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n"
    writer.write(f"{head}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    await asyncio.sleep(pause_s)
    writer.write(body)
    status = int((await reader.readline()).split()[1])
    writer.close()
    return status


async def test_global_cap_holds_for_requests_admitted_while_their_bodies_were_in_transit(
    recording_engine: Any, start_router: Any, kit: Any
) -> None:
    """All 12 pass the cheap check before their bodies arrive (nothing is in flight yet); the cap is
    checked again when a worker is chosen."""
    engine = await recording_engine("e", delay_s=0.5)
    router = await start_router(engine, settings={"limits.max_in_flight": 4})
    body = orjson.dumps(kit.CHAT)
    statuses = await asyncio.gather(*(slow_body_request(router.running.port, body, 0.3) for _ in range(12)))
    assert sorted(statuses) == [200] * 4 + [429] * 8
    assert engine.max_active == 4
    await kit.wait_until(lambda: kit.quiescent(router))


async def test_per_worker_cap(recording_engine: Any, start_router: Any, kit: Any) -> None:
    engines = [await recording_engine(f"e{i}", chunk_delay_s=0.05, chunks=20) for i in range(2)]
    settings = {"limits.max_in_flight_per_worker": 2, "limits.retry_after_s": 3}
    router = await start_router(*engines, settings=settings)
    http_streams = [
        asyncio.ensure_future(kit.post(router.url, body={**kit.CHAT, "stream": True})) for _ in range(4)
    ]
    await kit.wait_until(lambda: all(e.active == 2 for e in engines))
    began = time.monotonic()
    status, headers, raw = await kit.post(router.url)
    assert time.monotonic() - began < 1.0  # refused at once, not queued behind the streams
    assert_rate_limited(status, headers, raw, 3)
    assert "in-flight cap" in orjson.loads(raw)["error"]["message"]
    assert all(e.max_active == 2 for e in engines)
    for status, _, _ in await asyncio.gather(*http_streams):
        assert status == 200
    await kit.wait_until(lambda: kit.quiescent(router))


async def test_no_healthy_worker_is_503_with_retry_after(start_router: Any, kit: Any, free_port: Any) -> None:
    settings = {"health.fail_threshold": 1, "limits.retry_after_s": 2}
    router = await start_router(f"http://127.0.0.1:{free_port()}", settings=settings)  # ejected at start-up
    status, headers, raw = await kit.post(router.url)
    assert status == 503 and headers["Retry-After"] == "2"
    assert orjson.loads(raw)["error"]["code"] == "no_healthy_worker"
