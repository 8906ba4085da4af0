"""Fixtures for security tests: a router over real HTTP (``support.routers``), an engine that records (and
can echo) what it receives, a listener that must never be reached, and raw-socket helpers (``kit``: test
modules are imported with ``--import-mode=importlib`` and cannot import this file)."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import aiohttp
import orjson
import pytest
from aiohttp import web

from prefix_router.node.life.server import Running
from support.waiting import wait_until


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


class Kit:
    CHAT: ClassVar[dict[str, Any]] = {
        "model": "m",
        "messages": [{"role": "user", "content": "hello there " * 10}],
    }
    # a body that every generation endpoint accepts
    ANY: ClassVar[dict[str, Any]] = {**CHAT, "prompt": "hello there " * 10, "input": "hello"}

    @staticmethod
    async def post(
        url: str, body: Any = None, headers: dict[str, str] | None = None, path: str = "/v1/chat/completions"
    ) -> tuple[int, Any, bytes]:
        data = body if isinstance(body, bytes) else orjson.dumps(Kit.CHAT if body is None else body)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
            resp = await http.post(url + path, data=data, headers=headers)
            return resp.status, resp.headers, await resp.read()

    @staticmethod
    async def raw(port: int, data: bytes, timeout_s: float = 10.0, pause_s: float = 0.0) -> bytes:
        """Send raw bytes (in pieces ``pause_s`` apart when ``data`` is split with b"|PAUSE|") and read
        until the router closes the connection or ``timeout_s``; returns what came back (``<cut>`` when
        the router hung up on a request without a word)."""
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        received = bytearray()
        try:
            for i, piece in enumerate(data.split(b"|PAUSE|")):
                if i:
                    await asyncio.sleep(pause_s)
                writer.write(piece)
                await writer.drain()
            await asyncio.wait_for(_read_all(reader, received), timeout_s)
        except (ConnectionError, TimeoutError):
            pass
        finally:
            writer.close()
        return bytes(received) or b"<cut>"

    @staticmethod
    def status_of(response: bytes) -> int:
        """The status code of a raw HTTP response (0 if there is none)."""
        parts = response.split(b" ", 2)
        return int(parts[1]) if len(parts) > 1 and parts[0].startswith(b"HTTP/") and parts[1].isdigit() else 0

    wait_until = staticmethod(wait_until)

    @staticmethod
    async def refused_config(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
        """Run ``serve`` with a configuration it must refuse: (exit code, stderr)."""
        return await _refused_config(*args, env=env)

    @staticmethod
    def openai_error(raw: bytes) -> dict[str, Any]:
        body = orjson.loads(raw)
        assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
        error: dict[str, Any] = body["error"]
        return error


async def _read_all(reader: asyncio.StreamReader, into: bytearray) -> None:
    while chunk := await reader.read(65536):
        into += chunk


@pytest.fixture
def kit() -> type[Kit]:
    return Kit


async def _refused_config(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run ``serve`` with a configuration it must refuse: (exit code, stderr)."""
    argv = ["-m", "prefix_router.proxy", "serve", "--port", "0", *args]
    process = await asyncio.create_subprocess_exec(
        sys.executable, *argv, stderr=asyncio.subprocess.PIPE, env={**os.environ, **(env or {})}
    )
    try:
        _, err = await asyncio.wait_for(process.communicate(), 30)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    return int(process.returncode or 0), err.decode()
