"""A scriptable fake OpenAI-compatible engine (chat and completions, streamed or not, models, health,
metrics), served over real HTTP by the ``fake_engine`` fixture."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from prefix_router.proxy.run.server import Running


@dataclass
class Behaviour:
    """What the fake engine does; tests change it while it runs."""

    models: list[str] = field(default_factory=lambda: ["m"])
    reply: str = "hello from the fake engine"
    cached_tokens: int | None = None
    # usage.prompt_tokens; None: a quarter of the request body's bytes, never below cached_tokens
    prompt_tokens: int | None = None
    # set: usage.prompt_tokens counts the prompt as rendered by a ChatML-like template (``rendered_tokens``)
    chars_per_token: float | None = None
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

    def rendered_tokens(self, body: dict[str, Any]) -> int:
        """The prompt's tokens as an engine with a ChatML-like template counts them: the text at
        ``chars_per_token`` characters per token, plus 4 tokens per message (its markers and role) and 3
        for the generation prompt; a completions prompt is its text (and a BOS token)."""
        cpt = self.b.chars_per_token or 4.0
        if "messages" not in body:
            return math.ceil(len(str(body.get("prompt", ""))) / cpt) + 1
        return sum(math.ceil(len(str(m.get("content") or "")) / cpt) + 4 for m in body["messages"]) + 3

    def _usage(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt = self.b.prompt_tokens
        if prompt is None and self.b.chars_per_token is not None:
            prompt = self.rendered_tokens(body)
        if prompt is None:
            prompt = max(len(orjson.dumps(body)) // 4, self.b.cached_tokens or 0)
        usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": 5, "total_tokens": prompt + 5}
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
            "usage": self._usage(body),
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
            event["usage"] = self._usage(body)
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
