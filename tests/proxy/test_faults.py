"""Faults before and after the first byte: retries, error bodies, mid-stream failures, disconnects."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import openai
import orjson
import pytest

from prefix_router.protocol import POLICY_HEADER, WORKER_HEADER

CHAT = {"model": "m", "messages": [{"role": "user", "content": "tell me a story " * 10}]}
RR = {POLICY_HEADER: "round_robin"}


async def post(url: str, body: Any = CHAT, headers: dict[str, str] | None = None) -> tuple[int, Any, Any]:
    async with aiohttp.ClientSession() as http:
        resp = await http.post(url + "/v1/chat/completions", data=orjson.dumps(body), headers=headers)
        raw = await resp.read()
        return resp.status, resp.headers, orjson.loads(raw) if raw else None


async def test_connect_failure_is_retried_on_another_worker(
    fake_engine: Any, start_router: Any, free_port: Any
) -> None:
    good = await fake_engine("good")
    router = await start_router({"url": f"http://127.0.0.1:{free_port()}", "name": "dead"}, good)
    router.admit("dead")  # up at start-up, dead since
    results = [await post(router.url, headers=RR) for _ in range(2)]  # round robin: one starts on "dead"
    assert [status for status, _, _ in results] == [200, 200]
    assert all(headers[WORKER_HEADER] == "good" for _, headers, _ in results)
    assert router.state.metrics.retries.get() >= 1
    assert len(good.generations) == 2
    assert router.state.metrics.upstream_errors.get(("dead", "connect")) >= 1
    assert (
        'prefix_router_upstream_errors_total{kind="connect",worker="dead"}'
        in router.state.metrics.render().decode()
    )


async def test_5xx_is_retried_and_client_sees_success(fake_engine: Any, start_router: Any) -> None:
    flaky = await fake_engine("flaky", fail_next=10)
    good = await fake_engine("good")
    router = await start_router(flaky, good)
    for _ in range(4):
        status, headers, body = await post(router.url, headers=RR)
        assert status == 200 and headers[WORKER_HEADER] == "good"
        assert body["choices"][0]["message"]["content"]
    assert len(flaky.generations) >= 1  # it was tried, and failed over


async def test_round_robin_retries_do_not_take_other_requests_turns(
    fake_engine: Any, start_router: Any
) -> None:
    """One worker answering 500: it gets every other request's first attempt, not all of them (retries
    advanced the rotation, so the failing worker was first again for every request: 14 of 14)."""
    failing = await fake_engine("failing", fail_next=1000)
    good = await fake_engine("good")
    router = await start_router(failing, good, settings={"health.fail_threshold": 100})
    for _ in range(14):
        status, headers, _ = await post(router.url, headers=RR)
        assert status == 200 and headers[WORKER_HEADER] == "good"
    assert len(failing.generations) == 7 and len(good.generations) == 14


async def test_last_5xx_comes_back_unchanged_when_every_attempt_fails(
    fake_engine: Any, start_router: Any
) -> None:
    a = await fake_engine("a", fail_next=10)
    b = await fake_engine("b", fail_next=10)
    router = await start_router(a, b, settings={"retries.max_attempts": 5})
    status, _, body = await post(router.url)
    assert status == 500 and body["error"]["message"] in ("a failed", "b failed")
    assert len(a.generations) == 1 and len(b.generations) == 1  # each tried once, never twice


async def test_attempts_are_bounded(fake_engine: Any, start_router: Any) -> None:
    engines = [await fake_engine(f"e{i}", fail_next=10) for i in range(4)]
    router = await start_router(*engines, settings={"retries.max_attempts": 2})
    status, _, _ = await post(router.url)
    assert status == 500
    assert sum(len(e.generations) for e in engines) == 2


async def test_connect_failure_everywhere_is_502(start_router: Any, free_port: Any) -> None:
    port = free_port()
    router = await start_router(f"http://127.0.0.1:{port}", settings={"health.fail_threshold": 10})
    router.admit(f"127.0.0.1:{port}")
    status, _, body = await post(router.url)
    assert status == 502
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == "upstream_unavailable"


async def test_first_byte_timeout_spends_the_budget_then_504(fake_engine: Any, start_router: Any) -> None:
    """``first_byte_s`` is the request's budget: an attempt that used it up is not repeated elsewhere."""
    hung = await fake_engine("hung", hang=True)
    good = await fake_engine("good")
    settings = {"timeouts.first_byte_s": 0.3}
    router = await start_router(hung, good, settings=settings)
    results = [await post(router.url, headers=RR) for _ in range(2)]  # round robin: one starts on "hung"
    assert sorted(status for status, _, _ in results) == [200, 504]
    assert len(good.generations) == 1 and len(hung.generations) == 1
    assert router.state.metrics.retries.get() == 0
    alone = await start_router(hung, settings=settings)
    status, _, body = await post(alone.url)
    assert status == 504 and body["error"]["code"] == "upstream_timeout"
    assert alone.state.pool.total_in_flight() == 0


async def test_total_timeout_ends_a_stream_with_an_error_event(fake_engine: Any, start_router: Any) -> None:
    slow = await fake_engine("slow", chunks=20, chunk_delay_s=0.2)
    router = await start_router(slow, settings={"timeouts.total_s": 0.5})
    stream = await router.openai().chat.completions.create(stream=True, **CHAT)
    with pytest.raises(openai.APIError, match="timed out"):
        async for _ in stream:
            pass
    assert router.state.pool.total_in_flight() == 0


async def test_mid_stream_failure_ends_with_error_event_and_no_retry(
    fake_engine: Any, start_router: Any
) -> None:
    reply = "aaaa bbbb cccc dddd"
    engines = [await fake_engine(n, chunks=4, die_after_chunks=2, reply=reply) for n in ("d1", "d2")]
    router = await start_router(*engines)
    got: list[str] = []
    stream = await router.openai().chat.completions.create(stream=True, **CHAT)
    with pytest.raises(openai.APIError, match="mid-stream"):
        async for chunk in stream:
            got.append(chunk.choices[0].delta.content or "")
    assert got == ["aaaa ", "bbbb "]  # what streamed before the failure, then a clean error event
    assert sum(len(e.generations) for e in engines) == 1  # never retried once bytes were sent
    assert router.state.pool.total_in_flight() == 0


async def test_mid_stream_failure_raw_bytes(fake_engine: Any, start_router: Any) -> None:
    dying = await fake_engine("dying", chunks=3, die_after_chunks=1)
    router = await start_router(dying)
    async with aiohttp.ClientSession() as http:
        resp = await http.post(router.url + "/v1/chat/completions", json={**CHAT, "stream": True})
        data = await resp.read()  # a clean end: no exception from a broken chunked body
    events = [e for e in data.split(b"\n\n") if e]
    assert resp.status == 200 and len(events) == 2
    assert orjson.loads(events[-1].removeprefix(b"data: "))["error"]["code"] == "upstream_io"


async def test_client_disconnect_cancels_upstream_and_releases(fake_engine: Any, start_router: Any) -> None:
    slow = await fake_engine("slow", chunks=50, chunk_delay_s=0.1, reply="x" * 50)
    router = await start_router(slow)
    async with aiohttp.ClientSession() as http:
        resp = await http.post(router.url + "/v1/chat/completions", json={**CHAT, "stream": True})
        await resp.content.readany()
        assert router.state.pool.total_in_flight() == 1
        resp.close()  # hang up mid-stream
    await asyncio.wait_for(slow.cancelled.wait(), 2.0)
    for _ in range(100):
        if router.state.pool.total_in_flight() == 0:
            break
        await asyncio.sleep(0.01)
    assert router.state.pool.total_in_flight() == 0
    assert slow.streams_finished == 0
    assert router.state.router.load.tracked() == 0


async def test_client_disconnect_while_waiting_for_first_byte(fake_engine: Any, start_router: Any) -> None:
    hung = await fake_engine("hung", hang=True)
    router = await start_router(hung)
    async with aiohttp.ClientSession() as http:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(http.post(router.url + "/v1/chat/completions", json=CHAT), 0.3)
    for _ in range(100):
        if router.state.pool.total_in_flight() == 0:
            break
        await asyncio.sleep(0.01)
    assert router.state.pool.total_in_flight() == 0


async def test_one_bad_request_does_not_affect_others(fake_engine: Any, start_router: Any) -> None:
    engine = await fake_engine("a")
    router = await start_router(engine)
    bad = [post(router.url, body=b) for b in ({"model": 1}, [1, 2], {"model": "m", "messages": "x"})]
    good = [post(router.url) for _ in range(5)]
    results = await asyncio.gather(*bad, *good)
    assert [r[0] for r in results] == [400, 400, 400] + [200] * 5
