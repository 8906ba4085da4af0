"""A relayed stream whose body ends cleanly inside an event (the engine's last chunk cut short, or a
close-delimited body ended by an engine that died): the client gets every whole event, never the partial
one, then the router's OpenAI-format error event, under both connection handlers (``http_server``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from aiohttp import web

from support.kits import SecurityKit

EVENT = (
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
)
PARTIAL = b'data: {"id":"c2","object":"chat.comp'


def engine_app() -> web.Application:
    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(EVENT)
        await response.write(PARTIAL)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/health", models)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    return app


MODELS = orjson.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]})


async def close_delimited(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """An engine whose stream has no framing (no length, not chunked): it ends when the engine closes
    the connection, here half way through an event, as an engine killed mid-stream would."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            (
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ),
            0,
        )
        await reader.readexactly(length)
        if head.startswith(b"POST"):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
            writer.write(EVENT + PARTIAL)
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n")
            writer.write(b"Content-Length: %d\r\n\r\n%b" % (len(MODELS), MODELS))
        await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


@pytest.fixture
async def raw_engine() -> AsyncIterator[str]:
    server = await asyncio.start_server(close_delimited, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("server", ["lean", "aiohttp"])
@pytest.mark.parametrize("framing", ["chunked", "close-delimited"])
async def test_a_stream_ending_inside_an_event_ends_with_an_error_event(
    serve_app: Any, raw_engine: str, start_router: Any, server: str, framing: str
) -> None:
    url = (await serve_app(engine_app())).url if framing == "chunked" else raw_engine
    engine = SimpleNamespace(name="w", url=url)
    router = await start_router(engine, settings={"http_server": server})
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    status, _, raw = await SecurityKit.post(router.url, body)
    assert status == 200
    events = SecurityKit.events(raw)
    assert PARTIAL not in raw and raw.startswith(EVENT)
    error = orjson.loads(events[-1])["error"]
    assert error["type"] == "upstream_error" and error["code"] == "upstream_truncated"
