"""The router's own connection handler (``proxy.run.lean``): it answers generation requests itself and hands
any other request, on the same connection, to aiohttp's, with nothing lost or reordered; idle connections
close after the keep-alive timeout, all of them at shutdown. (The whole suite runs on it: ``http_server``
is ``lean`` by default; the security and reliability tests hold its refusals, limits and disconnects.)"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from aiohttp import web

from prefix_router.node.control.http_errors import OpenAIServer
from prefix_router.node.life.server import Dispatch
from prefix_router.proxy.run import lean
from support.http1 import CHAT, chat_request, read_answers
from support.routers import RouterHandle
from support.waiting import wait_until


def lean_of(router: RouterHandle) -> lean.LeanServer:
    server = router.running.runner.server
    assert isinstance(server, OpenAIServer) and isinstance(server.lean, lean.LeanServer)
    return server.lean


def dispatched(router: RouterHandle) -> int:
    """How many requests aiohttp's side resolved by route (``Dispatch`` learns on the first)."""
    server = router.running.runner.server
    assert server is not None and isinstance(server.request_handler, Dispatch)
    return len(server.request_handler)


def request(method: str, path: str, body: bytes = b"", extra: str = "") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: router", "Content-Type: application/json"]
    lines += [f"Content-Length: {len(body)}"] if body or method == "POST" else []
    return ("\r\n".join([*lines, *([extra] if extra else [])]) + "\r\n\r\n").encode() + body


@pytest.fixture
async def router(fake_engine: Any, start_router: Any) -> RouterHandle:
    handle: RouterHandle = await start_router(await fake_engine("w", reply="fine"))
    return handle


async def test_generation_requests_are_answered_by_the_lean_handler(router: RouterHandle) -> None:
    async with router.openai() as client:
        answer = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        pieces = [chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices]
        completion = await client.completions.create(model="m", prompt="hello")
    assert answer.choices[0].message.content == "fine" and "".join(pieces) == "fine"
    assert completion.choices[0].text
    assert dispatched(router) == 0  # none went through aiohttp's connection handler
    assert lean_of(router).connections  # the client's kept-alive connection is still the lean one's


async def test_other_requests_on_a_lean_connection_are_handed_to_aiohttp_in_order(
    router: RouterHandle,
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
    try:
        writer.write(chat_request())  # lean
        first = await read_answers(reader, 1)
        assert lean_of(router).connections
        writer.write(request("GET", "/v1/models") + chat_request() + request("GET", "/health"))
        rest = await read_answers(reader, 3)  # aiohttp's from the GET on: the same connection
    finally:
        writer.close()
    answers = first.answers + rest.answers
    assert [status for status, _, _ in answers] == [200] * 4
    assert orjson.loads(answers[0][2])["choices"] and orjson.loads(answers[2][2])["choices"]
    assert orjson.loads(answers[1][2])["object"] == "list" and orjson.loads(answers[3][2]) == {"status": "ok"}
    assert not lean_of(router).connections  # handed over
    assert dispatched(router) >= 1


async def test_a_body_that_arrives_late_is_served_by_aiohttp_whole(
    fake_engine: Any, start_router: Any
) -> None:
    router = await start_router(await fake_engine("w", reply="fine"), settings={"timeouts.client_body_s": 2})
    raw = chat_request()
    reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
    try:
        writer.write(raw[: len(raw) - 5])
        await asyncio.sleep(lean_of(router).incomplete_s)  # not whole in time: handed over with what came
        await wait_until(lambda: not lean_of(router).connections)  # handed over
        writer.write(raw[len(raw) - 5 :])
        [(status, _, body)] = (await read_answers(reader, 1)).answers
    finally:
        writer.close()
    assert status == 200 and orjson.loads(body)["choices"][0]["message"]["content"] == "fine"


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (request("POST", "/v1/chat/completions", CHAT, "Expect: 100-continue"), "expect"),
        (request("POST", "/v1/chat/completions", CHAT, "Content-Encoding: identity"), "content-encoding"),
        (request("POST", "/v1/chat/completions", CHAT, "X-Note: caf\u00e9"), "a non-ASCII header value"),
        (request("POST", "/v1/chat/completions", CHAT).replace(b"HTTP/1.1", b"HTTP/1.0"), "HTTP/1.0"),
    ],
)
async def test_requests_it_does_not_serve_get_aiohttps_answer(
    router: RouterHandle, raw: bytes, why: str
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
    data = b""
    try:
        writer.write(raw)
        while b'"fine"' not in data:
            more = await asyncio.wait_for(reader.read(65536), 10)
            assert more, f"{why}: closed without an answer"
            data += more
    finally:
        writer.close()
    assert data.split(b" ", 2)[1] in (b"100", b"200"), why
    assert b" 200 OK\r\n" in data, why
    assert not lean_of(router).connections, why  # handed over


async def test_an_error_answer_is_aiohttps_and_keeps_the_connection(router: RouterHandle) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
    try:
        writer.write(request("POST", "/v1/chat/completions", b'{"model": "m", "messages": 3}'))
        [(status, headers, body)] = (await read_answers(reader, 1)).answers
        writer.write(chat_request())  # one at a time: both the lean handler's
        [(second, _, _)] = (await read_answers(reader, 1)).answers
        assert lean_of(router).connections and dispatched(router) == 0
    finally:
        writer.close()
    assert status == 400 and orjson.loads(body)["error"]["type"] == "invalid_request_error"
    assert {name.lower(): value for name, value in headers}["x-request-id"] and second == 200


async def test_idle_connections_close_after_the_keepalive_timeout(
    fake_engine: Any, start_router: Any
) -> None:
    router = await start_router(await fake_engine("w"), settings={"timeouts.client_header_s": 0.3})
    reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
    try:
        writer.write(chat_request())
        await read_answers(reader, 1)
        assert await asyncio.wait_for(reader.read(), 2) == b""  # closed by the router
    finally:
        writer.close()


async def test_shutdown_closes_idle_connections_and_lets_answers_finish(
    fake_engine: Any, start_router: Any
) -> None:
    engine = await fake_engine("w", delay_s=0.1)
    router = await start_router(engine)
    idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", router.port)
    busy_reader, busy_writer = await asyncio.open_connection("127.0.0.1", router.port)
    try:
        idle_writer.write(chat_request())
        await read_answers(idle_reader, 1)
        busy_writer.write(chat_request())
        await wait_until(lambda: engine.in_flight == 1)  # being answered: within the shutdown timeout
        await router.running.stop()
        assert await asyncio.wait_for(idle_reader.read(), 2) == b""
        data = await asyncio.wait_for(busy_reader.read(), 5)
    finally:
        idle_writer.close()
        busy_writer.close()
    assert data.startswith(b"HTTP/1.1 200")


def test_only_the_routers_own_handlers_are_served() -> None:
    async def other(request: web.Request) -> web.Response:
        return web.Response()

    app = web.Application()
    app.router.add_post("/v1/chat/completions", other)
    assert lean.lean_routes(app) == {}


async def test_http_server_aiohttp_serves_every_request_with_aiohttp(
    fake_engine: Any, start_router: Any
) -> None:
    router = await start_router(await fake_engine("w"), settings={"http_server": "aiohttp"})
    server = router.running.runner.server
    assert isinstance(server, OpenAIServer) and server.lean is None
    async with router.openai() as client:
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert dispatched(router) == 1


async def test_bytes_sent_during_an_answer_are_held_within_a_bound(
    fake_engine: Any, start_router: Any
) -> None:
    engine = await fake_engine("w", reply="fine", delay_s=2.0)
    router = await start_router(engine)
    reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
    try:
        writer.write(chat_request())
        await wait_until(lambda: engine.in_flight == 1)  # being answered (states, not sleeps: under load)
        writer.write(b"x" * (8 * lean.HOLD_BYTES))  # far more than the bound, while the answer is made
        [connection] = lean_of(router).connections
        await wait_until(lambda: connection._holding)
        held = connection._held_bytes
        [(status, _, body)] = (await read_answers(reader, 1)).answers
    finally:
        writer.close()
    assert 0 < held <= lean.HOLD_BYTES + 2**18  # reading paused past the bound (a read is at most 256 KiB)
    assert status == 200 and b'"fine"' in body


class QuietTransport(asyncio.Transport):
    """A transport that takes every write and has no socket."""

    def __init__(self) -> None:
        super().__init__()
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


async def test_writing_waits_while_the_transport_is_full_and_not_past_the_connection(
    router: RouterHandle,
) -> None:
    """The connection's own flow control (what aiohttp's ``BaseProtocol`` gave it): ``drain`` returns at
    once until the transport pauses writing, then waits until it resumes, or until the connection ends."""
    server = lean_of(router)
    connection: Any = server()
    connection.connection_made(QuietTransport())
    assert connection in server.connections
    await asyncio.wait_for(connection.drain(), 1)
    connection.pause_writing()
    waiting = asyncio.ensure_future(connection.drain())
    await asyncio.sleep(0.05)
    assert not waiting.done()
    connection.resume_writing()
    await asyncio.wait_for(waiting, 1)
    connection.pause_writing()
    waiting = asyncio.ensure_future(connection.drain())
    await asyncio.sleep(0.05)
    connection.connection_lost(ConnectionResetError("reset by peer"))
    with pytest.raises(ConnectionError):
        await asyncio.wait_for(waiting, 1)
    with pytest.raises(ConnectionError):  # nothing more is written on it
        await connection.drain()
    assert connection not in server.connections
