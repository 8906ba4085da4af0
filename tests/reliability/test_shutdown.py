"""Graceful shutdown of a real ``serve`` process: on SIGTERM the listener stays open while it drains
(``/ready`` 503, ``/health`` 200, new requests 503 with ``Retry-After``), in-flight streams finish up to
``timeouts.shutdown_s``, those still running then end with an SSE error event, and the process exits."""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import aiohttp
import orjson


def router_args(worker_url: str, shutdown_s: float) -> list[str]:
    return ["--worker", f"rec={worker_url}", "--set", f"timeouts.shutdown_s={shutdown_s}"]


async def open_stream(http: aiohttp.ClientSession, url: str, kit: Any) -> aiohttp.ClientResponse:
    resp = await http.post(url + "/v1/chat/completions", json={**kit.CHAT, "stream": True})
    assert resp.status == 200 and await resp.content.readany()
    return resp


async def test_sigterm_drains_with_the_listener_open(
    recording_engine: Any, serve_process: Any, kit: Any
) -> None:
    engine = await recording_engine("rec", chunks=60, chunk_delay_s=0.05)  # a 3 s stream
    served = await serve_process(*router_args(engine.url, shutdown_s=20))
    async with aiohttp.ClientSession() as http:
        resp = await open_stream(http, served.url, kit)
        served.signal(signal.SIGTERM)
        await kit.wait_until(lambda: bool(served.lines("shutting down: draining")), 5)
        async with http.get(served.url + "/ready") as ready:  # answered, not refused
            assert ready.status == 503
            assert (await ready.json())["error"]["code"] == "shutting_down"
        async with http.get(served.url + "/health") as health:
            assert health.status == 200
        async with http.post(served.url + "/v1/chat/completions", json=kit.CHAT) as late:
            assert late.status == 503 and late.headers["Retry-After"] == "1"
            assert late.headers.get("Connection", "").lower() == "close"
            assert (await late.json())["error"]["code"] == "shutting_down"
        rest = await resp.read()
    events = kit.events(rest)
    assert events[-1] == b"[DONE]" and len(events) >= 59  # the whole answer, after the SIGTERM
    began = time.monotonic()
    assert await asyncio.wait_for(served.process.wait(), 10) == 0
    assert time.monotonic() - began < 5  # it left once nothing ran, not at the 20 s deadline
    assert not engine.cancelled and engine.served == 1  # the late request never reached the engine


async def test_sigterm_deadline_ends_long_streams_cleanly(
    recording_engine: Any, serve_process: Any, kit: Any
) -> None:
    engine = await recording_engine("rec", chunks=200, chunk_delay_s=0.05)  # a 10 s stream
    served = await serve_process(*router_args(engine.url, shutdown_s=0.5))
    async with aiohttp.ClientSession() as http:
        resp = await open_stream(http, served.url, kit)
        served.signal(signal.SIGTERM)
        began = time.monotonic()
        rest = await resp.read()  # a well-formed end of body, not a broken connection
    events = kit.events(rest)
    assert orjson.loads(events[-1])["error"]["code"] == "router_shutdown"
    assert time.monotonic() - began < 3.0  # the deadline, not the 10 s stream
    assert await asyncio.wait_for(served.process.wait(), 5) == 0
    await kit.wait_until(lambda: len(engine.cancelled) == 1)  # the engine was told to stop
