"""A stream on an engine process that hangs mid-stream (SIGSTOP: the socket stays open, nothing more comes)
is cut: by ``timeouts.stream_idle_s`` between two chunks, or at once when health checks eject the worker.
Either way the client gets the tokens so far, an SSE error event naming the cause and a clean end of body,
and the in-flight slot is given back (before: the stream waited out ``timeouts.total_s``, 30 minutes)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson

LONG = {
    "model": "m",
    "messages": [{"role": "user", "content": "tell me a very long story"}],
    "max_tokens": 4000,
    "stream": True,
}


async def stream_until_frozen(router: Any, engine: Any, kit: Any) -> tuple[int, list[bytes], float]:
    """Start a long stream, freeze the engine once tokens flow; (status, events, seconds after freezing)."""
    request = asyncio.ensure_future(kit.post(router.url, body=LONG))
    await kit.wait_until(lambda: router.state.pool.total_in_flight() == 1, timeout_s=10)
    await asyncio.sleep(0.5)  # tokens are flowing
    engine.freeze()
    frozen = time.monotonic()
    status, _, raw = await asyncio.wait_for(request, 30)
    return status, kit.events(raw), time.monotonic() - frozen


def error_code(event: bytes) -> str:
    code: str = orjson.loads(event)["error"]["code"]
    return code


async def test_a_silent_stream_is_cut_after_the_idle_timeout(
    sim_process: Any, start_router: Any, kit: Any
) -> None:
    engine = await sim_process()
    worker = {"url": engine.url, "name": "sim", "models": ["m"]}
    router = await start_router(worker, settings={"timeouts.stream_idle_s": 0.5})
    status, events, waited = await stream_until_frozen(router, engine, kit)
    assert status == 200 and len(events) > 2 and orjson.loads(events[0])["choices"]
    assert error_code(events[-1]) == "upstream_idle_timeout"
    assert waited < 5.0  # the idle timeout, not total_s (1800 s)
    await kit.wait_until(lambda: kit.quiescent(router))
    assert router.state.pool.require("sim").health.healthy  # probes are off here: only the stream was cut


async def test_ejecting_a_worker_ends_its_open_streams(sim_process: Any, start_router: Any, kit: Any) -> None:
    engine = await sim_process()
    settings = {
        "timeouts.stream_idle_s": 600,
        "health.interval_s": 0.1,
        "health.timeout_s": 0.2,
        "health.fail_threshold": 2,
    }
    worker = {"url": engine.url, "name": "sim", "models": ["m"]}
    router = await start_router(worker, settings=settings)
    status, events, waited = await stream_until_frozen(router, engine, kit)
    assert status == 200 and len(events) > 2
    assert error_code(events[-1]) == "worker_ejected"
    assert waited < 5.0  # two failed probes, not stream_idle_s (600 s)
    assert not router.state.pool.require("sim").health.healthy
    await kit.wait_until(lambda: kit.quiescent(router))
