"""The router's own answers (``edge.head``): the bytes it writes, whole or relayed, are aiohttp's for the
same ``web.Response`` or ``RelayResponse`` (the reference), it leaves every other answer to aiohttp, a
relay waits while the client reads slowly, and a real router serves keep-alive, pipelined,
``Connection: close``, HTTP/1.0 and streaming clients with them."""

from __future__ import annotations

import asyncio
import functools
import random
import time
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.http import HttpVersion10, HttpVersion11
from aiohttp.http_writer import StreamWriter
from aiohttp.test_utils import make_mocked_request
from hypothesis import given
from hypothesis import strategies as st

from prefix_router.lab.bench.connection import MemoryTransport, ServerSide
from prefix_router.node import STATE, Config, NodeState, build_app
from prefix_router.proxy.edge import head
from prefix_router.proxy.edge.request import AiohttpRequest
from prefix_router.proxy.edge.responses import RelayResponse, SentResponse
from support.http1 import STREAMED, Parsed, chat_request, read_answers


@functools.cache
def state() -> NodeState:
    config = Config.model_validate({"workers": [{"url": "http://127.0.0.1:9", "name": "w0"}]})
    return build_app(config, None, None, time.monotonic, random.Random(0))[STATE]


def request_on(
    transport: MemoryTransport, method: str = "POST", keep_alive: bool = True, version: Any = HttpVersion11
) -> AiohttpRequest:
    """An aiohttp request on ``transport``, as the edge sees it."""
    loop = asyncio.get_running_loop()
    protocol = ServerSide(loop)
    protocol.connection_made(transport)
    request = make_mocked_request(
        method, "/v1/chat/completions", version=version, closing=not keep_alive, protocol=protocol,
        transport=transport, writer=StreamWriter(protocol, loop), loop=loop,
    )  # fmt: skip
    return AiohttpRequest(state(), request)


def without_date(data: bytes) -> bytes:
    """The answer's bytes without its one ``Date`` line (the two writers may straddle a second)."""
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.split(b"\r\n")
    assert sum(line.startswith(b"Date: ") for line in lines) == 1
    return b"\r\n".join(line for line in lines if not line.startswith(b"Date: ")) + b"\r\n\r\n" + body


async def aiohttp_bytes(status: int, headers: list[tuple[str, str]], body: bytes, keep_alive: bool) -> bytes:
    transport = MemoryTransport()
    response = web.Response(status=status, body=body, headers=headers)
    await request_on(transport, keep_alive=keep_alive).respond(response)
    await response.write_eof()
    return bytes(transport.data)


async def aiohttp_relayed(
    status: int, headers: list[tuple[str, str]], chunks: list[bytes], keep_alive: bool
) -> bytes:
    transport = MemoryTransport()
    response = RelayResponse(status=status, headers=headers)
    await request_on(transport, keep_alive=keep_alive).respond(response)
    for chunk in chunks:
        await response.write(chunk)
    await response.write_eof()
    return bytes(transport.data)


TOKEN = st.text("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_", min_size=1, max_size=12)
VALUE = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40).map(str.strip)
NAMES = TOKEN.filter(
    lambda n: n.lower() not in ("content-length", "date", "server", "connection", "transfer-encoding")
)
HEADERS = st.lists(st.tuples(st.one_of(NAMES, st.just("Content-Type")), VALUE), max_size=8)
STATUS = st.one_of(
    st.integers(200, 599).filter(lambda s: s not in (204, 304)), st.sampled_from([200, 429, 299])
)


@given(STATUS, HEADERS, st.binary(max_size=300), st.booleans())
async def test_the_bytes_written_whole_are_aiohttps_for_the_same_response(
    status: int, headers: list[tuple[str, str]], body: bytes, keep_alive: bool
) -> None:
    transport = MemoryTransport()
    sent = head.sent(request_on(transport, keep_alive=keep_alive), status, headers, body)
    assert isinstance(sent, SentResponse)
    assert sent.status == status and sent.keep_alive is keep_alive and sent.prepared
    ours = bytes(transport.data)
    assert without_date(ours) == without_date(await aiohttp_bytes(status, headers, body, keep_alive))
    [(parsed_status, _, parsed_body)] = Parsed(ours).answers
    assert (parsed_status, parsed_body) == (status, body)


@given(STATUS, HEADERS, st.lists(st.binary(max_size=200), max_size=6), st.booleans())
async def test_the_bytes_relayed_are_aiohttps_for_the_same_stream(
    status: int, headers: list[tuple[str, str]], chunks: list[bytes], keep_alive: bool
) -> None:
    transport = MemoryTransport()
    relay = head.relay(request_on(transport, keep_alive=keep_alive), status, headers)
    assert relay is not None
    for chunk in chunks:
        await relay.write(chunk)
        assert transport.data or not any(chunks[: chunks.index(chunk) + 1])  # the head goes with a chunk
    await relay.write_eof()
    ours = bytes(transport.data)
    assert without_date(ours) == without_date(await aiohttp_relayed(status, headers, chunks, keep_alive))
    [(parsed_status, _, parsed_body)] = Parsed(ours).answers
    assert (parsed_status, parsed_body) == (status, b"".join(chunks))
    answer = relay.response()
    assert answer.status == status and answer.keep_alive is keep_alive and answer.prepared


@pytest.mark.parametrize(
    ("status", "method", "version", "size"),
    [
        (204, "POST", HttpVersion11, 0),
        (304, "POST", HttpVersion11, 0),
        (101, "POST", HttpVersion11, 0),
        (200, "HEAD", HttpVersion11, 10),
        (200, "POST", HttpVersion10, 10),
        (200, "POST", HttpVersion11, head.MAX_BODY + 1),
    ],
)
async def test_other_answers_are_left_to_aiohttp(status: int, method: str, version: Any, size: int) -> None:
    transport = MemoryTransport()
    request = request_on(transport, method, version=version)
    assert head.sent(request, status, [], b"x" * size) is None
    if size <= head.MAX_BODY:
        assert head.relay(request, status, []) is None
    assert not transport.data


async def test_a_relay_waits_while_the_client_is_behind_and_only_then() -> None:
    transport = MemoryTransport()
    request = request_on(transport)
    relay = head.relay(request, 200, [("Content-Type", "text/event-stream")])
    assert relay is not None
    request.request.protocol.pause_writing()  # the connection's buffer went over its high-water mark
    await asyncio.wait_for(relay.write(b"data: 1\n\n"), 1)  # the transport holds less than that: no wait
    transport.buffered = 70_000
    writing = asyncio.ensure_future(relay.write(b"data: 2\n\n"))
    await asyncio.sleep(0.01)
    assert not writing.done() and transport.data.endswith(b"data: 2\n\n\r\n")  # written, then waiting
    request.request.protocol.resume_writing()
    await asyncio.wait_for(writing, 1)


async def test_the_largest_plain_body_is_written_whole() -> None:
    transport = MemoryTransport()
    body = b"y" * head.MAX_BODY
    assert head.sent(request_on(transport), 200, [("Content-Type", "application/json")], body) is not None
    assert Parsed(bytes(transport.data)).answers[0][2] == body


@pytest.mark.parametrize("header", [("X-Evil", "a\r\nSet-Cookie: x=1"), ("X-Evil", "a\nb"), ("X\rY", "v")])
async def test_a_header_with_cr_or_lf_is_refused_as_aiohttp_refuses_it(header: tuple[str, str]) -> None:
    transport = MemoryTransport()
    with pytest.raises(ValueError):
        head.sent(request_on(transport), 200, [header], b"{}")
    assert not transport.data
    with pytest.raises(ValueError):
        await aiohttp_bytes(200, [header], b"{}", True)


async def test_a_closing_connection_raises_and_gets_nothing() -> None:
    transport = MemoryTransport(closing=True)
    request = request_on(transport)
    with pytest.raises(ConnectionResetError):
        head.sent(request, 200, [], b"{}")
    relay = head.relay(request, 200, [])
    assert relay is not None
    with pytest.raises(ConnectionResetError):
        await relay.write(b"data: 1\n\n")
    with pytest.raises(ConnectionResetError):
        await relay.write_eof()
    assert not transport.data


# ---------------------------------------------------------------- through a real router


@pytest.fixture
async def router(fake_engine: Any, start_router: Any) -> Any:
    return await start_router(await fake_engine("w"))


async def test_pipelined_requests_on_one_kept_connection_each_get_their_answer(router: Any) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
    try:
        writer.write(chat_request() * 3)  # three requests in one write
        parsed = await read_answers(reader, 3)
        writer.write(chat_request())  # the connection is still open
        parsed.answers += (await read_answers(reader, 1)).answers
    finally:
        writer.close()
    assert [status for status, _, _ in parsed.answers] == [200] * 4
    for _, headers, body in parsed.answers:
        names = [name.lower() for name, _ in headers]
        assert "connection" not in names and names.count("content-length") == 1
        assert orjson.loads(body)["choices"]
    assert len({dict(h)["x-request-id"] for _, h, _ in parsed.answers}) == 4


@pytest.mark.parametrize(("extra", "version"), [("Connection: close", "1.1"), ("", "1.0")])
async def test_a_client_that_closes_gets_its_answer_then_the_end_of_the_connection(
    router: Any, extra: str, version: str
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
    try:
        writer.write(chat_request(extra, version))
        data = await asyncio.wait_for(reader.read(), 10)  # read() returns at the router's close
    finally:
        writer.close()
    [(status, headers, body)] = Parsed(data).answers
    assert status == 200 and orjson.loads(body)["choices"]
    if version == "1.1":
        assert ("Connection", "close") in headers


async def test_streams_relayed_on_one_kept_connection_are_whole_and_chunked(router: Any) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
    try:
        writer.write(chat_request(body=STREAMED) + chat_request() + chat_request(body=STREAMED))
        parsed = await read_answers(reader, 3)
    finally:
        writer.close()
    assert [status for status, _, _ in parsed.answers] == [200] * 3
    for index in (0, 2):
        headers, body = dict(parsed.answers[index][1]), parsed.answers[index][2]
        assert headers["Transfer-Encoding"] == "chunked" and "Content-Length" not in headers
        assert headers["Content-Type"].startswith("text/event-stream")
        events = [line for line in body.split(b"\n\n") if line]
        assert events[-1] == b"data: [DONE]" and len(events) >= 3
        assert "".join(
            orjson.loads(e[6:])["choices"][0]["delta"].get("content") or "" for e in events[:-1]
        ), "the deltas carry the reply"
