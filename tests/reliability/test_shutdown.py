"""Graceful shutdown of a real ``serve`` process: SIGTERM stops accepting at once, lets in-flight streams
finish up to ``timeouts.shutdown_s``, ends those still running then with an SSE error event, and exits."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest

Spawn = Callable[..., Awaitable[asyncio.subprocess.Process]]


@pytest.fixture
async def serve_process(free_port: Any) -> AsyncIterator[Spawn]:
    procs: list[asyncio.subprocess.Process] = []

    async def spawn(worker_url: str, shutdown_s: float) -> asyncio.subprocess.Process:
        port = free_port()
        argv = ["-m", "prefix_router.proxy", "serve", "--worker", f"rec={worker_url}", "--port", str(port)]
        argv += ["--set", f"timeouts.shutdown_s={shutdown_s}", "--set", "log_level=warning"]
        proc = await asyncio.create_subprocess_exec(sys.executable, *argv, stderr=asyncio.subprocess.PIPE)
        procs.append(proc)
        proc.url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
        await wait_serving(proc.url)  # type: ignore[attr-defined]
        return proc

    try:
        yield spawn
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()


async def wait_serving(url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            try:
                async with http.get(url + "/ready") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise AssertionError(f"{url} did not become ready")


async def refuses_connections(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    try:
        _, writer = await asyncio.open_connection(host, int(port))
    except ConnectionRefusedError:
        return True
    writer.close()
    return False


async def open_stream(http: aiohttp.ClientSession, url: str, kit: Any) -> aiohttp.ClientResponse:
    resp = await http.post(url + "/v1/chat/completions", json={**kit.CHAT, "stream": True})
    assert resp.status == 200 and await resp.content.readany()
    return resp


async def test_sigterm_finishes_in_flight_streams(
    recording_engine: Any, serve_process: Spawn, kit: Any
) -> None:
    engine = await recording_engine("rec", chunks=30, chunk_delay_s=0.05)  # a 1.5 s stream
    proc = await serve_process(engine.url, shutdown_s=10)
    async with aiohttp.ClientSession() as http:
        resp = await open_stream(http, proc.url, kit)  # type: ignore[attr-defined]
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(_refused_soon(proc.url), 2.0)  # type: ignore[attr-defined]
        rest = await resp.read()
    events = kit.events(rest)
    assert events[-1] == b"[DONE]" and len(events) >= 29  # the whole answer, after the SIGTERM
    assert await asyncio.wait_for(proc.wait(), 10) == 0
    assert not engine.cancelled


async def _refused_soon(url: str) -> bool:
    while not await refuses_connections(url):
        await asyncio.sleep(0.02)
    return True


async def test_sigterm_deadline_ends_long_streams_cleanly(
    recording_engine: Any, serve_process: Spawn, kit: Any
) -> None:
    engine = await recording_engine("rec", chunks=200, chunk_delay_s=0.05)  # a 10 s stream
    proc = await serve_process(engine.url, shutdown_s=0.5)
    async with aiohttp.ClientSession() as http:
        resp = await open_stream(http, proc.url, kit)  # type: ignore[attr-defined]
        proc.send_signal(signal.SIGTERM)
        began = time.monotonic()
        rest = await resp.read()  # a well-formed end of body, not a broken connection
    events = kit.events(rest)
    assert orjson.loads(events[-1])["error"]["code"] == "router_shutdown"
    assert time.monotonic() - began < 3.0  # the deadline, not the 10 s stream
    assert await asyncio.wait_for(proc.wait(), 5) == 0
    await kit.wait_until(lambda: len(engine.cancelled) == 1)  # the engine was told to stop
