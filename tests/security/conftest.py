"""Fixtures for security tests: a router over real HTTP (``support.routers``), an engine that records (and
can echo) what it receives, a listener that must never be reached, and raw-socket helpers (``kit``:
``support.kits.SecurityKit``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from aiohttp import web

from prefix_router.node.life.server import Running
from support.kits import SecurityKit


@dataclass
class Echo:
    """An engine that records every request and can echo its ``Authorization`` header back (in a header
    and in the body), as a careless or compromised engine might."""

    name: str
    echo_auth: bool = False
    status: int = 200
    seen: list[tuple[str, str, dict[str, str], bytes]] = field(default_factory=list)
    running: Running | None = None

    @property
    def url(self) -> str:
        assert self.running is not None
        return self.running.url

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._no_metrics)
        app.router.add_route("*", "/{tail:.*}", self._any)
        return app

    async def _health(self, request: web.Request) -> web.StreamResponse:
        return web.Response(text="ok")

    async def _no_metrics(self, request: web.Request) -> web.StreamResponse:
        raise web.HTTPNotFound()

    async def _models(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def _any(self, request: web.Request) -> web.StreamResponse:
        self.seen.append((request.method, request.raw_path, dict(request.headers), await request.read()))
        auth = request.headers.get("Authorization", "")
        body: dict[str, Any] = {
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": f"echo {auth}" if self.echo_auth else "hi"},
                }
            ]
        }
        headers = (
            {"X-Echo-Auth": auth, "WWW-Authenticate": f'Bearer realm="{auth}"'} if self.echo_auth else {}
        )
        return web.Response(
            body=orjson.dumps(body), status=self.status, headers=headers, content_type="application/json"
        )


@pytest.fixture
def echo_engine(serve_app: Callable[[web.Application], Awaitable[Running]]) -> Callable[..., Awaitable[Echo]]:
    async def make(name: str = "echo", **options: Any) -> Echo:
        engine = Echo(name, **options)
        engine.running = await serve_app(engine.app())
        return engine

    return make


class Tripwire:
    """A listener that must never be contacted: counts every connection it accepts."""

    def __init__(self) -> None:
        self.connections = 0
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(self.server.sockets[0].getsockname()[1])

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\nConnection: close\r\n\r\nTRIPPED")
        await writer.drain()
        writer.close()


@pytest.fixture
async def tripwire() -> AsyncIterator[Tripwire]:
    wire = Tripwire()
    await wire.start()
    try:
        yield wire
    finally:
        assert wire.server is not None
        wire.server.close()
        await wire.server.wait_closed()


@pytest.fixture
def kit() -> type[SecurityKit]:
    return SecurityKit
