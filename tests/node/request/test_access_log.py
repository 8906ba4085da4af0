"""The access log (one line per ``/v1/*`` request) and request ids, over real HTTP: the id is the client's
(when well formed) or the router's, sent to the engine and returned; the line says how the request was
routed and how long it took; ``access_log: false`` turns it off."""

from __future__ import annotations

import logging
import re
import uuid
from typing import Any

import aiohttp
import orjson
import pytest

from prefix_router.node.telemetry.logs import ACCESS_LOGGER, Fields
from prefix_router.protocol import REQUEST_ID_HEADER
from support.waiting import wait_until

CHAT = {"model": "m", "messages": [{"role": "user", "content": "tell me something " * 10}]}


def access_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [
        dict(r.msg.fields) for r in caplog.records if r.name == ACCESS_LOGGER and isinstance(r.msg, Fields)
    ]


def sent_id(engine: Any) -> str | None:
    """The request id the engine got with its last request."""
    return {k.lower(): v for k, v in engine.seen[-1].headers.items()}.get(REQUEST_ID_HEADER)


async def post(url: str, body: Any = CHAT, headers: dict[str, str] | None = None) -> tuple[int, Any, bytes]:
    async with (
        aiohttp.ClientSession() as http,
        http.post(url + "/v1/chat/completions", json=body, headers=headers) as r,
    ):
        return r.status, r.headers, await r.read()


async def test_one_line_per_request_with_the_routing_decision(
    fake_engine: Any, start_router: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, ACCESS_LOGGER)
    engine = await fake_engine("a", chunks=4, chunk_delay_s=0.05)
    router = await start_router(engine)
    await post(router.url)
    await post(router.url, {**CHAT, "stream": True})
    lines = access_lines(caplog)
    assert len(lines) == 2
    whole, stream = lines
    assert whole["method"] == "POST" and whole["path"] == "/v1/chat/completions" and whole["status"] == 200
    assert whole["worker"] == "a" and whole["model"] == "m" and whole["policy"] == "prefix"
    assert whole["branch"] == "load_balance" and whole["predicted_tokens"] == 0 and whole["attempts"] == 1
    assert stream["branch"] == "prefix_hit" and stream["predicted_tokens"] > 0  # the same prompt again
    assert 0 < stream["ttft_ms"] < stream["duration_ms"] and stream["duration_ms"] >= 150  # 4 chunks, 50 ms
    text = str(caplog.records[-1].msg)
    assert re.fullmatch(
        r"method=POST path=/v1/chat/completions status=200 model=m worker=a .*request_id=\S+", text
    )


async def test_request_ids_cross_the_router(
    fake_engine: Any, start_router: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, ACCESS_LOGGER)
    engine = await fake_engine("a")
    router = await start_router(engine)
    _, headers, _ = await post(router.url, headers={REQUEST_ID_HEADER: "client-id.42"})
    assert headers[REQUEST_ID_HEADER] == "client-id.42"
    assert sent_id(engine) == "client-id.42"
    _, made, _ = await post(router.url)  # none given: the router makes one
    assert made[REQUEST_ID_HEADER] and sent_id(engine) == made[REQUEST_ID_HEADER]
    for bad in ("has space", "x" * 129, 'quote"d', "key=value"):  # could forge a log field: replaced
        _, replaced, _ = await post(router.url, headers={REQUEST_ID_HEADER: bad})
        assert replaced[REQUEST_ID_HEADER] != bad and sent_id(engine) != bad
    status, refused, _ = await post(router.url, {"model": "m"}, headers={REQUEST_ID_HEADER: "r-1"})
    assert status == 400 and refused[REQUEST_ID_HEADER] == "r-1"  # router-made errors carry it too
    ids = [line["request_id"] for line in access_lines(caplog)]
    assert ids[0] == "client-id.42" and ids[1] == made[REQUEST_ID_HEADER] and ids[-1] == "r-1"
    assert len(set(ids)) == len(ids)


async def test_made_ids_are_unique_uuids(fake_engine: Any, start_router: Any) -> None:
    """UUIDs: llama-cpp-python's server answers 400 to an x-request-id that is not one."""
    router = await start_router(await fake_engine("a"))
    ids = {(await post(router.url))[1][REQUEST_ID_HEADER] for _ in range(20)}
    assert len(ids) == 20 and all(str(uuid.UUID(i)) == i for i in ids)


async def test_the_access_log_can_be_turned_off(
    fake_engine: Any, start_router: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, ACCESS_LOGGER)
    router = await start_router(await fake_engine("a"), settings={"access_log": False})
    status, headers, _ = await post(router.url)
    assert status == 200 and headers[REQUEST_ID_HEADER]  # ids still cross
    assert access_lines(caplog) == []


async def test_a_client_that_leaves_is_logged_as_499(
    fake_engine: Any, start_router: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, ACCESS_LOGGER)
    router = await start_router(await fake_engine("a", chunks=50, chunk_delay_s=0.05))
    async with aiohttp.ClientSession() as http:
        resp = await http.post(router.url + "/v1/chat/completions", json={**CHAT, "stream": True})
        await resp.content.readany()
        resp.close()  # hang up mid-stream
    await wait_until(lambda: bool(access_lines(caplog)))
    assert access_lines(caplog)[0]["status"] == 499


async def raw_request(port: int, method: str, path: str) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as http, http.request(method, f"http://127.0.0.1:{port}{path}") as r:
        return r.status, await r.read()


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/nope", 404),
        ("GET", "/health%0a", 404),
        ("GET", "/v1/a%0Ab", 400),  # routed (passed through), refused by the path check
        ("GET", "/v1/chat/completions", 405),
        ("DELETE", "/v1/completions", 405),
    ],
)
async def test_refused_paths_get_an_openai_error_and_an_access_line(
    fake_engine: Any, start_router: Any, caplog: pytest.LogCaptureFixture, method: str, path: str, status: int
) -> None:
    caplog.set_level(logging.INFO, ACCESS_LOGGER)
    engine = await fake_engine("a")
    router = await start_router(engine)
    got, body = await raw_request(router.port, method, path)
    assert got == status and "error" in orjson.loads(body)
    lines = access_lines(caplog)
    noted = [(line["method"], line["path"].lower(), line["status"]) for line in lines]
    assert noted == [(method, path.lower(), status)]  # the client may write %0a as %0A
    assert "\n" not in str(caplog.records[-1].msg)
    assert not engine.seen


async def test_the_query_string_never_reaches_the_access_log(
    fake_engine: Any, start_router: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Docs promise no secret in logs: a key in the query string (``?api_key=...``) stays out of the line."""
    caplog.set_level(logging.INFO, ACCESS_LOGGER)
    engine = await fake_engine("a")
    router = await start_router(engine)
    secret = "sk-query-secret-0123456789"
    async with aiohttp.ClientSession() as http:
        for path in ("/v1/chat/completions", "/v1/embeddings", "/nope"):
            async with http.post(f"{router.url}{path}?api_key={secret}&x=1", json=CHAT) as resp:
                await resp.read()
    lines = access_lines(caplog)
    assert [line["path"] for line in lines] == ["/v1/chat/completions", "/v1/embeddings", "/nope"]
    assert secret not in caplog.text and "api_key" not in caplog.text
