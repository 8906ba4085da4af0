"""Misbehaving engines over real sockets: hung, slow, garbage, 500s, closing
mid-stream. Every case: bounded time, the right answer to the client, nothing left in flight, no socket
left open on a connection the engine closed."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from typing import Any

import orjson
import pytest

from prefix_router.protocol import WORKER_HEADER

BROKEN = ("garbage", "close", "bad_status", "bad_chunked", "truncated", "http_500")


@pytest.mark.parametrize("mode", BROKEN)
async def test_broken_answers_are_retried_on_a_good_worker(
    raw_engine: Any, fake_engine: Any, start_router: Any, kit: Any, mode: str
) -> None:
    bad = await raw_engine("bad", mode)
    good = await fake_engine("good")
    router = await start_router(bad, {"url": good.url, "name": "good"})
    for _ in range(4):  # round robin: every other request starts on the broken engine
        status, headers, body = await kit.post(router.url, headers=kit.RR)
        assert status == 200 and headers[WORKER_HEADER] == "good"
        assert orjson.loads(body)["choices"][0]["message"]["content"]
    assert bad.generations >= 2 and len(good.generations) == 4
    await kit.wait_until(lambda: kit.quiescent(router) and not kit.lingering_sockets(bad.port))


@pytest.mark.parametrize("mode", [m for m in BROKEN if m != "http_500"])
async def test_broken_answers_everywhere_give_a_502_error_body(
    raw_engine: Any, start_router: Any, kit: Any, mode: str
) -> None:
    bad = await raw_engine("bad", mode)
    router = await start_router(bad)
    status, _, body = await kit.post(router.url)
    error = orjson.loads(body)["error"]
    assert status == 502 and error["code"] == "upstream_unavailable" and error["type"] == "upstream_error"
    await kit.wait_until(lambda: kit.quiescent(router) and not kit.lingering_sockets(bad.port))


async def test_a_500_everywhere_is_relayed(raw_engine: Any, start_router: Any, kit: Any) -> None:
    bad = await raw_engine("bad", "http_500")
    router = await start_router(bad)
    status, _, body = await kit.post(router.url)
    assert status == 500 and orjson.loads(body)["error"]["message"] == "engine exploded"
    assert kit.quiescent(router)


async def test_a_200_that_is_not_json_is_relayed_unchanged(
    raw_engine: Any, start_router: Any, kit: Any
) -> None:
    odd = await raw_engine("odd", "not_json_200")
    router = await start_router(odd)
    status, headers, body = await kit.post(router.url)
    assert status == 200 and body == b"<html>definitely not json</html>"
    assert headers["Content-Type"].startswith("text/html")
    assert kit.quiescent(router)


async def test_many_broken_requests_leak_no_descriptor(raw_engine: Any, start_router: Any, kit: Any) -> None:
    import psutil

    engines = [await raw_engine(mode, mode) for mode in ("garbage", "close", "bad_chunked", "truncated")]
    router = await start_router(*engines, settings={"retries.max_attempts": 4})
    await kit.post(router.url)  # warm up whatever is created once
    before = psutil.Process().num_fds()
    results = await asyncio.gather(*(kit.post(router.url) for _ in range(40)))
    assert {status for status, _, _ in results} == {502}
    await kit.wait_until(lambda: all(not kit.lingering_sockets(e.port) for e in engines))
    assert psutil.Process().num_fds() <= before + 2  # 40 x 4 failed attempts, no descriptor kept
    assert kit.quiescent(router)


async def test_hung_engine_is_bounded_by_the_first_byte_budget(
    raw_engine: Any, fake_engine: Any, start_router: Any, kit: Any
) -> None:
    """An engine that hangs on generation while its health probes pass cannot be told from a slow one:
    the request that went there gets 504 once the budget is spent (it is not run again elsewhere)."""
    hung = await raw_engine("hung", "hang")
    good = await fake_engine("good")
    settings = {"timeouts.first_byte_s": 0.3}
    router = await start_router(hung, {"url": good.url, "name": "good"}, settings=settings)
    results = [await kit.post(router.url, headers=kit.RR) for _ in range(2)]
    assert sorted(status for status, _, _ in results) == [200, 504]
    assert hung.generations == 0 and len(good.generations) == 1
    alone = await start_router(hung, settings=settings)
    began = time.monotonic()
    status, _, body = await kit.post(alone.url)
    assert status == 504 and orjson.loads(body)["error"]["code"] == "upstream_timeout"
    assert time.monotonic() - began < 3.0  # bounded by the configured timeout, not by the engine
    await kit.wait_until(lambda: hung.hanging == 0)  # the router hung up on it: no socket held open
    assert kit.quiescent(router) and kit.quiescent(alone)


async def test_ejecting_a_hung_engine_moves_its_waiting_requests_at_once(
    raw_engine: Any, fake_engine: Any, start_router: Any, kit: Any
) -> None:
    """Health probes time out on a fully hung engine and eject it; requests that were waiting for its
    first byte are retried elsewhere then, long before their 60 s first-byte timeout."""
    hung = await raw_engine("hung", "hang")
    good = await fake_engine("good")
    settings = {
        "timeouts.first_byte_s": 60,
        "health.interval_s": 0.1,
        "health.timeout_s": 0.2,
        "health.fail_threshold": 2,
    }
    router = await start_router(hung, {"url": good.url, "name": "good"}, settings=settings)
    assert router.state.pool.require("hung").health.healthy  # admitted at start-up...
    hung.mode = "hang_all"  # ...then hung on everything
    began = time.monotonic()
    results = await asyncio.gather(*(kit.post(router.url, headers=kit.RR) for _ in range(2)))
    assert [status for status, _, _ in results] == [200, 200]
    assert {headers[WORKER_HEADER] for _, headers, _ in results} == {"good"}
    assert time.monotonic() - began < 10.0
    assert not router.state.pool.require("hung").health.healthy
    assert router.state.metrics.retries.get() >= 1
    await kit.wait_until(lambda: kit.quiescent(router))


async def test_slow_engine_within_its_budget_is_waited_for_not_retried(
    fake_engine: Any, start_router: Any, kit: Any
) -> None:
    slow = await fake_engine("slow", delay_s=0.4, chunks=4, chunk_delay_s=0.1)
    router = await start_router(slow, settings={"timeouts.first_byte_s": 2.0})
    status, _, _ = await kit.post(router.url)
    assert status == 200
    status, _, raw = await kit.post(router.url, body={**kit.CHAT, "stream": True})
    assert status == 200 and kit.events(raw)[-1] == b"[DONE]"
    assert len(slow.generations) == 2 and router.state.metrics.retries.get() == 0
    assert kit.quiescent(router)


async def test_a_stream_outliving_the_total_timeout_ends_with_an_error_event(
    recording_engine: Any, start_router: Any, kit: Any
) -> None:
    endless = await recording_engine("endless", chunk_delay_s=0.05)
    router = await start_router(endless, settings={"timeouts.total_s": 0.4})
    began = time.monotonic()
    status, _, raw = await kit.post(router.url, body={**kit.CHAT, "stream": True})
    events = kit.events(raw)
    assert status == 200 and len(events) > 2
    assert orjson.loads(events[-1])["error"]["code"] == "upstream_timeout"
    assert time.monotonic() - began < 3.0
    await kit.wait_until(lambda: endless.active == 0 and kit.quiescent(router))
    assert len(endless.cancelled) == 1  # the engine saw the router hang up


@pytest.mark.parametrize(
    "mode", ["sse_then_close", "sse_then_reset", "sse_then_garbage", "sse_cut_mid_event"]
)
async def test_an_engine_breaking_mid_stream_gives_a_clean_error_event_and_no_retry(
    raw_engine: Any, fake_engine: Any, start_router: Any, kit: Any, mode: str, caplog: Any
) -> None:
    breaking = await raw_engine("breaking", mode)
    good = await fake_engine("good")
    router = await start_router(breaking, {"url": good.url, "name": "good"})
    status, headers, raw = await kit.post(router.url, body={**kit.CHAT, "stream": True}, headers=kit.RR)
    assert status == 200 and headers[WORKER_HEADER] == "breaking"
    events = kit.events(raw)  # the body ended cleanly (the client's chunked parser did not fail)
    assert orjson.loads(events[0])["choices"][0]["delta"]["content"] == "one "
    assert orjson.loads(events[-1])["error"]["code"] == "upstream_io"
    assert all(orjson.loads(event) for event in events)  # every event whole (a half-sent one is held back)
    assert raw.count(b"data:") == len(events) and raw.endswith(b"\n\n")
    assert not good.generations  # bytes had reached the client: never retried
    await kit.wait_until(lambda: kit.quiescent(router) and not kit.lingering_sockets(breaking.port))
    gc.collect()  # an error nobody retrieved would be reported now
    assert not [r for r in caplog.records if r.name == "asyncio" and r.levelno >= logging.ERROR]
