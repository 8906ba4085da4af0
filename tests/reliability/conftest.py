"""Fixtures for fault tests: routers (``support.routers``), scriptable
misbehaving engines on raw sockets, an engine that records when each request is cancelled, and the ``kit``
of helpers (``support.kits.ReliabilityKit``)."""

from __future__ import annotations

import asyncio
import signal
import socket
import struct
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from aiohttp import web

from prefix_router.lab.sim.server import READY_PREFIX
from prefix_router.node.life.server import Running
from support.kits import ReliabilityKit
from support.routers import RouterFactory, RouterHandle, Routers

# ------------------------------------------------------------------------------------------ routers


@pytest.fixture
async def start_router() -> AsyncIterator[RouterFactory]:
    """``await start_router(engine_a, engine_b, settings={...})``; stopped afterwards."""
    routers = Routers(shutdown_timeout_s=0.5, models=["m"])

    async def make(*workers: Any, settings: dict[str, Any] | None = None) -> RouterHandle:
        return await routers.start(*workers, settings=settings)

    try:
        yield make
    finally:
        await routers.close()


# ------------------------------------------------------------------------------------------ raw engines

OK_MODELS = orjson.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]})


def http_response(status: int, body: bytes, content_type: str = "application/json") -> bytes:
    head = f"HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def sse_event(text: str) -> bytes:
    event = {
        "id": "r",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": text}}],
    }
    return chunk(b"data: " + orjson.dumps(event) + b"\n\n")


# What a raw engine answers to a generation request (POST): parts written 0.1 s apart, then the connection
# is closed; ``None`` means: say nothing, keep the socket open until the client gives up.
MODES: dict[str, bytes | tuple[bytes, ...] | None] = {
    "hang": None,
    "garbage": b"this is not HTTP at all\r\n\r\n",
    "close": b"",
    "bad_status": b"HTTP/1.1 2x0 OK\r\nContent-Length: 0\r\n\r\n",
    "bad_chunked": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"zz\r\nnot a chunk\r\n",
    "truncated": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    b'{"partial',
    "http_500": http_response(500, b'{"error": {"message": "engine exploded"}}'),
    "sse_then_close": (SSE_HEAD + sse_event("one "), sse_event("two ")),
    "sse_then_reset": (SSE_HEAD + sse_event("one "), b"RESET"),
    "sse_then_garbage": (SSE_HEAD + sse_event("one "), b"zz\r\nnot a chunk\r\n"),
    # a stream cut in the middle of an event: its first half relayed, then a reset
    "sse_cut_mid_event": (SSE_HEAD + sse_event("one ") + chunk(b'data: {"id": "r", "choi'), b"RESET"),
    "not_json_200": http_response(200, b"<html>definitely not json</html>", "text/html"),
}


class RawEngine:
    """An engine on raw sockets: answers GETs (health, models) properly and generation requests per
    ``mode`` (see ``MODES``); ``mode="hang_all"`` also hangs GETs. ``hanging``: connections it is
    holding open without an answer (the client must hang up on them)."""

    def __init__(self, name: str, mode: str) -> None:
        self.name = name
        self.mode = mode
        self.open = 0
        self.hanging = 0
        self.generations = 0
        self.server: asyncio.Server | None = None
        self.port = 0
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = int(self.server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open += 1
        self._writers.add(writer)
        try:
            while await self._one(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.open -= 1
            self._writers.discard(writer)
            writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Serve one request; False when the connection is to be closed."""
        head = await reader.readuntil(b"\r\n\r\n")
        method = head.split(b" ", 1)[0]
        length = next(
            (int(line[15:]) for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:")), 0
        )
        await reader.readexactly(length)
        if self.mode == "hang_all" or (method == b"POST" and MODES[self.mode] is None):
            await self._hang(reader)
            return False
        if method != b"POST":
            writer.write(http_response(200, OK_MODELS))
            return True
        self.generations += 1
        answer = MODES[self.mode] or b""
        for i, part in enumerate(answer if isinstance(answer, tuple) else (answer,)):
            await asyncio.sleep(0.1 if i else 0)
            if part == b"RESET":  # a TCP reset, as the kernel sends for a crashed process's sockets
                linger = struct.pack("ii", 1, 0)
                writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
                writer.transport.abort()
                return False
            writer.write(part)
            await writer.drain()
        return False

    async def _hang(self, reader: asyncio.StreamReader) -> None:
        self.hanging += 1
        try:
            await reader.read()  # until the client hangs up
        finally:
            self.hanging -= 1


RawFactory = Callable[..., Awaitable[RawEngine]]


@pytest.fixture
async def raw_engine() -> AsyncIterator[RawFactory]:
    engines: list[RawEngine] = []

    async def make(name: str, mode: str) -> RawEngine:
        engine = RawEngine(name, mode)
        await engine.start()
        engines.append(engine)
        return engine

    try:
        yield make
    finally:
        for engine in engines:
            await engine.stop()


# ---------------------------------------------------------------------------------------- a recording engine


@dataclass
class Recording:
    """A streaming engine that records, per request, when it started and when it was cancelled.
    ``/v1/embeddings`` (a pass-through path for the router) is answered after ``delay_s`` and counted in
    ``active`` too; ``/health`` answers ``health_status``."""

    name: str
    chunk_delay_s: float = 0.01
    chunks: int = 1000
    delay_s: float = 0.0  # before the response head
    health_status: int = 200
    active: int = 0
    max_active: int = 0
    served: int = 0
    started: list[float] = field(default_factory=list)
    cancelled: list[float] = field(default_factory=list)
    running: Running | None = None

    @property
    def url(self) -> str:
        assert self.running is not None
        return self.running.url

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._generate)
        app.router.add_post("/v1/embeddings", self._embed)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        return app

    async def _models(self, request: web.Request) -> web.StreamResponse:
        return web.Response(body=OK_MODELS, content_type="application/json")

    async def _health(self, request: web.Request) -> web.StreamResponse:
        return web.Response(text="ok", status=self.health_status)

    async def _embed(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            await asyncio.sleep(self.delay_s)
            data = [{"object": "embedding", "index": 0, "embedding": [0.0, 1.0]}]
            return web.json_response({"object": "list", "data": data, "model": "m"})
        finally:
            self.active -= 1
            self.served += 1

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        self.started.append(time.monotonic())
        try:
            await asyncio.sleep(self.delay_s)
            if body.get("stream"):
                return await self._stream(request)
            return web.json_response(
                {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]}
            )
        except (asyncio.CancelledError, ConnectionResetError):
            self.cancelled.append(time.monotonic())
            raise
        finally:
            self.active -= 1
            self.served += 1

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(self.chunks):
            event = {"choices": [{"index": 0, "delta": {"content": f"t{i} "}}]}
            await resp.write(b"data: " + orjson.dumps(event) + b"\n\n")
            await asyncio.sleep(self.chunk_delay_s)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


RecordingFactory = Callable[..., Awaitable[Recording]]


@pytest.fixture
def recording_engine(serve_app: Callable[[web.Application], Awaitable[Running]]) -> RecordingFactory:
    async def make(name: str = "rec", **options: Any) -> Recording:
        engine = Recording(name, **options)
        engine.running = await serve_app(engine.app())
        return engine

    return make


# ------------------------------------------------------------------------------------------ engine processes


@dataclass
class SimProcess:
    """A simulated engine in its own process (``python -m prefix_router.lab.sim``)."""

    process: asyncio.subprocess.Process
    url: str

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    async def kill(self) -> None:
        """SIGKILL: no goodbye to anyone, like a crashed engine or a lost node."""
        if self.process.returncode is None:
            self.process.kill()
        await self.process.wait()

    def freeze(self) -> None:
        """SIGSTOP: the process keeps its sockets open and answers nothing (a hung engine)."""
        self.process.send_signal(signal.SIGSTOP)


SimFactory = Callable[..., Awaitable[SimProcess]]


@pytest.fixture
async def sim_process() -> AsyncIterator[SimFactory]:
    """``await sim_process(port=0, time_scale=1.0, model="m")``: an engine-sim process serving ``model``."""
    procs: list[SimProcess] = []

    async def spawn(port: int = 0, time_scale: float = 1.0, model: str = "m") -> SimProcess:
        argv = ["-m", "prefix_router.lab.sim", "--port", str(port), "--model", model]
        process = await asyncio.create_subprocess_exec(
            sys.executable, *argv, "--time-scale", str(time_scale), stdout=asyncio.subprocess.PIPE
        )
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
        ready = line.startswith(READY_PREFIX)
        procs.append(SimProcess(process, line.removeprefix(READY_PREFIX).split()[0] if ready else ""))
        assert ready, f"engine-sim did not start: {line!r}"
        return procs[-1]

    try:
        yield spawn
    finally:
        for proc in procs:
            await proc.kill()


@pytest.fixture
def kit() -> type[ReliabilityKit]:
    return ReliabilityKit
