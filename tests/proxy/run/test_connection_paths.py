"""What a client sees of a connection, under both connection handlers (``http_server``: the router's own
and aiohttp's must behave the same): pipelined requests answered in order, HTTP/1.0 never answered in
chunks, an over-long declared body refused at the head, keep-alive dropped while the router stops, reading
resumed after it paused, and the idle sweep never cutting an answer in progress."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from prefix_router.node import graceful_shutdown
from support.http1 import STREAMED, chat_request, read_answers
from support.kits import HttpKit
from support.routers import RouterHandle

SERVERS = ["lean", "aiohttp"]


@pytest.fixture(params=SERVERS)
def server(request: Any) -> str:
    return str(request.param)


def headers_of(answer: tuple[int, list[tuple[str, str]], bytes]) -> dict[str, str]:
    return {name.lower(): value for name, value in answer[1]}


async def read_to_end(reader: asyncio.StreamReader) -> bytes:
    data = b""
    while more := await asyncio.wait_for(reader.read(65536), 10):
        data += more
    return data


async def until(check: Any, deadline_s: float = 10.0) -> None:
    await HttpKit.wait_until(check, deadline_s)


async def test_two_pipelined_requests_are_both_answered_in_order(
    fake_engine: Any, start_router: Any, server: str
) -> None:
    router = await start_router(await fake_engine("w", reply="fine"), settings={"http_server": server})
    reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
    try:
        writer.write(chat_request("X-Request-Id: first") + chat_request("X-Request-Id: second"))
        answers = (await read_answers(reader, 2)).answers
    finally:
        writer.close()
    assert [status for status, _, _ in answers] == [200, 200]
    assert [headers_of(a)["x-request-id"] for a in answers] == ["first", "second"]


@pytest.mark.parametrize("body", [None, STREAMED], ids=["whole", "streamed"])
async def test_an_http10_client_never_gets_chunks(
    fake_engine: Any, start_router: Any, server: str, body: bytes | None
) -> None:
    router = await start_router(await fake_engine("w", reply="fine"), settings={"http_server": server})
    reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
    try:
        writer.write(chat_request(version="1.0", **({"body": body} if body else {})))
        data = await read_to_end(reader)  # HTTP/1.0 without keep-alive: closed after the answer
    finally:
        writer.close()
    head, _, payload = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.") and b" 200 " in head.split(b"\r\n")[0], head
    assert b"transfer-encoding" not in head.lower()
    assert b"fine" in payload or b'"f' in payload
    if body is None:
        assert orjson.loads(payload)["choices"][0]["message"]["content"] == "fine"
    else:
        assert payload.rstrip().endswith(b"data: [DONE]")


async def test_a_declared_length_over_the_limit_is_refused_at_the_head(
    fake_engine: Any, start_router: Any, server: str
) -> None:
    settings = {"http_server": server, "limits.max_body_bytes": 4096}
    router = await start_router(await fake_engine("w"), settings=settings)
    reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
    try:
        head = chat_request(body=b"").replace(b"Content-Length: 0", b"Content-Length: 41943040")
        writer.write(head)  # the head alone: no body byte is ever sent
        [(status, _, body)] = (await read_answers(reader, 1)).answers
    finally:
        writer.close()
    assert status == 413 and orjson.loads(body)["error"]["code"] == "request_too_large"


async def test_keep_alive_is_dropped_while_the_router_stops(
    fake_engine: Any, start_router: Any, server: str
) -> None:
    router: RouterHandle = await start_router(
        await fake_engine("w", reply="fine", delay_s=0.5), settings={"http_server": server}
    )
    reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
    try:
        writer.write(chat_request())
        await until(lambda: router.state.active == 1)  # being answered
        stopping = asyncio.ensure_future(graceful_shutdown(router.app))  # what SIGTERM runs first
        [answer] = (await read_answers(reader, 1)).answers
        rest = await read_to_end(reader)
        await stopping
    finally:
        writer.close()
    assert answer[0] == 200 and headers_of(answer).get("connection", "").lower() == "close"
    assert rest == b""


async def test_reading_resumes_after_a_pause(fake_engine: Any, start_router: Any, server: str) -> None:
    """A second request of more than the bytes held while an answer is made (reading pauses past them)
    is read whole once the first is answered (the router's own 404: the engine takes no such body)."""
    settings = {"http_server": server, "limits.max_body_bytes": 4 << 20}
    router = await start_router(await fake_engine("w", reply="fine", delay_s=1.0), settings=settings)
    content = "a" * (3 << 20)
    big = orjson.dumps({"model": "unknown", "messages": [{"role": "user", "content": content}]})
    reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
    try:
        writer.write(chat_request("X-Request-Id: first"))
        await until(lambda: router.state.active == 1)
        writer.write(chat_request("X-Request-Id: second", body=big))
        answers = (await read_answers(reader, 2)).answers
    finally:
        writer.close()
    assert [status for status, _, _ in answers] == [200, 404]
    assert [headers_of(a)["x-request-id"] for a in answers] == ["first", "second"]


async def test_the_idle_sweep_never_cuts_an_answer_in_progress(
    fake_engine: Any, start_router: Any, server: str
) -> None:
    settings = {"http_server": server, "timeouts.client_header_s": 0.2}  # the keep-alive timeout
    router = await start_router(await fake_engine("w", reply="fine", delay_s=1.0), settings=settings)
    reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
    try:
        writer.write(chat_request())
        [(status, _, body)] = (await read_answers(reader, 1)).answers  # 5 keep-alive timeouts later
    finally:
        writer.close()
    assert status == 200 and orjson.loads(body)["choices"][0]["message"]["content"] == "fine"
