"""Bad input and refusals: every router-made error is an OpenAI error body with the right status."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import pytest

from prefix_router.protocol import POLICY_HEADER, WORKER_HEADER

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}


async def call(url: str, data: bytes, path: str = "/v1/chat/completions", **kw: Any) -> tuple[int, Any, Any]:
    async with aiohttp.ClientSession() as http:
        resp = await http.post(url + path, data=data, **kw)
        return resp.status, resp.headers, orjson.loads(await resp.read())


def assert_openai_error(body: Any) -> dict[str, Any]:
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    error: dict[str, Any] = body["error"]
    return error


@pytest.mark.parametrize(
    ("data", "param"),
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        (b'"text"', None),
        (b"", None),
        (b'{"messages": [{"role": "user", "content": "x"}]}', "model"),
        (b'{"model": 3, "messages": []}', "model"),
        (b'{"model": "m"}', "messages"),
        (b'{"model": "m", "messages": "hello"}', "messages"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}', "stream"),
        (b"\xff\xfe\x00garbage", None),
    ],
)
async def test_400_for_invalid_chat_bodies(
    fake_engine: Any, start_router: Any, data: bytes, param: str | None
) -> None:
    engine = await fake_engine("a")
    router = await start_router(engine)
    status, _, body = await call(router.url, data)
    assert status == 400
    error = assert_openai_error(body)
    assert error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] == param
    assert not engine.generations


@pytest.mark.parametrize(
    "data",
    [
        b'{"model": "m"}',
        b'{"model": "m", "prompt": 5}',
        b'{"prompt": "x"}',
        b'{"model": "m", "prompt": [{}]}',
    ],
)
async def test_400_for_invalid_completions_bodies(fake_engine: Any, start_router: Any, data: bytes) -> None:
    router = await start_router(await fake_engine("a"))
    status, _, body = await call(router.url, data, path="/v1/completions")
    assert status == 400
    assert_openai_error(body)


async def test_404_for_an_unknown_model(fake_engine: Any, start_router: Any) -> None:
    router = await start_router(await fake_engine("a", models=["m"]))
    status, _, body = await call(router.url, orjson.dumps({**CHAT, "model": "nope"}))
    assert status == 404
    error = assert_openai_error(body)
    assert error["param"] == "model" and error["code"] == "model_not_found"


async def test_404_for_an_unknown_model_on_pass_through(fake_engine: Any, start_router: Any) -> None:
    router = await start_router(await fake_engine("a", models=["m"]))
    status, _, body = await call(
        router.url,
        b'{"model": "nope", "input": "x"}',
        path="/v1/embeddings",
        headers={"Content-Type": "application/json"},
    )
    assert status == 404
    assert_openai_error(body)


async def test_413_over_the_body_limit(fake_engine: Any, start_router: Any) -> None:
    engine = await fake_engine("a")
    router = await start_router(engine, settings={"limits.max_body_bytes": 2000})
    big = orjson.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * 5000}]})
    status, _, body = await call(router.url, big)
    assert status == 413 and assert_openai_error(body)["code"] == "request_too_large"

    async def chunked() -> Any:  # no Content-Length: the limit still holds
        for _ in range(10):
            yield b" " * 500

    status, _, body = await call(router.url, chunked())  # type: ignore[arg-type]
    assert status == 413
    assert not engine.generations
    status, _, _ = await call(router.url, orjson.dumps(CHAT))  # and the router still serves
    assert status == 200


async def test_503_with_retry_after_when_no_worker_is_healthy(start_router: Any, free_port: Any) -> None:
    settings = {"health.fail_threshold": 1, "limits.retry_after_s": 3}
    router = await start_router(f"http://127.0.0.1:{free_port()}", settings=settings)
    assert not any(w.health.healthy for w in router.state.pool)  # the start-up probe ejected it
    status, headers, body = await call(router.url, orjson.dumps(CHAT))
    assert status == 503 and headers["Retry-After"] == "3"
    assert assert_openai_error(body)["code"] == "no_healthy_worker"


async def test_429_with_retry_after_over_the_global_in_flight_cap(
    fake_engine: Any, start_router: Any
) -> None:
    slow = await fake_engine("slow", delay_s=0.5)
    router = await start_router(slow, settings={"limits.max_in_flight": 1})
    first = asyncio.create_task(call(router.url, orjson.dumps(CHAT)))
    while router.state.pool.total_in_flight() == 0:
        await asyncio.sleep(0.01)
    status, headers, body = await call(router.url, orjson.dumps(CHAT))
    assert status == 429 and int(headers["Retry-After"]) >= 0
    assert_openai_error(body)
    assert (await first)[0] == 200


async def test_429_when_every_worker_is_at_its_cap(fake_engine: Any, start_router: Any) -> None:
    slow = await fake_engine("slow", delay_s=0.5)
    router = await start_router(slow, settings={"limits.max_in_flight_per_worker": 1})
    first = asyncio.create_task(call(router.url, orjson.dumps(CHAT)))
    while router.state.pool.total_in_flight() == 0:
        await asyncio.sleep(0.01)
    status, headers, _ = await call(router.url, orjson.dumps(CHAT))
    assert status == 429 and "Retry-After" in headers
    assert (await first)[0] == 200


async def test_400_for_an_unknown_policy_header(fake_engine: Any, start_router: Any) -> None:
    router = await start_router(await fake_engine("a"))
    status, _, body = await call(router.url, orjson.dumps(CHAT), headers={POLICY_HEADER: "nope"})
    assert status == 400 and assert_openai_error(body)["param"] == POLICY_HEADER


async def test_policy_header_selects_the_policy(fake_engine: Any, start_router: Any) -> None:
    engines = [await fake_engine(n) for n in ("a", "b", "c")]
    router = await start_router(*engines)
    seen = set()
    for _ in range(6):
        _, headers, _ = await call(router.url, orjson.dumps(CHAT), headers={POLICY_HEADER: "round_robin"})
        seen.add(headers[WORKER_HEADER])
    assert seen == {"a", "b", "c"}
    metrics = router.state.metrics.render().decode()
    counted = [line for line in metrics.splitlines() if line.startswith("prefix_router_requests_total{")]
    assert sum(float(line.split()[-1]) for line in counted if 'policy="round_robin"' in line) == 6


def test_session_ids_are_bounded() -> None:
    from prefix_router.node.request.parse import MAX_SESSION_CHARS, session_id

    assert session_id(None) is None and session_id("") is None
    assert session_id("abc") == "abc"
    long_a, long_b = "a" * 10_000, "a" * 9_999 + "b"
    assert len(session_id(long_a) or "") <= MAX_SESSION_CHARS
    assert session_id(long_a) != session_id(long_b)
