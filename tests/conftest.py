"""Shared fixtures: a scriptable fake OpenAI-compatible engine served over real HTTP on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from prefix_router.proxy.server import Running, start


@dataclass
class Behaviour:
    """What the fake engine does; tests change it while it runs."""

    models: list[str] = field(default_factory=lambda: ["m"])
    reply: str = "hello from the fake engine"
    cached_tokens: int | None = None
    fail_next: int = 0  # the next N generation requests answer 500
    status: int = 200  # status of generation requests (when not failing)
    hang: bool = False  # accept generation requests and never answer
    delay_s: float = 0.0  # before answering generation requests
    chunks: int = 3  # stream pieces of the reply
    chunk_delay_s: float = 0.0
    die_after_chunks: int | None = None  # streams: drop the connection after this many chunks
    health_status: int = 200  # 404: no /health, so probes fall back to /v1/models
    models_status: int = 200
    metrics_text: str | None = None  # None: no /metrics (404)


@dataclass
class Seen:
    path: str
    method: str
    headers: dict[str, str]
    body: bytes


class FakeEngine:
    """An OpenAI-compatible engine double: chat and completions (streamed or not), models, health."""

    def __init__(self, name: str, behaviour: Behaviour) -> None:
        self.name = name
        self.b = behaviour
        self.seen: list[Seen] = []
        self.cancelled = asyncio.Event()
        self.streams_started = 0
        self.streams_finished = 0
        self.health_checks = 0
        self.running: Running | None = None

    @property
    def url(self) -> str:
        assert self.running is not None
        return self.running.url

    @property
    def generations(self) -> list[Seen]:
        return [s for s in self.seen if s.path.endswith("completions")]

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._generate)
        app.router.add_post("/v1/completions", self._generate)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_route("*", "/v1/{tail:.+}", self._echo)
        return app

    async def _remember(self, request: web.Request) -> Seen:
        seen = Seen(request.path_qs, request.method, dict(request.headers), await request.read())
        self.seen.append(seen)
        return seen

    async def _health(self, request: web.Request) -> web.StreamResponse:
        self.health_checks += 1
        return web.json_response({"ok": True}, status=self.b.health_status)

    async def _models(self, request: web.Request) -> web.StreamResponse:
        data = [{"id": m, "object": "model", "created": 1, "owned_by": self.name} for m in self.b.models]
        return web.json_response({"object": "list", "data": data}, status=self.b.models_status)

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        if self.b.metrics_text is None:
            raise web.HTTPNotFound()
        return web.Response(text=self.b.metrics_text, content_type="text/plain")

    async def _echo(self, request: web.Request) -> web.StreamResponse:
        seen = await self._remember(request)
        body = {"engine": self.name, "path": seen.path, "method": seen.method, "body": seen.body.decode()}
        return web.json_response(body, headers={"x-engine": self.name})

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        seen = await self._remember(request)
        body = orjson.loads(seen.body)
        if self.b.hang:
            await asyncio.Event().wait()
        if self.b.delay_s:
            await asyncio.sleep(self.b.delay_s)
        if self.b.fail_next > 0:
            self.b.fail_next -= 1
            return web.json_response({"error": {"message": f"{self.name} failed"}}, status=500)
        chat = request.path.endswith("chat/completions")
        if body.get("stream"):
            return await self._stream(request, body, chat)
        return web.Response(
            body=orjson.dumps(self._whole(body, chat)),
            status=self.b.status,
            content_type="application/json",
            headers={"x-engine": self.name},
        )

    def _usage(self) -> dict[str, Any]:
        usage: dict[str, Any] = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        if self.b.cached_tokens is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": self.b.cached_tokens}
        return usage

    def _whole(self, body: dict[str, Any], chat: bool) -> dict[str, Any]:
        if chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": self.b.reply},
                "finish_reason": "stop",
            }
        else:
            choice = {"index": 0, "text": self.b.reply, "finish_reason": "stop", "logprobs": None}
        return {
            "id": "fake-1",
            "object": "chat.completion" if chat else "text_completion",
            "created": 1,
            "model": body.get("model", "m"),
            "choices": [choice],
            "usage": self._usage(),
        }

    def _pieces(self) -> list[str]:
        n = max(1, self.b.chunks)
        size = max(1, -(-len(self.b.reply) // n))
        return [self.b.reply[i : i + size] for i in range(0, len(self.b.reply), size)]

    def _chunk(self, body: dict[str, Any], chat: bool, piece: str | None, usage: bool = False) -> bytes:
        choices: list[dict[str, Any]] = []
        if piece is not None and chat:
            choices = [{"index": 0, "delta": {"role": "assistant", "content": piece}, "finish_reason": None}]
        elif piece is not None:
            choices = [{"index": 0, "text": piece, "finish_reason": None, "logprobs": None}]
        event: dict[str, Any] = {
            "id": "fake-1",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": 1,
            "model": body.get("model", "m"),
            "choices": choices,
        }
        if usage:
            event["usage"] = self._usage()
        return b"data: " + orjson.dumps(event) + b"\n\n"

    async def _stream(self, request: web.Request, body: dict[str, Any], chat: bool) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "x-engine": self.name})
        await resp.prepare(request)
        self.streams_started += 1
        try:
            for i, piece in enumerate(self._pieces()):
                if self.b.die_after_chunks is not None and i >= self.b.die_after_chunks:
                    assert request.transport is not None
                    request.transport.abort()
                    return resp
                if i and self.b.chunk_delay_s:
                    await asyncio.sleep(self.b.chunk_delay_s)
                await resp.write(self._chunk(body, chat, piece))
            if (body.get("stream_options") or {}).get("include_usage"):
                await resp.write(self._chunk(body, chat, None, usage=True))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (asyncio.CancelledError, ConnectionResetError):
            self.cancelled.set()
            raise
        self.streams_finished += 1
        return resp


EngineFactory = Callable[..., Awaitable[FakeEngine]]


ServeApp = Callable[[web.Application], Awaitable[Running]]


@pytest.fixture
async def serve_app() -> AsyncIterator[ServeApp]:
    """``await serve_app(app)`` serves an aiohttp app on a free loopback port; all are stopped afterwards."""
    runnings: list[Running] = []

    async def serve(app: web.Application) -> Running:
        runnings.append(await start(app, shutdown_timeout=0.2))
        return runnings[-1]

    try:
        yield serve
    finally:
        for running in reversed(runnings):
            await running.stop()


@pytest.fixture
def fake_engine(serve_app: ServeApp) -> EngineFactory:
    """``await fake_engine(name="a", **behaviour)`` starts a fake engine; all are stopped afterwards."""

    async def make(name: str = "engine", **behaviour: Any) -> FakeEngine:
        engine = FakeEngine(name, Behaviour(**behaviour))
        engine.running = await serve_app(engine.app())
        return engine

    return make


@pytest.fixture
def free_port() -> Callable[[], int]:
    """A port nobody listens on (bound then released), for connect-failure tests."""
    import socket

    def get() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    return get


# ---------------------------------------------------------------- recorded engine fixtures

ENGINE_FIXTURES = Path(__file__).parent / "pool" / "engines" / "fixtures"  # see its README


def read_fixture(name: str) -> str:
    return (ENGINE_FIXTURES / name).read_text()


def json_fixture(name: str) -> dict[str, Any]:
    body = json.loads(read_fixture(name))
    assert isinstance(body, dict)
    return body


@pytest.fixture
def fixture_text() -> Any:
    return read_fixture


@pytest.fixture
def fixture_json() -> Any:
    return json_fixture


# ---------------------------------------------------------------- model directories from the SmolLM2 GGUF


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``name -> ModelDir``: SmolLM2's own chat template and the bundled layouts, derived once per session
    from the GGUF that ``make llama`` installs (missing: a failure in CI, a skip elsewhere)."""
    import os

    from prefix_router.bench.fidelity.models import all_model_dirs, smollm2_gguf

    gguf = smollm2_gguf()
    if gguf is None:
        reason = "the SmolLM2 GGUF is not installed (scripts/install-llama-cpp.sh)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return {m.name: m for m in all_model_dirs(gguf, tmp_path_factory.mktemp("models"))}
